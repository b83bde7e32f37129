"""Starting a job on one or many processes with ``torch.distributed``.

``launch`` either spawns one process per device on this machine, or, when
the environment was prepared by ``torchrun`` (or any launcher that sets
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``), joins the
process group it describes. NCCL is used with CUDA, gloo otherwise, so
``--num-gpus 2`` on a CPU-only machine runs two gloo processes.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import logging
import os
import signal
import socket
import sys
import threading
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence, Set

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from treadle.config.train_keys import train_default
from treadle.hooks.preemption import PREEMPTED_EXIT_CODE
from treadle.utils import comm
from treadle.utils.logger import one_line_error

# Wrapping the model (DDP, FSDP2) is data_parallel.py's; its names stay
# importable from here, where scripts and saved configs (a _target_) written
# before the split name them.
from treadle.engine.data_parallel import (  # noqa: F401
    check_optimizer_holds,
    create_ddp_model,
    create_fsdp_model,
    wrap_model,
)

__all__ = [
    "launch",
    "find_free_port",
    "DEFAULT_TIMEOUT",
    "launched_by_torchrun",
    "join_env_process_group",
    "leave_process_group",
    "GROUP_LOST_EXIT_CODE",
]

logger = logging.getLogger(__name__)

#: ``train.dist_timeout``'s default (5 minutes; detectron2's is 30): the
#: set-up's and every collective's bound when none is given. See the table.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=train_default("dist_timeout"))

_ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def find_free_port() -> int:
    """A TCP port free on this machine now (another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launched_by_torchrun() -> bool:
    """True when ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` describe a process group."""
    return all(k in os.environ for k in _ENV_KEYS)


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: Optional[str] = "auto",
    args: Sequence[Any] = (),
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Runs ``main_func(*args)`` on every process of the job.

    Args:
        main_func: the job; called once per process.
        num_gpus_per_machine: processes per machine (one per GPU; on a CPU-only
            machine, that many gloo processes).
        num_machines, machine_rank: for jobs over several machines, each
            started with its own ``machine_rank``.
        dist_url: ``tcp://host:port`` of machine 0, or ``"auto"`` for a free
            port on this machine (one machine only).
        timeout: bounds joining the process group and, as the group's
            timeout, every collective: a rank that waits past it fails
            instead of hanging forever (joining: one line and
            :data:`GROUP_LOST_EXIT_CODE`), so that torchrun can restart the
            group. ``tools/train_net.py`` passes ``train.dist_timeout``.

    With ``torchrun`` (or SLURM with the four variables above exported), the
    process group comes from the environment and nothing is spawned; the
    process-count arguments are ignored with a note if they disagree.

    Spawned processes: when one fails, the others get 30 seconds to end by
    themselves before they are terminated; a worker's exit status (75 after
    a preemption) is raised here as ``SystemExit``; SIGTERM and SIGUSR1 sent
    to this process are passed on to the workers.
    """
    if launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        asked = num_gpus_per_machine * num_machines
        if asked not in (1, world):
            logger.info("Launched by torchrun with WORLD_SIZE=%d; --num-gpus/--num-machines (%d) are ignored.", world, asked)
        _run_in_env_group(main_func, args, timeout)
        return

    if num_gpus_per_machine < 1 or num_machines < 1:
        raise ValueError(f"num_gpus_per_machine and num_machines must be >= 1, got {num_gpus_per_machine}, {num_machines}")
    if not 0 <= machine_rank < num_machines:
        raise ValueError(f"machine_rank must be in [0, {num_machines}), got {machine_rank}")
    world_size = num_machines * num_gpus_per_machine
    if world_size == 1:
        main_func(*args)
        return
    if torch.cuda.is_available() and num_gpus_per_machine > torch.cuda.device_count():
        raise ValueError(
            f"{num_gpus_per_machine} processes per machine were asked for, but this machine has "
            f"{torch.cuda.device_count()} GPU(s)"
        )
    if dist_url in (None, "", "auto"):
        if num_machines > 1:
            raise ValueError(
                "dist_url='auto' only works on one machine; for several machines give the address of "
                "machine 0, e.g. --dist-url tcp://10.1.2.3:29500, on every machine"
            )
        dist_url = f"tcp://127.0.0.1:{find_free_port()}"
    if num_machines > 1 and dist_url.startswith("file://"):
        logger.warning("file:// init needs a file system shared by all machines: %s", dist_url)

    with _SignalForwarder() as forwarder:
        context = mp.start_processes(
            _distributed_worker,
            nprocs=num_gpus_per_machine,
            args=(main_func, world_size, num_gpus_per_machine, machine_rank, dist_url, tuple(args), timeout, os.getpid()),
            daemon=False,
            start_method="spawn",
            join=False,
        )
        forwarder.attach(context.processes)
        _wait_for_workers(context, forwarder.forwarded)


# When one process fails, how long the others get to end by themselves (all
# ranks raise at the same flush on a NaN, all exit together on a preemption)
# before they are terminated.
_FAILURE_GRACE_S = 30.0
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class _SignalForwarder:
    """Passes SIGTERM and SIGUSR1 sent to the launcher alone on to the
    workers, whose :class:`~treadle.hooks.PreemptionHandler` checkpoints and
    exits with status 75: the launcher then exits with 75 too, so that a
    scheduler sees the preemption, not a crash.

    Installed before the workers are spawned: a signal that arrives while
    they start is held and passed on as soon as they exist, rather than
    ending the launcher alone and leaving them to train on unwatched.
    """

    def __init__(self) -> None:
        self.forwarded: Set[int] = set()
        self._processes: Sequence[Any] = ()
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "_SignalForwarder":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._forward) for sig in _FORWARDED_SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def attach(self, processes: Sequence[Any]) -> None:
        self._processes = processes
        for signum in sorted(self.forwarded):
            self._send(signum)

    def _forward(self, signum: int, frame: Any) -> None:
        self.forwarded.add(signum)
        self._send(signum)

    def _send(self, signum: int) -> None:
        for process in self._processes:
            if process.is_alive():
                os.kill(process.pid, signum)


def _wait_for_workers(context: Any, forwarded: Set[int]) -> None:
    """Joins the spawned processes; the launcher's exit status is theirs.
    ``forwarded``: the signals passed on to them (see :class:`_SignalForwarder`)."""
    try:
        while not context.join(grace_period=_FAILURE_GRACE_S):
            pass
    except mp.ProcessExitedException as e:
        if e.exit_code is not None and e.exit_code > 0:
            # A worker called sys.exit (75 after a preemption): not a crash
            # to show a traceback for, but the job's exit status.
            logger.info("Process %d exited with status %d.", e.error_index, e.exit_code)
            raise SystemExit(e.exit_code) from None
        if e.exit_code is not None and e.exit_code < 0 and -e.exit_code in forwarded:
            # A signal passed on to a worker still starting (no handler yet):
            # the job was stopped before it began, as a preemption says.
            logger.info("Process %d ended by the %s passed on to it.", e.error_index, signal.Signals(-e.exit_code).name)
            raise SystemExit(PREEMPTED_EXIT_CODE) from None
        if e.exit_code is not None and e.exit_code < 0:
            # Killed by a signal (the OOM killer's SIGKILL, say): one line, and
            # the shell's status for it, 128 + the signal number.
            name = e.signal_name or f"signal {-e.exit_code}"
            print(f"error: process {e.error_index} of the job was killed by {name}", file=sys.stderr, flush=True)
            raise SystemExit(128 - e.exit_code) from None
        raise
    except mp.ProcessRaisedException as e:
        # torch wraps the worker's traceback in the launcher's (some 40 lines
        # around the one that says what happened): that line, and where the rest is.
        print(f"error: process {e.error_index} of the job failed: {_worker_error(str(e))}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _worker_error(message: str) -> str:
    """The exception's own line(s) at the end of a worker's traceback
    (``ProcessRaisedException``'s message), joined by "; ", and the file the
    whole traceback is saved to."""
    trace = message.split("terminated with the following error:\n", 1)[-1]
    lines = trace.rstrip().splitlines()
    # The exception follows the last frame (indented lines), and may span lines of its own.
    start = max((i + 1 for i, line in enumerate(lines) if line.startswith(" ")), default=0)
    text = "; ".join(line.strip() for line in lines[start:] if line.strip()) or "an exception"
    fd, path = tempfile.mkstemp(prefix="treadle-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(trace)
    return f"{text} (traceback in {path})"


def _distributed_worker(
    local_rank: int,
    main_func: Callable[..., Any],
    world_size: int,
    num_gpus_per_machine: int,
    machine_rank: int,
    dist_url: str,
    args: Sequence[Any],
    timeout: datetime.timedelta,
    launcher_pid: Optional[int] = None,
) -> None:
    if launcher_pid is not None:
        _end_with_the_launcher(launcher_pid)
    global_rank = machine_rank * num_gpus_per_machine + local_rank
    # What torchrun would set: code that reads the environment sees one convention.
    os.environ.update(
        {
            "RANK": str(global_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(num_gpus_per_machine),
        }
    )
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        # The processes share this machine's cores: each takes its part, as
        # torchrun's OMP_NUM_THREADS=1 does. Oversubscribed, gloo's threads
        # wait for cores and two processes ran 5x slower (benchmarks/ddp.py).
        torch.set_num_threads(max(1, torch.get_num_threads() // num_gpus_per_machine))
    started = time.monotonic()
    try:
        dist.init_process_group(backend=_backend(), init_method=dist_url, world_size=world_size, rank=global_rank, timeout=timeout)
    except _SET_UP_ERRORS as e:
        _exit_unjoined(global_rank, started, dist_url, e)
    _run_and_clean_up(main_func, args)


# prctl's option: the signal the kernel sends this process when its parent ends.
_PR_SET_PDEATHSIG = 1


def _end_with_the_launcher(launcher_pid: int) -> None:
    """Has the kernel send this worker SIGTERM when the launcher ends, however
    it ends (``kill -9`` of the launcher's PID: its handlers, which pass
    SIGTERM on, never run). Without it the workers trained on, orphaned,
    holding the output folder. SIGTERM is what a preemption sends: every
    worker checkpoints at the ranks' next agreed check and exits with 75, so
    ``--resume`` continues from there. Linux only (prctl); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher_pid:
        # The launcher ended before the request was made: nothing will send it.
        os.kill(os.getpid(), signal.SIGTERM)


def join_env_process_group(timeout: datetime.timedelta = DEFAULT_TIMEOUT, *, leave_at_exit: bool = False) -> bool:
    """Joins the process group that torchrun's environment describes (see
    :func:`launched_by_torchrun`), unless one is joined already or there is
    none to join. Returns True when this call joined it; the caller then
    leaves it with :func:`leave_process_group`, or has it left when the
    process exits (``leave_at_exit``: the plain
    :class:`~treadle.trainer.Trainer` started by torchrun). Used by
    :func:`launch` too.

    ``timeout`` bounds the set-up and, as the group's timeout, every
    collective. A process that cannot join within it (a peer that never
    comes, a store that is gone) prints one line naming what it waited for
    and exits with :data:`GROUP_LOST_EXIT_CODE`, so that torchrun restarts
    the group rather than wait with it.

    Under torchrun's restarts the ranks meet over a store of their own for
    each attempt, not over torchrun's store directly: see
    ``_attempt_store`` (docs/distributed.md, "Fault-tolerant runs").
    """
    if dist.is_initialized() or not launched_by_torchrun():
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    _AgentWatch.start()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    started = time.monotonic()
    try:
        store = _attempt_store(rank, world_size, started + timeout.total_seconds())
        dist.init_process_group(backend=_backend(), store=store, rank=rank, world_size=world_size, timeout=timeout)
    except _SET_UP_ERRORS as e:
        _exit_unjoined(rank, started, where, e)
    # Its waits had what was left of the set-up's time; now the group's.
    store.set_timeout(timeout)
    _AgentWatch.joined = True
    if leave_at_exit:
        atexit.register(leave_process_group)
    return True


#: Exit status of a process that could not join its process group within
#: the timeout: EX_UNAVAILABLE from sysexits.h. Any non-zero status makes
#: torchrun restart the group; this one tells a log reader why.
GROUP_LOST_EXIT_CODE = 69

# What a set-up that cannot complete raises: the store's and gloo's timeouts
# and refused connections (DistError and its subclasses are RuntimeErrors).
_SET_UP_ERRORS = (RuntimeError, TimeoutError, ConnectionError, ValueError)

# Where the ranks of one attempt find its store, in torchrun's store.
_ATTEMPT_STORE_KEY = "treadle/attempt_store"
_TOKEN_KEY = "treadle/token"
# How long one try to reach a published store lasts before the address is read again.
_CONNECT_TRY_S = 3.0

# Rank 0's store of the current attempt, kept alive with the group.
_own_store: Optional[Any] = None


def _remaining(deadline: float) -> datetime.timedelta:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("set-up deadline passed")
    return datetime.timedelta(seconds=left)


def _attempt_store(rank: int, world_size: int, deadline: float) -> Any:
    """The store the ranks of this attempt meet over, fresh for each attempt.

    torchrun (torch >= 2.4, c10d and static rendezvous) hosts one TCPStore in
    its agent for the whole job and tells every worker to use it
    (``TORCHELASTIC_USE_AGENT_STORE=True``); torch's env:// set-up then adds
    no prefix per restart. After a restart the keys of the dead attempt are
    still there, among them the addresses gloo's ranks published to connect
    to each other: a new rank that reads a dead peer's address before the
    new peer overwrites it fails with "connectFullMesh ... Connection
    refused", or waits for a peer that dials elsewhere until the group's
    timeout (30 minutes by default). ``TORCHELASTIC_RESTART_COUNT`` cannot
    key a prefix: it counts one agent's restarts, and on several nodes the
    agents whose workers did not fail restart without counting.

    So rank 0 starts a new store on a free port and publishes its port and a
    random token in torchrun's store; the other ranks read that, connect,
    and check the token. A stale entry names a dead attempt's store, whose
    port refuses connections (its process is gone before torchrun starts
    the next attempt): they read again until the new entry is there. Without
    torchrun's store (SLURM's variables, or torchrun with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) rank 0 hosts the store at
    ``MASTER_PORT`` as env:// does, new for each start.
    """
    global _own_store
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return dist.TCPStore(
            addr, port, world_size, is_master=rank == 0, timeout=_remaining(deadline), wait_for_workers=False
        )
    agent = dist.TCPStore(addr, port, world_size, is_master=False, timeout=_remaining(deadline))
    if rank == 0:
        own = dist.TCPStore(addr, 0, world_size, is_master=True, timeout=_remaining(deadline), wait_for_workers=False)
        token = os.urandom(8).hex()
        own.set(_TOKEN_KEY, token)
        agent.set(_ATTEMPT_STORE_KEY, f"{own.port} {token}")
        _own_store = own
        return own
    while True:
        agent.set_timeout(_remaining(deadline))
        own_port, token = agent.get(_ATTEMPT_STORE_KEY).decode().split()
        if not _accepts_connections(addr, int(own_port)):
            # A dead attempt's store (its process is gone): quietly, before
            # TCPStore's client retries it for its whole timeout, logging each try.
            _remaining(deadline)
            time.sleep(0.2)
            continue
        try:
            try_for = min(_CONNECT_TRY_S, _remaining(deadline).total_seconds())
            own = dist.TCPStore(addr, int(own_port), world_size, is_master=False, timeout=datetime.timedelta(seconds=try_for))
            if own.check([_TOKEN_KEY]) and own.get(_TOKEN_KEY).decode() == token:
                own.set_timeout(_remaining(deadline))
                return own
        except RuntimeError:
            pass  # gone between the look and the connection, or not a store
        _remaining(deadline)
        time.sleep(0.2)


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=_CONNECT_TRY_S):
            return True
    except OSError:
        return False


