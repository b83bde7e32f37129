"""Restart trials: does a torchrun job survive one killed process?

Each trial starts a two-process job (gloo, CPU) under
``torchrun --standalone --nproc-per-node 2 --max-restarts 3`` (or, with
``--nodes 2``, two torchrun agents of one process each, met through a c10d
rendezvous on 127.0.0.1) and kills one process with SIGKILL at a random
moment; torchrun then ends the group and starts it again. Outcomes:

- **exact**: exit status 0, and the check of the job holds: for treadle
  (``tools/train_net.py --resume`` on the digits example,
  ``tests/dist_scripts/restart_faults.py``), ``model_final.pth`` bit-identical
  to an uninterrupted run's and ``metrics.json`` with the same rows, each
  iteration once; for the plain torch script
  (``tests/dist_scripts/plain_allreduce.py``, an all_reduce loop that starts
  over), the right final sum;
- **inexact**: exit status 0, the check fails;
- **failed**: a non-zero exit status (torchrun gave up);
- **hung**: still running after ``--bound`` seconds (its processes are killed).

A treadle trial whose process never reached its moment (nothing was killed)
is counted by its outcome and noted below the table.

treadle's moments, in turn: during a step, a periodic checkpoint save
(``train.checkpointer.format`` file and dcp, ``async_save`` off and on), an
evaluation, start-up, and the save of ``model_final``; the process killed
(rank 0 or 1), the iteration and the delay are drawn at random. The plain
script's process 1 dies at a random step; it runs with torch's own set-up
(``plain-torch``) and with treadle's (``plain+treadle``,
:func:`treadle.engine.launch.join_env_process_group`).

Run: ``python benchmarks/restart_trials.py --trials 20`` (``--systems``,
``--bound``, ``--nodes``, ``--seed``, ``--keep`` to change). Prints one row per
system and one per treadle moment.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
FAULTS_CONFIG = str(ROOT / "tests" / "dist_scripts" / "restart_faults.py")
PLAIN_SCRIPT = str(ROOT / "tests" / "dist_scripts" / "plain_allreduce.py")

SYSTEMS = ("treadle", "plain-torch", "plain+treadle")
# moment name -> (fault moment, checkpointer overrides)
MOMENTS: Dict[str, Tuple[str, Sequence[str]]] = {
    "step": ("step", ()),
    "save-file": ("save", ("train.checkpointer.format=file", "train.checkpointer.async_save=False")),
    "save-dcp": ("save", ("train.checkpointer.format=dcp", "train.checkpointer.async_save=False")),
    "save-file-async": ("save", ("train.checkpointer.format=file", "train.checkpointer.async_save=True")),
    "save-dcp-async": ("save", ("train.checkpointer.format=dcp", "train.checkpointer.async_save=True")),
    "eval": ("eval", ()),
    "startup": ("startup", ()),
    "final": ("final", ()),
}
PERIOD = 20
PLAIN_STEPS = 200


def treadle_overrides(max_iter: int) -> List[str]:
    """The short digits job of every trial (and of the uninterrupted run)."""
    return [
        f"train.max_iter={max_iter}",
        "lr_multiplier.warmup_iters=5",
        f"train.checkpointer.period={PERIOD}",
        "train.log_period=10",
        f"train.eval_period={max_iter // 2}",
        "train.dist_timeout=60",
    ]


def _env(fault: Optional[dict] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # What torchrun sets with several processes per node, and not with one:
    # the same for every layout, so that their weights are bit-identical.
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TREADLE_RESTART_FAULT", None)
    if fault is not None:
        env["TREADLE_RESTART_FAULT"] = json.dumps(fault)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_commands(script_and_args: Sequence[str], nodes: int = 1, max_restarts: int = 3) -> List[List[str]]:
    """The torchrun command line(s) of a two-process job: one agent, or one per "node"."""
    run = [sys.executable, "-m", "torch.distributed.run", f"--max-restarts={max_restarts}"]
    if nodes == 1:
        return [[*run, "--standalone", "--nproc-per-node=2", *script_and_args]]
    endpoint = f"127.0.0.1:{_free_port()}"
    return [
        [*run, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
         f"--rdzv-id=trial{os.getpid()}", f"--node-rank={node}", "--rdzv-conf=join_timeout=120", *script_and_args]
        for node in range(nodes)
    ]


def _descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_job(commands: Sequence[Sequence[str]], env: Dict[str, str], bound: float, log: Path) -> Optional[int]:
    """Runs the agents of one job; returns the exit status (the worst of the
    agents'), or None when they are still running after ``bound`` seconds
    (every process they started is then killed, by its PID)."""
    with open(log, "w") as out:
        agents = [subprocess.Popen(list(c), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT) for c in commands]
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and any(a.poll() is None for a in agents):
            time.sleep(0.2)
        if any(a.poll() is None for a in agents):
            for agent in agents:
                for pid in [*_descendants(agent.pid), agent.pid]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for agent in agents:
                agent.wait()
            return None
    codes = [a.returncode for a in agents]
    return next((c for c in codes if c != 0), 0)


def final_weights(output_dir: Path) -> Dict[str, "object"]:
    import torch

    return torch.load(output_dir / "model_final.pth", weights_only=True)["model"]


def metrics_rows(output_dir: Path) -> List[Tuple[int, Tuple[str, ...]]]:
    """(iteration, keys) of each row of metrics.json, in file order."""
    rows = []
    with open(output_dir / "metrics.json") as f:
        for line in f:
            row = json.loads(line)
            rows.append((row["iteration"], tuple(sorted(row))))
    return rows


def same_weights(a: Dict[str, "object"], b: Dict[str, "object"]) -> bool:
    import torch

    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def uninterrupted(workdir: Path, max_iter: int, nodes: int = 1) -> Path:
    """The run every treadle trial is compared with."""
    out = workdir / "uninterrupted"
    cmd = torchrun_commands([TRAIN_NET, "--config-file", FAULTS_CONFIG, *treadle_overrides(max_iter),
                             f"train.output_dir={out}"], nodes)
    status = run_job(cmd, _env(), 600, workdir / "uninterrupted.log")
    if status != 0:
        raise RuntimeError(f"the uninterrupted run exited with {status}; see {workdir / 'uninterrupted.log'}")
    return out


def treadle_fault(moment: str, rng: random.Random, max_iter: int, marker: Path) -> dict:
    kind, _ = MOMENTS[moment]
    fault = {"moment": kind, "rank": rng.randrange(2), "marker": str(marker), "delay": rng.uniform(0, 0.05)}
    if kind == "step":
        fault["at"] = rng.randrange(1, max_iter)
    elif kind == "save":
        fault["at"] = rng.randrange(1, max_iter // PERIOD)  # the periodic saves before the end
        # Half at a random time from the save's start, half at its publication.
        fault["delay"] = rng.choice([rng.uniform(0, 0.01), "publish"])
        if fault["delay"] == "publish":
            fault["rank"] = 0  # the one that writes in every format
    elif kind == "final":
        fault["rank"] = 0  # rank 0 writes model_final
        fault["delay"] = rng.choice([rng.uniform(0, 0.01), "publish"])
    elif kind == "eval":
        fault["at"] = rng.randrange(1, 3)
    elif kind == "startup":
        fault["delay"] = rng.uniform(0, 1.5)  # the short job trains within seconds of start-up
    return fault


def treadle_trial(
    workdir: Path, name: str, moment: str, rng: random.Random, max_iter: int, baseline: Path, bound: float, nodes: int = 1
) -> Tuple[str, dict]:
    """One killed treadle job; returns its outcome and the fault."""
    out = workdir / name
    fault = treadle_fault(moment, rng, max_iter, workdir / f"{name}.killed")
    cmd = torchrun_commands([TRAIN_NET, "--resume", "--config-file", FAULTS_CONFIG, *treadle_overrides(max_iter),
                             *MOMENTS[moment][1], f"train.output_dir={out}"], nodes)
    status = run_job(cmd, _env(fault), bound, workdir / f"{name}.log")
    fault["killed"] = os.path.exists(fault["marker"])
    if status is None:
        return "hung", fault
    if status != 0:
        return "failed", fault
    fault["differs"] = [what for what, same in (
        ("weights", same_weights(final_weights(out), final_weights(baseline))),
        ("metrics.json", metrics_rows(out) == metrics_rows(baseline)),
    ) if not same]
    return ("inexact" if fault["differs"] else "exact"), fault


def plain_trial(workdir: Path, name: str, setup: str, rng: random.Random, bound: float, nodes: int = 1) -> Tuple[str, dict]:
    """One plain torch job whose process 1 dies at a random step."""
    out = workdir / name
    out.mkdir()
    fault = {"kill_at": rng.randrange(PLAIN_STEPS)}
    # The group's timeout is torch's default (30 minutes), as a user's script has it.
    cmd = torchrun_commands([PLAIN_SCRIPT, str(out), "--steps", str(PLAIN_STEPS), "--kill-at", str(fault["kill_at"]),
                             "--setup", setup], nodes)
    status = run_job(cmd, _env(), bound, workdir / f"{name}.log")
    if status is None:
        return "hung", fault
    if status != 0:
        return "failed", fault
    result = (out / "result.txt").read_text().split()
    return ("exact" if int(result[0]) == 2 * PLAIN_STEPS else "inexact"), fault


OUTCOMES = ("exact", "inexact", "failed", "hung")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="trials per system")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--moments", nargs="+", choices=list(MOMENTS), default=list(MOMENTS), help="treadle's, in turn")
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--bound", type=float, default=300.0, help="seconds after which a trial counts as hung")
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default="", help="a folder to keep the runs and logs in")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="restart_trials_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"command: {' '.join([os.path.basename(sys.executable), 'benchmarks/restart_trials.py', *(argv if argv is not None else sys.argv[1:])])}")
    print(f"runs and logs in {workdir}", flush=True)
    counts: Dict[str, collections.Counter] = {s: collections.Counter() for s in args.systems}
    by_moment: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    baseline = uninterrupted(workdir, args.max_iter, args.nodes) if "treadle" in args.systems else None
    for i in range(args.trials):
        for system in args.systems:
            name = f"{system}-{i:03d}"
            started = time.monotonic()
            if system == "treadle":
                moment = args.moments[i % len(args.moments)]
                outcome, fault = treadle_trial(workdir, name, moment, rng, args.max_iter, baseline, args.bound, args.nodes)
                by_moment[moment][outcome] += 1
            else:
                moment = "step"
                setup = "torch" if system == "plain-torch" else "treadle"
                outcome, fault = plain_trial(workdir, name, setup, rng, args.bound, args.nodes)
            counts[system][outcome] += 1
            if not fault.get("killed", True):
                counts[system]["nothing killed"] += 1
            print(f"{name:20s} {moment:16s} {outcome:8s} {time.monotonic() - started:6.1f} s  {json.dumps(fault)}", flush=True)
    print()
    print(f"{'system':16s} {'trials':>6s} " + " ".join(f"{o:>7s}" for o in OUTCOMES))
    for system in args.systems:
        c = counts[system]
        print(f"{system:16s} {sum(c[o] for o in OUTCOMES):6d} " + " ".join(f"{c[o]:7d}" for o in OUTCOMES))
    unkilled = {s: c["nothing killed"] for s, c in counts.items() if c["nothing killed"]}
    if unkilled:
        print(f"trials in which the process to kill never reached its moment: {unkilled}")
    if by_moment:
        print()
        print(f"{'moment (treadle)':16s} {'trials':>6s} " + " ".join(f"{o:>7s}" for o in OUTCOMES))
        for moment in args.moments:
            c = by_moment[moment]
            if c:
                print(f"{moment:16s} {sum(c.values()):6d} " + " ".join(f"{c[o]:7d}" for o in OUTCOMES))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
