"""How the audit maps its per-item work (issue 56): a callable with the contract of a mechanism's
`ctx.map_items` — `map_items(fn, config, items, *, label)` runs the module-level, picklable
`fn(config, item)` on every item and returns the results in item order. The caller chooses where
the items run (release passes `release.executor.ItemMapper`: this process, or Dask workers) and
hands it over in `AuditInputs.map_items`; the audit never imports release. The default runs them
here, one after another (`in_process`, or `here(progress)` with a progress bar)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from synth.progress import ProgressFn


class MapItems(Protocol):
    def __call__(
        self,
        fn: Callable[[Any, Any], Any],
        config: Any,
        items: Sequence[Any],
        *,
        label: str,
        keep: bool = True,
    ) -> Sequence[Any]: ...


def in_process(
    fn: Callable[[Any, Any], Any],
    config: Any,
    items: Sequence[Any],
    *,
    label: str,
    keep: bool = True,
) -> list[Any]:
    """`fn(config, item)` for every item, here, in item order (nothing reported, nothing kept)."""
    return [fn(config, item) for item in items]


def here(progress: ProgressFn) -> MapItems:
    """`in_process`, reporting each finished item to `progress` (label, done, total) as the
    run's executor does."""

    def map_items(
        fn: Callable[[Any, Any], Any],
        config: Any,
        items: Sequence[Any],
        *,
        label: str,
        keep: bool = True,
    ) -> list[Any]:
        out: list[Any] = []
        progress(label, 0, len(items))
        for item in items:
            out.append(fn(config, item))
            progress(label, len(out), len(items))
        return out

    return map_items
