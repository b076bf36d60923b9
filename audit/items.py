"""How the audit maps its per-item work (issue 56): a `synth.registry.MapItems`, the contract of a
mechanism's `ctx.map_items`. The caller chooses where the items run (release passes
`release.executor.ItemMapper`: this process, or Dask workers) and hands it over in
`AuditInputs.map_items`; the audit never imports release. The default runs them here, one after
another (`in_process`, or `here(progress)` with a progress bar)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synth.progress import ProgressFn, no_progress
from synth.registry import ItemFn, MapItems

__all__ = ["MapItems", "here", "in_process"]


def here(progress: ProgressFn) -> MapItems:
    """Items in this process, one after another, each finished one reported to `progress`
    (label, done, total) as the run's executor does; nothing kept."""

    def map_items(
        fn: ItemFn, config: Any, items: Sequence[Any], *, label: str, **kept: bool
    ) -> list[Any]:
        # `keep` and `lazy` (MapItems) ask to store results: the audit's are never stored
        out: list[Any] = []
        progress(label, 0, len(items))
        for item in items:
            out.append(fn(config, item))
            progress(label, len(out), len(items))
        return out

    return map_items


in_process: MapItems = here(no_progress)  # items here, nothing reported
