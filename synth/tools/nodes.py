"""One torchrun job across several hosts: `release run REL --nnodes N --rdzv HOST:PORT
[--nproc-per-node M] [--node-rank R]`, the same command on every host (ARCHITECTURE.md, "Distributed
DP-SGD"; docs/scaling-out.md).

Roles. Node rank 0 is the *coordinator*: the host that holds the ledger, the run's lease and the
release's files; it reserves and settles the charge once and writes every output. Without
`--node-rank`, a host is the coordinator when the rendezvous endpoint's HOST is one of its own
addresses. Every other host is a *follower*: it trains and samples only, never reserves, charges,
takes the lease or writes into its workspace (its ranks work in a private temporary folder, deleted
at the end).

How. Each host starts `torchrun --nnodes N --nproc-per-node M --rdzv-backend c10d --rdzv-endpoint
HOST:PORT --rdzv-id REL -m WORKER --nodes HELLO` once for the whole run. Before any budget is
reserved, every rank puts its host's hello (role, the approved plan's fingerprint, --nnodes,
--nproc-per-node, or the reason its host refuses to run) in torchrun's store; all ranks read all
hellos and refuse together unless exactly one host is the coordinator, every host runs the same plan
and agrees on the layout. Then the ranks are renumbered so that the coordinator's first process is
rank 0 (torch's c10d rendezvous numbers hosts in an order of its own): rank 0 adds the DP noise,
writes the step counter, the checkpoints and the result, exactly as under `--nproc`. Rank 0 reads
each stage's job from the coordinator's run folder and sends it to every rank over the process group
(the data it trains on included: keep the hosts' network private), together with the files a stage
resumes from (checkpoint, step counter, cached pre-training), which followers write into their
temporary folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from accounting.errors import InvalidParameterError, PrivReleaseError
from synth.progress import ProgressFn, no_progress

MAX_NNODES = 1024
MAX_NPROC_PER_NODE = 64
PROGRESS_TAG = "@@privrelease-progress"
READY_TAG = "@@privrelease-nodes-ready"
REFUSED_TAG = "@@privrelease-nodes-refused"
DONE_TAG = "@@privrelease-nodes-done"
STOP = "stop"
# what a host that cannot run the release runs, to tell the others why (it never gets past join)
REFUSING_WORKER = "synth.tools.nodes"
LOG_TAIL_LINES = 30
HELLO_TIMEOUT = timedelta(minutes=10)  # every rank is already there: torchrun rendezvoused them
# between the handshake and the first job, the coordinator reads the data and may run its DP query
# or warm-ups in one process; between stages the same
IDLE_TIMEOUT = timedelta(hours=12)

# A process that asks to die with its parent, then execs: torchrun's agent is started through it
# (preexec_fn would be unsafe: the runner's lease heartbeat is a thread). PDEATHSIG survives exec.
EXEC_DYING_WITH_PARENT = (
    "import ctypes, os, signal, sys\nif sys.platform.startswith('linux'):\n    "
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n    if os.getppid() != "
    "int(sys.argv[1]): sys.exit(1)  # the parent died before prctl\nos.execv(sys.executable, "
    "[sys.executable] + sys.argv[2:])\n"
)


# ------------------------------------------------------------------ the layout and its flags
@dataclass(frozen=True)
class Nodes:
    """`--nnodes N --rdzv HOST:PORT --nproc-per-node M [--node-rank R]`."""

    nnodes: int
    host: str
    port: int
    nproc_per_node: int = 1
    node_rank: int | None = None  # 0: the coordinator; None: the host whose address HOST is

    @property
    def rdzv(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def coordinator(self) -> bool:
        if self.node_rank is not None:
            return self.node_rank == 0
        return endpoint_is_local(self.host)

    def torchrun_args(self, run_id: str) -> list[str]:
        return [
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={self.nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.rdzv}",
            f"--rdzv-id={run_id}",
            "--max-restarts=0",
        ]


def parse_nodes(
    nnodes: int | None,
    rdzv: str | None,
    nproc_per_node: int | None = None,
    node_rank: int | None = None,
    nproc: int = 1,
) -> Nodes | None:
    """The multi-host layout from `release run`'s flags, or None without --nnodes; refuses what
    cannot run (InvalidParameterError), before anything is read or charged."""
    if nnodes is None:
        given = [
            flag
            for flag, value in (
                ("--rdzv", rdzv),
                ("--nproc-per-node", nproc_per_node),
                ("--node-rank", node_rank),
            )
            if value is not None
        ]
        if given:
            raise InvalidParameterError(
                f"{', '.join(given)} only make sense with --nnodes N (training across N hosts); "
                "add --nnodes, or use --nproc N on one host."
            )
        return None
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or not 1 <= nnodes <= MAX_NNODES:
        raise InvalidParameterError(
            f"--nnodes must be an integer from 1 to {MAX_NNODES}, got {nnodes!r}."
        )
    if rdzv is None:
        raise InvalidParameterError(
            "--nnodes needs --rdzv HOST:PORT, the rendezvous endpoint every host reaches (a port "
            "on the coordinator, the host that holds the ledger)."
        )
    if nproc != 1:
        raise InvalidParameterError(
            "--nproc and --nnodes together: with --nnodes give the processes of each host with "
            "--nproc-per-node M (--nproc N is for one host)."
        )
    per_node = 1 if nproc_per_node is None else nproc_per_node
    if (
        isinstance(per_node, bool)
        or not isinstance(per_node, int)
        or not 1 <= per_node <= MAX_NPROC_PER_NODE
    ):
        raise InvalidParameterError(
            f"--nproc-per-node must be an integer from 1 to {MAX_NPROC_PER_NODE}, got "
            f"{nproc_per_node!r}."
        )
    if node_rank is not None and (
        isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes
    ):
        raise InvalidParameterError(
            f"--node-rank must be an integer from 0 to {nnodes - 1} (--nnodes {nnodes}; 0 is the "
            f"coordinator), got {node_rank!r}."
        )
    host, port = parse_endpoint(rdzv)
    return Nodes(nnodes, host, port, per_node, node_rank)


def parse_endpoint(rdzv: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 address in brackets: [::1]:29400)."""
    text = rdzv.strip()
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address without brackets: ambiguous
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or " " in host:
        raise InvalidParameterError(
            f"--rdzv must be HOST:PORT (e.g. node1.example.org:29400, or [::1]:29400), with a port "
            f"from 1 to 65535; got {rdzv!r}."
        )
    return host, int(port)


