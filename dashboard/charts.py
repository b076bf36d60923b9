"""Charts for the dashboard: budget gauges (matplotlib), cumulative epsilon over time (altair),
and image grids (numpy -> one PNG-able uint8 array)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Wedge

# One palette for the whole app.
GREEN, AMBER, RED, GREY, BLUE, INK = (
    "#2e9d5b",
    "#e0a100",
    "#d64545",
    "#e6e8eb",
    "#3566c2",
    "#1f2933",
)


def gauge_colour(fraction: float) -> str:
    return GREEN if fraction < 0.6 else (AMBER if fraction < 0.9 else RED)


def budget_gauge(
    cap: float,
    spent_rdp: float,
    spent_pld: float,
    *,
    title: str = "",
    planned_rdp: float | None = None,
) -> Figure:
    """A half-circle gauge: filled arc = epsilon spent by RDP (the reference, checked against the
    cap), black tick = PLD (tighter), dashed tick = after a planned run. An infinite spend (a non-DP
    release was made) fills the gauge in red and says so."""
    fig = Figure(figsize=(3.4, 2.15), dpi=110)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-1.25, 1.25)
    ax.set_ylim(-0.5, 1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.add_patch(Wedge((0, 0), 1.0, 0, 180, width=0.28, facecolor=GREY, edgecolor="none"))
    void = not math.isfinite(spent_rdp)
    frac = 1.0 if void else min(max(spent_rdp / cap, 0.0), 1.0) if cap > 0 else 1.0
    colour = RED if void else gauge_colour(frac)
    if frac > 0:
        ax.add_patch(
            Wedge(
                (0, 0), 1.0, 180 - 180 * frac, 180, width=0.28, facecolor=colour, edgecolor="none"
            )
        )

    def tick(value: float, style: str, colour: str = INK) -> None:
        f = min(max(value / cap, 0.0), 1.0)
        a = math.pi * (1 - f)
        ax.plot(
            [0.66 * math.cos(a), 1.06 * math.cos(a)],
            [0.66 * math.sin(a), 1.06 * math.sin(a)],
            linestyle=style,
            color=colour,
            linewidth=2,
        )

    if not void and math.isfinite(spent_pld):
        tick(spent_pld, "-")
    if planned_rdp is not None and math.isfinite(planned_rdp) and not void:
        tick(planned_rdp, "--", BLUE)
    big = "∞" if void else f"{spent_rdp:.2f}"
    ax.text(0, 0.18, big, ha="center", va="center", fontsize=20, fontweight="bold", color=colour)
    ax.text(0, -0.08, f"of ε cap {cap:g}", ha="center", va="center", fontsize=9, color="#52606d")
    ax.text(-1.0, -0.2, "0", ha="center", fontsize=8, color="#52606d")
    ax.text(1.0, -0.2, f"{cap:g}", ha="center", fontsize=8, color="#52606d")
    sub = (
        "no DP guarantee (a k-anonymous or de-identified release)"
        if void
        else f"RDP {spent_rdp:.3f} · PLD {spent_pld:.3f} · left {max(cap - spent_rdp, 0):.3f}"
    )
    ax.text(0, -0.4, sub, ha="center", va="center", fontsize=7.5, color=RED if void else "#52606d")
    if title:
        ax.text(0, 1.12, title, ha="center", va="center", fontsize=10, fontweight="bold", color=INK)
    return fig


def _epsilon_steps(df: pd.DataFrame, caps: dict[str, float]) -> tuple[pd.DataFrame, float]:
    """The charges in long form (one row per accountant) with the values drawn, and the axis top;
    an infinite epsilon is drawn at the top edge."""
    long = df.melt(
        id_vars=["dataset", "time", "run_id"],
        value_vars=["cumulative_epsilon_rdp", "cumulative_epsilon_pld"],
        var_name="accountant",
        value_name="epsilon",
    )
    long["accountant"] = long["accountant"].map(
        {"cumulative_epsilon_rdp": "RDP (reference)", "cumulative_epsilon_pld": "PLD (tighter)"}
    )
    long["time"] = pd.to_datetime(long["time"], utc=True)
    finite = long["epsilon"].replace([np.inf, -np.inf], np.nan)
    top = (
        max([v for v in caps.values()] + [float(finite.max()) if finite.notna().any() else 0.0])
        * 1.1
        or 1.0
    )
    long["no_dp"] = ~np.isfinite(long["epsilon"].astype(float))
    long["epsilon_shown"] = np.where(long["no_dp"], top, long["epsilon"].astype(float))
    long["epsilon_label"] = [
        ("∞ (no DP guarantee)" if nd else f"{e:.4f}")
        for nd, e in zip(long["no_dp"], long["epsilon"], strict=True)
    ]
    return long, top


def cumulative_epsilon_chart(rows: Sequence[dict], caps: dict[str, float]) -> alt.Chart:
    """Step lines of cumulative epsilon (RDP solid, PLD dashed) per dataset over time, with each
    dataset's cap as a rule. `rows` carry dataset, time, cumulative_epsilon_rdp/pld
    (charge_breakdown). Infinite values (after a non-DP release) are drawn at the top edge and
    flagged in the tooltip."""
    df = pd.DataFrame(rows)
    if df.empty:
        return alt.Chart(pd.DataFrame({"x": []})).mark_point()
    long, top = _epsilon_steps(df, caps)
    base = alt.Chart(long).encode(
        x=alt.X("time:T", title="time (UTC)"),
        y=alt.Y("epsilon_shown:Q", title="cumulative ε", scale=alt.Scale(domain=[0, top])),
        color=alt.Color("dataset:N", title="dataset", scale=alt.Scale(scheme="tableau10")),
        strokeDash=alt.StrokeDash(
            "accountant:N",
            title="accountant",
            scale=alt.Scale(domain=["RDP (reference)", "PLD (tighter)"], range=[[1, 0], [6, 4]]),
        ),
        tooltip=[
            alt.Tooltip("dataset:N"),
            alt.Tooltip("run_id:N", title="run"),
            alt.Tooltip("accountant:N"),
            alt.Tooltip("epsilon_label:N", title="cumulative ε"),
            alt.Tooltip("time:T", format="%Y-%m-%d %H:%M:%S"),
        ],
    )
    lines = base.mark_line(interpolate="step-after", strokeWidth=2.2) + base.mark_point(
        filled=True, size=45
    )
    cap_df = pd.DataFrame({"dataset": list(caps), "cap": list(caps.values())})
    rules = (
        alt.Chart(cap_df)
        .mark_rule(strokeDash=[2, 2], opacity=0.6)
        .encode(
            y="cap:Q",
            color=alt.Color("dataset:N"),
            tooltip=[alt.Tooltip("dataset:N"), alt.Tooltip("cap:Q", title="ε cap")],
        )
    )
    return (lines + rules).properties(height=320)


def to_display(images: np.ndarray) -> np.ndarray:
    """uint8 (N,H,W) or (N,H,W,C) -> uint8 (N,H,W,3) for display."""
    x = np.asarray(images)
    if x.dtype != np.uint8:
        x = np.clip(x, 0, 255).astype(np.uint8)
    if x.ndim == 3:
        x = np.repeat(x[..., None], 3, axis=-1)
    elif x.ndim == 4 and x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return x


def display_scale(h: int, w: int, scale: int) -> int:
    """`scale` for small images (28 px digits), none for large ones (photographs): at most 128 px
    a tile when upscaled."""
    return max(1, min(scale, 128 // max(h, w, 1)))


def image_grid(images: np.ndarray, columns: int = 10, pad: int = 2, scale: int = 2) -> np.ndarray:
    """Tile images (uint8, grey or RGB) into one RGB array with a light border, upscaled by
    `scale`."""
    x = to_display(images)
    if len(x) == 0:
        return np.full((8, 8, 3), 255, np.uint8)
    n, h, w, _ = x.shape
    scale = display_scale(h, w, scale)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 235, np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        grid[
            pad + r * (h + pad) : pad + r * (h + pad) + h,
            pad + c * (w + pad) : pad + c * (w + pad) + w,
        ] = x[i]
    return np.kron(grid, np.ones((scale, scale, 1), np.uint8)) if scale > 1 else grid