def _exit_unjoined(rank: int, started: float, where: str, error: BaseException) -> None:
    """Ends a process that could not join its group, with one line and no
    traceback: ``os._exit``, since the C++ threads of a half-made group can
    keep the interpreter from ending."""
    print(
        f"error: rank {rank} waited {time.monotonic() - started:.0f} s for the process group's other ranks at {where} "
        f"and gave up ({one_line_error(error)}); exiting with status {GROUP_LOST_EXIT_CODE} so that the "
        "launcher can restart the group",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(GROUP_LOST_EXIT_CODE)


class _AgentWatch:
    """Ends a torchrun worker whose torchrun is gone (``kill -9`` of torchrun).

    A daemon thread looks at the parent's PID every second. When the parent
    changes (the worker was handed to init or a subreaper): before the group
    is joined, the worker exits with one line (the store it waits on was
    torchrun's); after, it sends itself SIGTERM, which the
    :class:`~treadle.hooks.PreemptionHandler` turns into a checkpoint at the
    ranks' next agreed step and exit status 75 (every orphan of that
    torchrun gets it, so they agree). A thread rather than prctl's parent-death
    signal: that one fires when the thread that started the worker ends, which
    in torchrun need not be the agent's end.
    """

    joined = False
    _thread: Optional[threading.Thread] = None

    @classmethod
    def start(cls) -> None:
        if cls._thread is not None or "TORCHELASTIC_RUN_ID" not in os.environ:
            return
        parent = os.getppid()
        cls._thread = threading.Thread(target=cls._watch, args=(parent,), name="treadle-agent-watch", daemon=True)
        cls._thread.start()

    @classmethod
    def _watch(cls, parent: int) -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        if not cls.joined:
            print(
                f"error: rank {os.environ.get('RANK', '?')}: torchrun (PID {parent}) ended before the process "
                f"group was formed; exiting with status {GROUP_LOST_EXIT_CODE}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(GROUP_LOST_EXIT_CODE)
        logger.warning("torchrun (PID %d) has ended: stopping this worker as after a SIGTERM.", parent)
        os.kill(os.getpid(), signal.SIGTERM)


def _run_in_env_group(main_func: Callable[..., Any], args: Sequence[Any], timeout: datetime.timedelta) -> None:
    join_env_process_group(timeout)
    _run_and_clean_up(main_func, args)


# How long a gloo process waits, after destroying its process group, before
# the interpreter may exit (see leave_process_group).
_GLOO_EXIT_GRACE_S = 0.2


def _run_and_clean_up(main_func: Callable[..., Any], args: Sequence[Any]) -> None:
    try:
        comm.synchronize()
        main_func(*args)
        # Ranks leave together: none tears its process group down while a
        # peer still works (rank 0 writing the last checkpoint, say).
        comm.synchronize()
    finally:
        # A clean exit: other ranks waiting in a collective are released by
        # the launcher (mp.spawn / torchrun), which ends them when one fails.
        leave_process_group()


def leave_process_group() -> None:
    """Destroys this process's group, if any, so that the process can exit cleanly."""
    if not dist.is_initialized():
        return
    global _own_store
    gloo = dist.get_backend() == dist.Backend.GLOO
    dist.destroy_process_group()
    _own_store = None
    if gloo:
        # destroy_process_group does not join gloo's worker threads. One
        # that frees the last reference to a finished collective's tensor
        # needs the GIL, and if the interpreter is exiting by then, the
        # process aborts ("terminate called without an active exception")
        # after the job succeeded. Seen on loaded machines; a moment with
        # the GIL released lets the threads finish.
        time.sleep(_GLOO_EXIT_GRACE_S)