def endpoint_is_local(host: str) -> bool:
    """Whether HOST is one of this machine's addresses (a socket can be bound to it)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def plan_fingerprint(plan: Any) -> str:
    """A digest of a mechanism plan (events, rates, steps, the mechanism's detail): what every host
    compares when a caller has no approved plan digest to give."""
    blob = json.dumps(asdict(plan), sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


# ------------------------------------------------------------------ launching an agent on this host
def _hello_file(folder: Path, hello: dict[str, Any]) -> Path:
    path = folder / "dist_nodes_hello.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(hello, fh)
    return path


def _agent(
    nodes: Nodes,
    run_id: str,
    worker: str,
    hello_path: Path,
    threads: int,
    log_dir: Path | None = None,
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-c",
        EXEC_DYING_WITH_PARENT,
        str(os.getpid()),
        "-m",
        "torch.distributed.run",
        *nodes.torchrun_args(run_id),
        *([f"--log-dir={log_dir}"] if log_dir is not None else []),
        "-m",
        worker,
        "--nodes",
        str(hello_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


class _Output:
    """An agent's output: progress lines forwarded, tagged lines recognised, the rest logged."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        assert proc.stdout is not None  # stdout=PIPE
        self.proc, self.lines, self.log_path = proc, iter(proc.stdout), log_path
        self.log = open(log_path, "w")
        self.tail: deque = deque(maxlen=LOG_TAIL_LINES)
        self.refused: str | None = None

    def until(self, tag: str, progress: ProgressFn) -> bool:
        """Read up to the line `tag`: True, or False at the end of the output."""
        for line in self.lines:
            text = line.rstrip("\n")
            if text == tag:
                return True
            if text.startswith(PROGRESS_TAG):
                _, stage, done, total = text.split("\t")
                progress(stage, int(done), int(total))
            elif text.startswith(REFUSED_TAG):
                self.refused = text.split("\t", 1)[1]
            else:
                self.log.write(line)
                self.log.flush()
                self.tail.append(line)
        return False

    def close(self) -> None:
        self.log.close()

    @contextlib.contextmanager
    def guarding(self) -> Iterator[None]:
        """Around a wait for the agent: an exception inside (Ctrl-C included) stops the agent
        before it goes on (torchrun's agent stops its workers on SIGTERM); the log is closed
        either way."""
        try:
            yield
        except BaseException:
            self.proc.terminate()
            self.proc.wait()
            raise
        finally:
            self.close()


def _threads(nproc_per_node: int) -> int:
    return max(1, (os.cpu_count() or 1) // nproc_per_node)


class NodePool:
    """The coordinator's side: its torchrun agent, started before anything is reserved and kept for
    the whole run; `run(stage, job)` hands a stage to every host's ranks and returns rank 0's
    result."""

    def __init__(
        self,
        nodes: Nodes,
        *,
        worker: str,
        run_id: str,
        fingerprint: str,
        workdir: Path,
    ) -> None:
        self.nodes, self.worker, self.run_id = nodes, worker, run_id
        self.fingerprint, self.workdir = fingerprint, Path(workdir)
        self._n = 0
        self._proc: subprocess.Popen | None = None
        self._out: _Output | None = None

    def start(self, progress: ProgressFn = no_progress) -> None:
        """Wait until every host has joined and agreed on the plan; raise PrivReleaseError if one
        refused or the rendezvous failed."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for old in self.workdir.glob("dist_node_*"):  # an earlier attempt's jobs and results
            old.unlink()
        hello = {
            "coordinator": True,
            "fingerprint": self.fingerprint,
            "nnodes": self.nodes.nnodes,
            "nproc_per_node": self.nodes.nproc_per_node,
            "jobs": str(self.workdir),
            "problem": None,
        }
        path = _hello_file(self.workdir, hello)
        self._proc = _agent(
            self.nodes, self.run_id, self.worker, path, _threads(self.nodes.nproc_per_node)
        )
        self._out = _Output(self._proc, self.workdir / "dist_nodes.log")
        if not self._out.until(READY_TAG, progress):
            self._proc.wait()
            message = self._failure("did not start", before_charge=True)
            self.close()
            raise PrivReleaseError(message)

    def _failure(self, what: str, before_charge: bool = False) -> str:
        assert self._out is not None and self._proc is not None
        if self._out.refused:
            return f"The hosts refused to train together: {self._out.refused} Nothing was charged."
        rc = self._proc.poll()
        head = (
            f"Training across {self.nodes.nnodes} hosts {what}: torchrun exited with {rc} (a "
            f"host failed, was killed or never joined the rendezvous at {self.nodes.rdzv}). Last "
            f"lines of {self._out.log_path}:\n" + "".join(self._out.tail)
        )
        if before_charge:
            return head + "\nNothing was charged."
        return head + (
            "\nThe release is failed and its reservation stays in force. Run the same command "
            "on every host again to resume from its last checkpoint, or `privrelease release "
            "abandon REL` on the coordinator to settle it."
        )

    def run(self, stage: str, job: dict[str, Any], progress: ProgressFn) -> dict[str, Any]:
        if self._out is None:
            raise PrivReleaseError("Internal error: the hosts' pool was not started.")
        n = self._n
        self._n += 1
        result = self.workdir / f"dist_node_result_{n}.pt"
        job_path = self._write_job(n, {**job, "stage": stage, "result": str(result)})
        try:
            ok = self._out.until(f"{DONE_TAG}\t{n}", progress)
        finally:
            job_path.unlink(missing_ok=True)
        if not ok or not result.exists():
            if self._proc is not None:
                self._proc.wait()
            raise PrivReleaseError(self._failure(f"failed during {stage}"))
        import torch

        out = torch.load(result, map_location="cpu", weights_only=False)
        result.unlink()
        return out

    def _write_job(self, n: int, job: dict[str, Any]) -> Path:
        """The job file (sensitive tensors: 0600, renamed into place whole, deleted once read)."""
        import torch

        tmp, path = self.workdir / f".dist_node_job_{n}.tmp", self.workdir / f"dist_node_job_{n}.pt"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            torch.save(job, fh)
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        """Tell every rank to stop, and wait for this host's agent."""
        proc, out = self._proc, self._out
        if proc is None or out is None:
            return
        self._proc = None
        try:
            with out.guarding():
                if proc.poll() is None:
                    self._write_job(self._n, {"stage": STOP})
                    out.until("\0never", no_progress)  # to the end of its output
                    try:
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        proc.terminate()  # torchrun's agent stops its workers on SIGTERM
                        proc.wait()
                else:
                    proc.wait()
        finally:
            for left in self.workdir.glob("dist_node_job_*"):
                left.unlink(missing_ok=True)
            (self.workdir / "dist_nodes_hello.json").unlink(missing_ok=True)


def follow(
    nodes: Nodes,
    *,
    worker: str,
    run_id: str,
    fingerprint: str | None,
    problem: str | None = None,
    progress: ProgressFn = no_progress,
) -> None:
    """A follower host's side: join the coordinator's rendezvous and train until it says stop. With
    `problem` (this host cannot run the release: not approved here, say) it joins only to tell every
    host why, then raises. Nothing is written outside a private temporary folder, removed after."""
    scratch = Path(tempfile.mkdtemp(prefix="privrelease-follower-"))  # 0700
    try:
        hello = {
            "coordinator": False,
            "fingerprint": fingerprint,
            "nnodes": nodes.nnodes,
            "nproc_per_node": nodes.nproc_per_node,
            "jobs": str(scratch),
            "problem": problem,
        }
        path = _hello_file(scratch, hello)
        # torchrun's own files too stay in the private folder
        proc = _agent(
            nodes, run_id, worker, path, _threads(nodes.nproc_per_node), scratch / "torchrun"
        )
        out = _Output(proc, scratch / "dist_nodes.log")
        with out.guarding():
            out.until("\0never", progress)
            rc = proc.wait()
        if out.refused:
            raise PrivReleaseError(f"The hosts refused to train together: {out.refused}")
        if rc != 0:
            raise PrivReleaseError(
                f"This host's part of release {run_id} failed: torchrun exited with {rc} (a host "
                f"failed, was killed or never joined the rendezvous at {nodes.rdzv}). Last lines "
                "of its output:\n" + "".join(out.tail) + "\nSee `privrelease release show "
                f"{run_id}` on the coordinator; run the same command on every host to resume."
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------ inside a worker
@dataclass
class Member:
    """This rank's place once every host agreed: rank 0 is the coordinator's first process."""

    rank: int
    world_size: int
    on_coordinator: bool
    jobs: Path  # the coordinator's run folder (rank 0 reads jobs there), or a private folder
    store: Any
    scratch: Path


@dataclass(frozen=True)
class RankWork:
    """What a mechanism's worker module gives every rank: `stages(job, device)` runs one job (rank 0
    returns its result), `files(job, world)` names the files rank 0 resumes from and ships to the
    followers, `localise(job, scratch)` points a follower's job at its copies, `init_device(kind)`
    picks this rank's device and `save(path, result)` writes rank 0's result."""

    stages: Callable[[dict[str, Any], Any], dict[str, Any] | None]
    files: Callable[[dict[str, Any], int], dict[str, Path]]
    localise: Callable[[dict[str, Any], Path], dict[str, Any]]
    init_device: Callable[[str], Any]
    save: Callable[[Path, Any], None]


class Refused(PrivReleaseError):
    """The hosts do not run the same approved plan (or not in the same layout)."""


def _tcp_store(rank: int, world: int) -> Any:
    """torchrun's store (its agent's by default; else rank 0 hosts it, as env:// would)."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=(rank == 0 and not agent),
        timeout=IDLE_TIMEOUT,
        wait_for_workers=False,
        multi_tenant=True,
    )


def verdict(hellos: list[dict[str, Any]]) -> str | None:
    """Why the hosts may not train together, or None (every rank computes the same answer)."""
    problems = [f"host {h['host']} refuses: {h['problem']}" for h in hellos if h.get("problem")]
    if problems:
        return "; ".join(dict.fromkeys(problems))
    coordinators = sorted({h["host_id"] for h in hellos if h["coordinator"]})
    if not coordinators:
        return (
            "no host is the coordinator. Give --node-rank 0 to the host that holds the ledger "
            "(without --node-rank, the host whose address is the --rdzv endpoint is)."
        )
    if len(coordinators) > 1:
        return (
            f"{len(coordinators)} hosts claim to be the coordinator ({', '.join(coordinators)}). "
            "Exactly one host, the one that holds the ledger, runs with --node-rank 0; give the "
            "others --node-rank 1, 2, ..."
        )
    lead = next(h for h in hellos if h["coordinator"])
    for h in hellos:
        if h["fingerprint"] != lead["fingerprint"]:
            return (
                f"host {h['host']} runs a different plan of this release (fingerprint "
                f"{str(h['fingerprint'])[:16]}…) than the coordinator {lead['host']} "
                f"({str(lead['fingerprint'])[:16]}…): every host must run the same approved plan "
                "(compare `privrelease release show REL` on each)."
            )
        if (h["nnodes"], h["nproc_per_node"]) != (lead["nnodes"], lead["nproc_per_node"]):
            return (
                f"host {h['host']} runs with --nnodes {h['nnodes']} --nproc-per-node "
                f"{h['nproc_per_node']}, the coordinator {lead['host']} with --nnodes "
                f"{lead['nnodes']} --nproc-per-node {lead['nproc_per_node']}: give every host "
                "the same command."
            )
    if len(hellos) != lead["nnodes"] * lead["nproc_per_node"]:
        return (
            f"{len(hellos)} processes joined, the coordinator expects --nnodes {lead['nnodes']} "
            f"x --nproc-per-node {lead['nproc_per_node']}: give every host the same command."
        )
    return None


def join(hello: dict[str, Any]) -> Member:
    """Every rank: compare hellos through torchrun's store, refuse together (Refused), else get this
    rank's place (the coordinator's ranks first)."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = _tcp_store(rank, world)
    hellos_store = dist.PrefixStore("privrelease/hello", store)
    mine = {
        "coordinator": bool(hello["coordinator"]),
        "fingerprint": hello["fingerprint"],
        "nnodes": hello["nnodes"],
        "nproc_per_node": hello["nproc_per_node"],
        "problem": hello.get("problem"),
        "host": socket.gethostname(),
        "host_id": f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '?')}",
    }
    hellos_store.set(str(rank), json.dumps(mine))
    hellos_store.wait([str(r) for r in range(world)], HELLO_TIMEOUT)
    hellos = [json.loads(hellos_store.get(str(r))) for r in range(world)]
    problem = verdict(hellos)
    if problem:
        raise Refused(problem)
    order = sorted(range(world), key=lambda r: (not hellos[r]["coordinator"], r))
    scratch = Path(hello["jobs"]) / f"rank{rank}"
    return Member(
        order.index(rank), world, mine["coordinator"], Path(hello["jobs"]), store, scratch
    )


