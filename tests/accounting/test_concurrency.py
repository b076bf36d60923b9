"""Eight processes race for a budget that fits only some of them: the cap holds and nothing is lost."""

import multiprocessing as mp

from accounting import ledger, trail
from accounting.epsilon import epsilon_rdp
from accounting.errors import BudgetExceededError
from accounting.events import DpSgd
from accounting.store import Store, Workspace

EVENT = DpSgd(0.01, 1.0, 250)


def _race(root: str, run_id: str, barrier, results) -> None:
    store = Store(Workspace(root))
    barrier.wait()
    try:
        ledger.reserve(store, "d", [EVENT], run_id)
        ledger.commit(store, run_id, [EVENT])
        results.put((run_id, "won"))
    except BudgetExceededError:
        results.put((run_id, "refused"))


def _register(store, cap: float) -> None:
    ledger.register_dataset(
        store,
        name="d",
        source="s",
        fingerprint="f",
        record_count=5000,
        labels=[0],
        image_shape=[8, 8],
        epsilon_cap=cap,
        delta_cap=1e-5,
    )


def _admitted_one_by_one(root, cap: float, n: int) -> int:
    """How many of n charges the ledger's stopping rule admits when they come one after another."""
    ws = Workspace(root)
    ws.init()
    scratch = Store(ws)
    _register(scratch, cap)
    for i in range(n):
        try:
            ledger.reserve(scratch, "d", [EVENT], f"seq-{i}")
        except BudgetExceededError:
            return i
    return n


def test_processes_racing_for_the_last_budget(store, tmp_path):
    # a cap between the spend of 3 and 4 charges: only some of the 8 racers fit (on DuckDB and PostgreSQL alike)
    three, four = epsilon_rdp([EVENT] * 3, 1e-5), epsilon_rdp([EVENT] * 4, 1e-5)
    cap = (three + four) / 2
    admitted = _admitted_one_by_one(tmp_path / "scratch", cap, 8)
    assert 0 < admitted < 8
    _register(store, cap)
    # forked from one clean server process that has imported the store once: nothing of this
    # process (locks, connections, threads) is inherited, and eight interpreters need not import it
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["accounting.ledger", "accounting.store", "accounting.trail"])
    n = 8
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(store.workspace.root), f"run-{i}", barrier, results))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    outcomes = dict(results.get(timeout=5) for _ in range(n))
    winners = [r for r, o in outcomes.items() if o == "won"]
    assert len(winners) == admitted and len(outcomes) == n
    b = ledger.budget(store, "d")
    assert b.spent_rdp <= cap
    assert sorted(c.run_id for c in b.charges) == sorted(winners)
    assert all(c.state == "committed" for c in b.charges)
    v = trail.verify(store)
    assert (
        v.ok and v.length == 1 + 2 * admitted
    )  # register + reserve/commit per winner, nothing lost
