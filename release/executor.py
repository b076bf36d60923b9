"""Where a mechanism's per-item work runs, chosen by the runner (issue 56): in this process (the
default), on a Dask `LocalCluster` of N worker processes started and stopped here
(`release run --workers N`), or on a Dask scheduler a site already runs (`--cluster
tcp://HOST:8786` or a scheduler file).

A mechanism declares its per-item function (`MechanismEntry.per_item`: module-level, picklable,
`fn(config, item) -> result`) and maps it with `ctx.map_items`; it never knows which executor ran
it. Whatever the executor, this process stays the coordinator: it holds the run's lease, charges the
ledger and writes each finished item to the run's work folder (atomically, fsynced) before the item
counts, so a resumed run reuses it instead of redoing it. Workers get only the config and their
items; they never open the store.

Every item runs with one CPU thread (torch, OpenCV, SimpleITK and the BLAS pools), here as on a
worker: the same seeds then give the same bytes whatever the number of workers (a reduction split
over two threads can round differently from one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from accounting.errors import InvalidParameterError, PrivReleaseError
from release import worker_log
from release.retries import DEFAULT_RETRIES, Failed, Retries
from release.run_log import LOG_NAME, RunLog
from synth.progress import no_progress
from synth.registry import ItemFn

ITEMS_DIR = "items"  # under a run's work folder: one file per finished item
MAP_NOTE, RETRY_NOTES = "map.json", "retries.jsonl"  # beside them: the map's size, its retries
IN_FLIGHT_PER_WORKER = 4  # items handed out ahead per worker (bounded memory on the coordinator)
WAIT_FOR_WORKERS_S = 300.0  # a site's cluster: how long to wait for its first worker
CONNECT_TIMEOUT_S = 30  # a site's scheduler: how long to try to reach it (refused before a charge)


@dataclass(frozen=True)
class ExecutorChoice:
    """What `release run` asked for: `workers` local processes, or a site's `cluster` (a
    scheduler address such as tcp://host:8786, or the path of a scheduler file); neither = this
    process."""

    workers: int = 0
    cluster: str | None = None
    retries: int = DEFAULT_RETRIES  # of an item whose process or worker died, or timed out

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise InvalidParameterError(f"--workers must be at least 1, got {self.workers}.")
        if not 0 <= self.retries <= 10:
            raise InvalidParameterError(f"--retries must be 0 to 10, got {self.retries}.")
        if self.workers and self.cluster:
            raise InvalidParameterError(
                "--workers starts a cluster on this machine and --cluster uses a site's: give one."
            )

    @property
    def in_process(self) -> bool:
        return not self.workers and not self.cluster

    def describe(self) -> str:
        if self.cluster:
            return f"the Dask cluster at {self.cluster}"
        if self.workers:
            return f"{self.workers} local Dask worker process(es)"
        return "this process"


IN_PROCESS = ExecutorChoice()


class SchedulerLostError(PrivReleaseError):
    """The Dask scheduler of a run went away while items were out."""


# ------------------------------------------------------------------ one item, one thread
@contextmanager
def _one_thread() -> Iterator[None]:
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    cv2 = _cv2()
    cv_before = cv2.getNumThreads() if cv2 is not None else None
    itk = _itk_threads()
    itk_before = itk.GetGlobalDefaultNumberOfThreads() if itk is not None else None
    torch.set_num_threads(1)
    if cv2 is not None:
        cv2.setNumThreads(1)
    if itk is not None:  # SimpleITK's filters (resampling, smoothing) use every core by default
        itk.SetGlobalDefaultNumberOfThreads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        torch.set_num_threads(before)
        if cv2 is not None and cv_before is not None:
            cv2.setNumThreads(cv_before)
        if itk is not None and itk_before is not None:
            itk.SetGlobalDefaultNumberOfThreads(itk_before)


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:  # pragma: no cover - OpenCV is optional
        return None
    return cv2


def _itk_threads() -> Any:
    try:
        import SimpleITK as sitk
    except ImportError:  # pragma: no cover - SimpleITK is a dependency
        return None
    return sitk.ProcessObject


def call_item(fn: Callable[[Any, Any], Any], config: Any, item: Any) -> Any:
    """`fn(config, item)` on one CPU thread (what every executor runs, here or on a worker)."""
    with _one_thread():
        return fn(config, item)


def call_setup(fn: Callable[..., Any], *args: Any) -> Any:
    with _one_thread():
        return fn(*args)


# ------------------------------------------------------------------ finished items on disk
class ItemStore:
    """The finished items of one map in a run's work folder: `<index>.pkl`, written to a temporary
    name, fsynced and renamed, so an item is either whole or absent. Read back only by the
    coordinator that wrote it (the run's own folder, like its checkpoints)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_map(cls, workdir: Path, fn: Callable[..., Any], config: Any, n: int) -> ItemStore:
        """The folder of `fn` mapped under `config` over `n` items (another config or function
        starts afresh)."""
        what = f"{fn.__module__}.{fn.__qualname__}|{config!r}|{n}"
        key = hashlib.sha256(what.encode()).hexdigest()[:16]
        return cls(Path(workdir) / ITEMS_DIR / f"{fn.__name__}-{key}")

    def path(self, index: int) -> Path:
        return self.folder / f"{index:07d}.pkl"

    def done(self) -> set[int]:
        return {int(p.stem) for p in self.folder.glob("*.pkl") if p.stem.isdigit()}

    def load(self, index: int) -> Any:
        with open(self.path(index), "rb") as fh:
            return pickle.load(fh)

    def note_map(self, label: str, n: int) -> None:
        """What this folder's map is (for a run's attempts: release/attempts.py)."""
        (self.folder / MAP_NOTE).write_text(json.dumps({"label": label, "n": n}))

    def note_retry(self, index: int, why: str) -> None:
        with open(self.folder / RETRY_NOTES, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"index": index, "at": time.time(), "why": why}) + "\n")

    def noted_total(self) -> int:
        try:
            return int(json.loads((self.folder / MAP_NOTE).read_text())["n"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def noted_retries(self) -> int:
        try:
            return len((self.folder / RETRY_NOTES).read_text().splitlines())
        except OSError:
            return 0

    def save(self, index: int, result: Any) -> None:
        final = self.path(index)
        tmp = final.with_suffix(f".tmp-{os.getpid()}")
        with open(tmp, "wb") as fh:
            pickle.dump(result, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class StoredResults(Sequence[Any]):
    """The results of one map as its `ItemStore` holds them: item i is loaded from its file each
    time it is asked for and not kept, so going through N results holds one at a time (the
    caller's), not N (what `map_items(..., lazy=True)` returns)."""

    def __init__(self, store: ItemStore, n: int) -> None:
        self.store, self.n = store, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(f"item {i} of {self.n}")
        return self.store.load(i % self.n)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n):
            yield self.store.load(i)


# ------------------------------------------------------------------ executors
class InProcess:
    """Items one after another in this process."""

    workers = 1

    def __init__(self, retries: int = DEFAULT_RETRIES, log: Path | None = None) -> None:
        self.retries = retries
        self.log = RunLog(log) if log is not None else None

    def setup(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        return [call_setup(fn, *args)]

    def map(
        self, fn: Callable[[Any, Any], Any], config: Any, items: Iterable[tuple[int, Any]]
    ) -> Iterator[tuple[int, Any]]:
        items = iter(items)
        while (nxt := next(items, None)) is not None:  # a retried item may come back
            index, item = nxt
            try:
                result = call_item(fn, config, item)
            except Exception as exc:  # noqa: BLE001 - map_items decides: retried or stopped
                result = Failed(exc)
            yield index, result

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


class DaskExecutor:
    """Items as Dask tasks on a `LocalCluster` this object started (and stops), or on a site's
    scheduler. An item whose worker died (or that failed) comes back as `Failed`, and map_items
    hands it out again or stops (release/retries.py); the coordinator keeps the first result of
    each item, so each is released once."""

    def __init__(self, choice: ExecutorChoice, log: Path | None = None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:  # pragma: no cover - a pinned dependency
            raise PrivReleaseError(
                "--workers and --cluster need Dask: pip install 'dask[distributed]'."
            ) from exc
        self.cluster = None
        self._config: Any = None
        self.retries, self.target = choice.retries, choice.describe()
        self._tries: dict[int, int] = {}
        # distributed's logging to the run's log file from here on (release/run_log.py)
        self.log = RunLog(log) if log is not None else None
        if choice.cluster:
            target = choice.cluster
            if "://" not in target and not Path(target).is_file():
                raise InvalidParameterError(
                    f"--cluster {target!r} is neither a scheduler address (tcp://HOST:8786) nor "
                    "a scheduler file. Nothing was charged."
                )
            try:
                wait = f"{CONNECT_TIMEOUT_S}s"
                self.client = (
                    Client(target, timeout=wait)
                    if "://" in target
                    else Client(scheduler_file=target, timeout=wait)
                )
            except OSError as exc:  # TimeoutError included
                self._close_log()
                raise PrivReleaseError(
                    f"Could not reach the Dask scheduler {target}: {exc}. Check that it runs and "
                    "that this machine may connect to it. Nothing was charged."
                ) from exc
        else:
            import dask

            self._config = dask.config.set(
                {
                    # worker processes that may start their own (the head registration runs in a
                    # forked child, to stay interruptible); read by the nannies at each (re)start
                    "distributed.worker.daemon": False,
                    # an item whose worker died comes back at once as KilledWorker, to be retried
                    # (counted, and said) by map_items rather than silently by the scheduler
                    "distributed.scheduler.allowed-failures": 0,
                    # one item per worker thread at a time: a worker that dies loses only its own
                    "distributed.scheduler.worker-saturation": 1.0,
                }
            )
            self._config.__enter__()
            try:
                self.cluster = LocalCluster(
                    n_workers=choice.workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    # the workers' own: errors only (to the run's log file, once preloaded); this
                    # process's are routed by release/run_log.py (which this does not lower)
                    silence_logs=logging.ERROR,
                    **self._quiet_workers(),
                )
                self.client = Client(self.cluster)
            except BaseException:
                self._config.__exit__(None, None, None)
                self._close_log()
                raise
        try:
            self.client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
        except TimeoutError as exc:
            self.close()
            raise PrivReleaseError(
                f"No Dask worker joined {choice.describe()} within {WAIT_FOR_WORKERS_S:g} s; "
                "start the workers (docs/scaling-out.md), then run again. Nothing was charged."
            ) from exc
        self.workers = max(1, self.connected())
        self._prefix = uuid.uuid4().hex[:12]

    def _quiet_workers(self) -> dict[str, Any]:
        """Worker processes whose stderr goes to the run's log file (release/worker_log.py)."""
        if self.log is None:
            return {}
        return {
            "preload": [worker_log.__name__],
            "env": {worker_log.LOG_ENV: str(self.log.path)},
        }

    def setup(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """`fn(*args)` once on every worker now connected (loading its models); workers that join
        later load theirs with their first item."""
        return list(self.client.run(call_setup, fn, *args).values())

    def map(
        self, fn: Callable[[Any, Any], Any], config: Any, items: Iterable[tuple[int, Any]]
    ) -> Iterator[tuple[int, Any]]:
        from distributed import as_completed

        pending = iter(items)
        futures: dict[Any, int] = {}

        def top_up() -> list[Any]:
            """Enough items handed out to keep every worker now connected busy (a site's
            cluster may grow while the run goes on)."""
            window = IN_FLIGHT_PER_WORKER * max(1, self.connected())
            out = []
            while len(futures) < window:
                nxt = next(pending, None)
                if nxt is None:
                    break
                index, item = nxt
                with warnings.catch_warnings():
                    # an item of tens of MB may travel with its task on purpose (large records
                    # travel as references); distributed's advice to load it with Dask is noise
                    warnings.filterwarnings("ignore", "Sending large graph", UserWarning)
                    tries = self._tries[index] = self._tries.get(index, 0) + 1
                    future = self.client.submit(
                        call_item,
                        fn,
                        config,
                        item,
                        key=f"item-{self._prefix}-{index}-{tries}",  # a retry is a new task
                        pure=False,
                    )
                futures[future.key] = index
                out.append(future)
            return out

        queue = as_completed(top_up(), with_results=False)
        for future in queue:
            index = futures.pop(future.key)
            if future.status == "cancelled" or self.client.status != "running":
                raise SchedulerLostError(
                    f"The scheduler of {self.target} was lost while items were running "
                    f"(the client's connection: {self.client.status})."
                )
            if future.status == "error":  # the task's exception, or KilledWorker
                result: Any = Failed(future.exception())
            else:
                result = future.result()
            future.release()
            yield index, result
            for more in top_up():
                queue.add(more)

    def connected(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def recent_death(self) -> str | None:
        return self.log.recent_death() if self.log is not None else None

    def _close_log(self) -> None:
        if self.log is not None:
            self.log.close()

    def close(self) -> None:
        if self.log is not None:
            self.log.closing = True  # the workers it stops are not "killed" events
        try:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()
        finally:
            if self._config is not None:
                self._config.__exit__(None, None, None)
            self._close_log()


def start(choice: ExecutorChoice, workdir: Path | None = None) -> InProcess | DaskExecutor:
    """The executor `choice` asks for; with `workdir` (a run's), libraries log to its run.log."""
    log = Path(workdir) / LOG_NAME if workdir is not None else None
    if choice.in_process:
        return InProcess(choice.retries, log)
    return DaskExecutor(choice, log)


def map_items(
    executor: InProcess | DaskExecutor,
    workdir: Path,
    fn: Callable[[Any, Any], Any],
    config: Any,
    items: Sequence[Any],
    *,
    label: str,
    progress: Callable[[str, int, int], None],
    keep: bool = True,
    lazy: bool = False,
) -> Sequence[Any]:
    """`fn(config, item)` for every item, in item order; each result saved before it counts, and
    items saved by an earlier attempt of the run reused, not redone (`keep=False`: nothing
    written, nothing reused). Items are taken from `items` as they are handed out, so a sequence
    that reads item i when asked is read a few at a time. `lazy=True` (with `keep`): no result is
    held here, and the results come back as `StoredResults`, each read from its file when asked
    (a release of heads: the coordinator's memory does not grow with their number)."""
    if lazy and not keep:
        raise InvalidParameterError(
            "map_items(lazy=True) reads its results back from the run's work folder, so it needs "
            "keep=True (results too sensitive to store are held in memory: lazy=False)."
        )
    n = len(items)
    saved = ItemStore.for_map(workdir, fn, config, n) if keep else None
    done = {i for i in saved.done() if i < n} if saved is not None else set()
    results: dict[int, Any] = (
        {} if lazy or saved is None else {i: saved.load(i) for i in sorted(done)}
    )
    if saved is not None:
        saved.note_map(label, n)
    progress(label, len(done), n)
    todo = _Feed((i, items[i]) for i in range(n) if i not in done)
    log = getattr(executor, "log", None)
    retries = Retries(
        executor.retries,
        label,
        n,
        log.path if log is not None else None,
        getattr(executor, "recent_death", lambda: None),
        lambda: len(done),
    )
    try:
        for index, result in executor.map(fn, config, todo):
            if index in done:  # never counted twice
                continue
            if isinstance(result, Failed):  # retried (handed out again) or the run stops here
                retries.failed(index, items[index], result.error)
                if saved is not None:
                    saved.note_retry(index, type(result.error).__name__)
                todo.again.append((index, items[index]))
                continue
            if saved is not None:
                saved.save(index, result)
            if not lazy:
                results[index] = result
            done.add(index)
            progress(label, len(done), n)
    except SchedulerLostError as exc:
        raise SchedulerLostError(
            f"{exc} The run stopped; {retries.kept()} once the scheduler and its workers run "
            f"again (nothing is charged twice).{retries.details()}"
        ) from None
    if lazy and saved is not None:
        return StoredResults(saved, n)
    return [results[i] for i in range(n)]


class _Feed(Iterator[tuple[int, Any]]):
    """The items to hand out: retried ones first, then the rest. Asked again after it ran dry, it
    hands out an item retried since (executors ask with `next` each time, never a for loop)."""

    def __init__(self, first: Iterator[tuple[int, Any]]) -> None:
        self.first = first
        self.again: deque[tuple[int, Any]] = deque()

    def __next__(self) -> tuple[int, Any]:
        if self.again:
            return self.again.popleft()
        return next(self.first)


class ItemMapper:
    """`map_items` on one executor, reporting to one progress callback: what a mechanism's
    context (`ctx.map_items`, `ctx.prepare_workers`), the audit (`AuditInputs.map_items`) and the
    benchmarks map items with. Given an `ExecutorChoice`, the executor is started at the first
    map (none for work that never maps) and stopped by `close`. Without `workdir` nothing is
    saved or reused (the audit's items: it keeps no work folder)."""

    def __init__(
        self,
        executor: InProcess | DaskExecutor | ExecutorChoice | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        workdir: Path | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self._choice: ExecutorChoice | None = None
        self._executor: InProcess | DaskExecutor | None = None
        if isinstance(executor, ExecutorChoice):
            self._choice = executor
        else:
            self._executor = executor if executor is not None else InProcess()
        self.progress = progress if progress is not None else no_progress
        self.workdir = workdir
        self.log_dir = log_dir if log_dir is not None else workdir  # where run.log is kept

    @property
    def executor(self) -> InProcess | DaskExecutor:
        if self._executor is None:
            self._executor = start(self._choice or IN_PROCESS, self.log_dir)
        return self._executor

    def __call__(
        self,
        fn: ItemFn,
        config: Any,
        items: Sequence[Any],
        *,
        label: str,
        keep: bool = True,
        lazy: bool = False,
    ) -> Sequence[Any]:
        """`fn(config, item)` for every item, in item order (`map_items`; `lazy` needs a
        `workdir`, where the results are read back from)."""
        return map_items(
            self.executor,
            self.workdir if self.workdir is not None else Path("."),
            fn,
            config,
            items,
            label=label,
            progress=self.progress,
            keep=keep and self.workdir is not None,
            lazy=lazy,
        )

    def setup(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """`fn(*args)` once on every worker (or here): each loads its models before the items."""
        return self.executor.setup(fn, *args)

    def close(self) -> None:
        """Stop the executor this mapper started (one it was given stays with its owner)."""
        if self._choice is not None and self._executor is not None:
            self._executor.close()
            self._executor = None


@contextmanager
def mapping_on(
    choice: ExecutorChoice,
    progress: Callable[[str, int, int], None] | None = None,
    log_dir: Path | None = None,
) -> Iterator[ItemMapper]:
    """An `ItemMapper` on the executor `choice` asks for, started at its first map and stopped on
    leaving (the audit's: it keeps no work folder; libraries log to `log_dir`'s run.log)."""
    mapper = ItemMapper(choice, progress, log_dir=log_dir)
    try:
        yield mapper
    finally:
        mapper.close()