def _wait_for_job(folder: Path, n: int) -> dict[str, Any]:
    import torch

    path = folder / f"dist_node_job_{n}.pt"
    while not path.exists():
        time.sleep(0.05)
    return torch.load(path, map_location="cpu", weights_only=False)


def serve(member: Member, work: RankWork) -> None:
    """Every rank: run the coordinator's stages until it says stop. Rank 0 reads each job (and the
    files `work.files(job, world)` names, which it resumes from) and sends it to every rank; ranks
    on a follower host write those files into their private folder and get the job with its paths
    there (`work.localise`). The process group is made at the first job, on the job's device (nccl
    on CUDA)."""
    import torch.distributed as dist

    n, device, first = 0, None, None
    while True:
        if device is None:  # no process group yet: the device goes through the store
            if member.rank == 0:
                first = _wait_for_job(member.jobs, n)
                member.store.set("privrelease/device", str(first.get("device", "cpu")))
            member.store.wait(["privrelease/device"], IDLE_TIMEOUT)
            kind = member.store.get("privrelease/device").decode()
            device = work.init_device(kind)
            dist.init_process_group(
                "nccl" if kind.startswith("cuda") else "gloo",
                store=dist.PrefixStore("privrelease/pg", member.store),
                rank=member.rank,
                world_size=member.world_size,
                timeout=IDLE_TIMEOUT,
            )
        box: list[Any] = [None]
        if member.rank == 0:
            job = first if first is not None else _wait_for_job(member.jobs, n)
            first = None
            shipped = {
                name: (path.read_bytes() if path.exists() else None)
                for name, path in (
                    work.files(job, member.world_size).items() if job["stage"] != STOP else ()
                )
            }
            box = [(job, shipped)]
        dist.broadcast_object_list(box, src=0)
        job, shipped = box[0]
        if job["stage"] == STOP:
            return
        if not member.on_coordinator:
            for name, blob in shipped.items():
                target = member.scratch / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                if blob is not None:
                    target.write_bytes(blob)
            job = work.localise(job, member.scratch)
        result = work.stages(job, device)
        if member.rank == 0 and result is not None:
            work.save(Path(job["result"]), result)
        dist.barrier()
        if member.rank == 0:
            print(f"{DONE_TAG}\t{n}", flush=True)
        n += 1


def worker_main(hello_path: str, work: RankWork) -> int:
    """A rank's whole life under `--nodes HELLO`: agree, say ready, serve, leave."""
    import torch.distributed as dist

    hello = json.loads(Path(hello_path).read_text())
    try:
        member = join(hello)
    except Refused as exc:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"{REFUSED_TAG}\t{exc}", flush=True)
        return 3
    if member.rank == 0:
        print(READY_TAG, flush=True)
    try:
        serve(member, work)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _refuse_only(job: dict[str, Any], device: Any) -> dict[str, Any] | None:
    raise PrivReleaseError("Internal error: a host that refused was given a stage to run.")


if __name__ == "__main__":  # REFUSING_WORKER: `python -m synth.tools.nodes --nodes HELLO`
    if len(sys.argv) != 3 or sys.argv[1] != "--nodes":
        print("usage: python -m synth.tools.nodes --nodes HELLO (started by torchrun)")
        sys.exit(2)
    sys.exit(
        worker_main(
            sys.argv[2],
            RankWork(_refuse_only, lambda job, world: {}, lambda job, scratch: job, str, print),
        )
    )
