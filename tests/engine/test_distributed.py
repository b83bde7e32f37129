"""torch.distributed support, checked in-process with gloo process groups.

Each multi-process test spawns its workers with ``torch.multiprocessing``
(file:// rendezvous in the test's temporary directory) under a deadline, so a
hang fails the test instead of blocking the suite. Workers write what they saw
to JSON (or checkpoint) files; the assertions are made here, in the parent.
Jobs run through ``tools/train_net.py`` are in ``test_distributed_jobs.py``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch import nn

from treadle.checkpoint import Checkpointer
from treadle.data import InferenceSampler, TrainingSampler, build_test_loader, build_train_loader
from treadle.engine import EagerStep, StepBase, TrainerBase
from treadle.engine.data_parallel import create_fsdp_model
from treadle.engine.defaults import DefaultTrainer
from treadle.engine.launch import launch
from treadle.evaluation import build_evaluator, inference_on_dataset
from treadle.events import CommonMetricPrinter, CSVWriter, EventStorage, JSONWriter, ScalarKind, TensorboardWriter
from treadle.events.distributed import ScalarMismatchError, reduce_across_ranks
from treadle.hooks import EvalHook, IterationTimer, LRScheduler, PeriodicWriter
from treadle.utils import comm

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "dist_scripts"
DEADLINE = 120  # seconds for any group of processes started here


# ---------------------------------------------------------------------------- helpers
def _spawn(fn, nprocs: int, *args) -> None:
    """Runs ``fn(rank, *args)`` in ``nprocs`` spawned processes; fails after DEADLINE seconds.

    A worker that raises fails the test with its traceback (torch re-raises it here).
    """
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"{nprocs} processes of {fn.__name__} did not finish within {DEADLINE}s (a hang)")


@contextlib.contextmanager
def _process_group(rank: int, world: int, tmp: str):
    """A gloo group for the block; left as ``launch`` leaves it (see ``_run_and_clean_up``)."""
    # A short collective timeout: a mismatched collective fails the worker, not the suite.
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()
        time.sleep(0.2)  # gloo's threads release their last buffers before the interpreter exits


def _dump(tmp: str, rank: int, data) -> None:
    with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
        json.dump(data, f)


def _load_ranks(tmp: Path, world: int):
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


# ---------------------------------------------------------------------------- comm
def test_comm_without_process_group_is_a_world_of_one():
    assert not comm.is_distributed()
    assert (comm.get_world_size(), comm.get_rank(), comm.get_local_rank(), comm.get_local_size()) == (1, 0, 0, 1)
    assert comm.is_main_process()
    comm.synchronize()  # returns at once
    obj = {"a": [1, 2]}
    assert comm.all_gather(obj) == [obj]
    assert comm.gather(obj) == [obj]
    assert comm.broadcast_object(obj) is obj
    t = torch.tensor([1.0, 2.0])
    assert comm.all_gather_tensor(t)[0] is t
    values = {"b": torch.tensor(2.0), "a": torch.tensor(1.0)}
    assert comm.reduce_dict(values) == values
    entries = [("loss", torch.tensor(3.0), ScalarKind.LOSS)]
    assert [float(v) for v in reduce_across_ranks(entries)] == [3.0]


def _comm_worker(rank: int, tmp: str) -> None:
    world = 2
    with _process_group(rank, world, tmp):
        out = {
            "world": comm.get_world_size(),
            "rank": comm.get_rank(),
            # Not set by a bare init_process_group: one machine is assumed.
            "local_rank": comm.get_local_rank(),
            "main": comm.is_main_process(),
        }
        # Barrier: rank 1 writes a file before it; rank 0 looks for it after.
        flag = os.path.join(tmp, "written-before-barrier")
        if rank == 1:
            time.sleep(0.5)
            with open(flag, "w") as f:
                f.write("1")
        comm.synchronize()
        out["file_seen_after_barrier"] = os.path.exists(flag)
        out["all_gather"] = comm.all_gather({"rank": rank, "items": list(range(rank + 1))})
        out["all_gather_tensor"] = [t.tolist() for t in comm.all_gather_tensor(torch.tensor([rank, 10 * rank]))]
        out["gather"] = comm.gather(f"r{rank}", dst=0)
        # Built in a different key order on each rank: keys are matched by name.
        items = [("b", torch.tensor(rank + 1.0)), ("a", torch.tensor(10.0 * rank))]
        values = dict(items if rank == 0 else items[::-1])
        out["reduce_mean"] = {k: float(v) for k, v in comm.reduce_dict(values).items()}
        out["reduce_sum"] = {k: float(v) for k, v in comm.reduce_dict(values, average=False).items()}
        out["broadcast"] = comm.broadcast_object(f"from rank {rank}")
        np.random.seed(100 + rank)  # different local generators, one shared seed
        out["shared_seed"] = comm.shared_random_seed()

        # The storage's reducer: means, and maxima for times.
        entries = [
            ("total_loss", torch.tensor(1.0 + rank), ScalarKind.LOSS),
            ("time", torch.tensor(0.1 * (rank + 1), dtype=torch.float64), ScalarKind.TIME),
            ("lr", torch.tensor(0.5), None),
        ]
        out["reduced"] = [float(v) for v in reduce_across_ranks(entries)]
        # Different names, then a different number of scalars: both a clear error on every rank.
        for label, names in (("renamed", ["a", "b" if rank == 0 else "c"]), ("extra", ["a", "b"] + ["c"] * rank)):
            try:
                reduce_across_ranks([(n, torch.tensor(1.0), None) for n in names])
                out[label] = "no error"
            except ScalarMismatchError as e:
                out[label] = str(e)
        _dump(tmp, rank, out)


def test_comm_with_two_gloo_processes(tmp_path):
    _spawn(_comm_worker, 2, str(tmp_path))
    r0, r1 = _load_ranks(tmp_path, 2)
    assert [(r["world"], r["rank"], r["local_rank"], r["main"]) for r in (r0, r1)] == [(2, 0, 0, True), (2, 1, 1, False)]
    assert r0["file_seen_after_barrier"] is True
    gathered = [{"rank": 0, "items": [0]}, {"rank": 1, "items": [0, 1]}]
    assert r0["all_gather"] == r1["all_gather"] == gathered
    assert r0["all_gather_tensor"] == r1["all_gather_tensor"] == [[0, 0], [1, 10]]
    assert (r0["gather"], r1["gather"]) == (["r0", "r1"], [])
    assert r0["reduce_mean"] == r1["reduce_mean"] == {"a": 5.0, "b": 1.5}
    assert r0["reduce_sum"] == r1["reduce_sum"] == {"a": 10.0, "b": 3.0}
    assert r0["broadcast"] == r1["broadcast"] == "from rank 0"
    assert r0["shared_seed"] == r1["shared_seed"]
    assert r0["reduced"] == r1["reduced"] == pytest.approx([1.5, 0.2, 0.5])
    for r in (r0, r1):
        assert "Ranks published different scalars" in r["renamed"] and "'c'" in r["renamed"]
        assert "Ranks published different scalars" in r["extra"] and "['a', 'b', 'c']" in r["extra"]


def test_reduce_across_ranks_on_one_process_reads_every_kind_of_value_in_order():
    # Numbers and tensors of several shapes and dtypes, interleaved: packed by
    # kind of value, then read back in entry order.
    entries = [
        ("a", 1.0, None),
        ("b", torch.tensor([2.5]), ScalarKind.LOSS),
        ("c", torch.tensor(3), None),
        ("d", 4.0, ScalarKind.TIME),
        ("e", torch.tensor(0.1, dtype=torch.float64), None),
        ("f", torch.tensor([[6.0]], dtype=torch.bfloat16), None),
        ("b", torch.tensor(7.5), ScalarKind.LOSS),
    ]
    reduced = reduce_across_ranks(entries)
    assert reduced == [1.0, 2.5, 3.0, 4.0, 0.1, 6.0, 7.5]
    assert all(type(v) is float for v in reduced)


def _mixed_reduce_worker(rank: int, tmp: str, older_torch: bool) -> None:
    if older_torch and hasattr(dist, "all_gather_single"):
        del dist.all_gather_single  # as on torch 2.11, which has only all_gather_into_tensor
    with _process_group(rank, 2, tmp):
        # One name may be a number on one rank and a tensor (of another shape
        # or dtype) on the other: values still meet by position.
        entries = [
            ("total_loss", torch.tensor(1.0 + rank), ScalarKind.LOSS),
            ("time", 0.1 if rank == 0 else torch.tensor([0.3], dtype=torch.float64), ScalarKind.TIME),
            ("lr", 0.5, None),
            ("total_loss", torch.tensor([[3.0 + rank]]), ScalarKind.LOSS),
            ("data_time", float(rank), ScalarKind.TIME),
            ("grad_norm", 4.0 if rank == 0 else torch.tensor(2.0, dtype=torch.bfloat16), None),
        ]
        out = {"reduced": reduce_across_ranks(entries)}
        # Through the storage, as the trainer installs it.
        with EventStorage(0) as s:
            s.reducer = reduce_across_ranks
            for it in range(3):
                s.iter = it
                s.put_scalar("total_loss", torch.tensor(float(it + rank)), kind=ScalarKind.LOSS)
                s.put_scalar("time", 0.1 * (rank + 1) * (it + 1), kind=ScalarKind.TIME)
                s.put_scalar("lr", 0.01)
            s.flush()
            out["histories"] = {name: s.history(name).values() for name in ("total_loss", "time", "lr")}
        _dump(tmp, rank, out)


@pytest.mark.parametrize("older_torch", [False, True], ids=["this_torch", "torch_without_all_gather_single"])
def test_reduce_across_ranks_with_numbers_and_tensors_mixed_over_two_gloo_processes(tmp_path, older_torch):
    _spawn(_mixed_reduce_worker, 2, str(tmp_path), older_torch)
    r0, r1 = _load_ranks(tmp_path, 2)
    assert r0["reduced"] == r1["reduced"] == pytest.approx([1.5, 0.3, 0.5, 3.5, 1.0, 3.0])
    for r in (r0, r1):
        histories = r["histories"]
        assert histories["total_loss"] == [[it + 0.5, it] for it in range(3)]
        assert histories["time"] == [[pytest.approx(0.2 * (it + 1)), it] for it in range(3)]  # the slower rank's
        assert histories["lr"] == [[0.01, it] for it in range(3)]


# ---------------------------------------------------------------------------- launch
@pytest.fixture
def no_torchrun_env(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


def _never_called() -> None:
    raise AssertionError("launch ran the job despite invalid arguments")


@pytest.mark.parametrize("url", ["auto", None, ""])
def test_launch_on_several_machines_needs_an_address(no_torchrun_env, url):
    with pytest.raises(ValueError, match=r"only works on one machine.*--dist-url tcp://"):
        launch(_never_called, 2, num_machines=2, machine_rank=0, dist_url=url)


def test_launch_rejects_bad_process_counts(no_torchrun_env):
    with pytest.raises(ValueError, match=r"machine_rank must be in \[0, 2\), got 2"):
        launch(_never_called, 1, num_machines=2, machine_rank=2, dist_url="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="must be >= 1"):
        launch(_never_called, 0)


def test_launch_spawns_gloo_processes_on_cpu(tmp_path):
    """``launch(main, 2)`` on a CPU machine: two gloo processes with torchrun's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "report_env.py"), str(tmp_path), "--num-gpus", "2"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=DEADLINE,
    )
    assert result.returncode == 0, result.stderr
    reports = _load_ranks(tmp_path, 2)
    for rank, report in enumerate(reports):
        assert report == {
            "rank": rank, "world": 2, "local_rank": rank, "local_size": 2, "backend": "gloo",
            "env_rank": str(rank), "gathered": [0, 1],
        }


_FAILING_JOB = """
import torch
from treadle.engine import launch
from treadle.trainer import Trainer


def main():
    data = [(torch.randn(3), torch.tensor(1)) for _ in range(20)]
    Trainer(torch.nn.Linear(3, 2), "sgd", data, lr=0.1, loss_fn=torch.nn.functional.cross_entropy, max_iter=3,
            total_batch_size=5)


if __name__ == "__main__":
    launch(main, 2)
"""


def test_an_error_in_a_launched_worker_is_one_line_with_its_traceback_in_a_file(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_FAILING_JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, str(script)], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=DEADLINE)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert re.fullmatch(
        r"error: process [01] of the job failed: ValueError: total_batch_size=5 is not divisible by the world size 2"
        r": .* \(traceback in (.+)\)", lines[0]), lines[0]
    saved = Path(re.search(r"traceback in (.+)\)$", lines[0]).group(1))
    assert saved.parent == tmp_path and "Traceback (most recent call last)" in saved.read_text()


# ---------------------------------------------------------------------------- wrap_model options
def _cfg(**ddp):
    return OmegaConf.create({"train": {"ddp": ddp, "ema": {"enabled": False}}})


def _wrap(cfg, model):
    # wrap_model reads only its arguments: no need to build a whole trainer.
    return DefaultTrainer.wrap_model(object.__new__(DefaultTrainer), cfg, model)


def test_wrap_model_checks_its_options_on_one_process():
    model = nn.Linear(2, 2)
    assert _wrap(_cfg(kind="fsdp", broadcast_buffers=False, find_unused_parameters=False), model) is model
    with pytest.raises(ValueError, match="train.ddp.kind must be 'ddp' or 'fsdp', got 'zero3'"):
        _wrap(_cfg(kind="zero3"), model)
    with pytest.raises(ValueError, match="train.ddp.find_unused_parameters is an option of DistributedDataParallel"):
        _wrap(_cfg(kind="fsdp", find_unused_parameters=True), model)
    with pytest.raises(ValueError, match="param_dtype must be one of .*'bf16'.* got 'bf17'"):
        _wrap(_cfg(kind="fsdp", param_dtype="bf17"), model)
    with pytest.raises(TypeError, match="bucket_size"):
        _wrap(_cfg(kind="fsdp", bucket_size=25), model)
    cfg = _cfg(kind="fsdp")
    cfg.train.ema.enabled = True
    with pytest.raises(ValueError, match="train.ema.enabled=True is not supported with train.ddp.kind='fsdp'"):
        _wrap(cfg, model)


# ---------------------------------------------------------------------------- collectives per iteration
_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object", "broadcast",
    "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
    "all_to_all", "all_to_all_single",
)
MAX_ITER, WRITER_PERIOD = 23, 5


class _Regression(torch.utils.data.Dataset):
    def __init__(self, n: int = 64):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.randn(4, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _counting_worker(rank: int, tmp: str, older_torch: bool) -> None:
    if older_torch and hasattr(dist, "all_gather_single"):
        del dist.all_gather_single  # as on torch 2.11
    with _process_group(rank, 2, tmp):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = build_train_loader(_Regression(), total_batch_size=8)
        trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.mse_loss))
        writers = [JSONWriter(os.path.join(tmp, "metrics.json"))] if rank == 0 else []
        trainer.register_hooks([
            IterationTimer(),
            LRScheduler(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)),
            PeriodicWriter(writers, period=WRITER_PERIOD),
        ])
        calls = []
        # Only the collectives this torch has (all_gather_single is 2.13's).
        originals = {name: getattr(dist, name) for name in _COLLECTIVES if hasattr(dist, name)}

        def counted(name, fn):
            def call(*args, **kwargs):
                calls.append([name, trainer.storage.iter])
                return fn(*args, **kwargs)
            return call

        for name, fn in originals.items():
            setattr(dist, name, counted(name, fn))
        try:
            trainer.train(0, MAX_ITER)
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)
        _dump(tmp, rank, {"calls": calls})


@pytest.mark.parametrize("older_torch", [False, True], ids=["this_torch", "torch_without_all_gather_single"])
def test_collectives_happen_only_at_flushes(tmp_path, older_torch):
    """Python-level ``torch.distributed`` collectives, counted by ``storage.iter``
    during a 2-rank DDP run with a timer, an LR scheduler and a writer.

    DDP's gradient all-reduce runs inside its C++ reducer and is not counted
    here (nor is anything that calls the C++ bindings directly): the test is
    about what treadle adds around the step. The storage's reducer gathers
    twice per flush (names and count, then values; the names alone when
    nothing is pending); every other iteration must see no collective at all.
    """
    _spawn(_counting_worker, 2, str(tmp_path), older_torch)
    flushes = [it for it in range(MAX_ITER) if (it + 1) % WRITER_PERIOD == 0 or it == MAX_ITER - 1]
    assert flushes == [4, 9, 14, 19, 22]
    gather = "all_gather_single" if hasattr(dist, "all_gather_single") and not older_torch else "all_gather_into_tensor"
    expected = [[name, it] for it in flushes for name in [gather] * 2]
    # The final flush of after_train has nothing left to resolve, but every
    # rank still meets the others there: the header gather only.
    expected.append([gather, MAX_ITER])
    for report in _load_ranks(tmp_path, 2):
        assert report["calls"] == expected
    # The main process alone wrote, once per flush.
    lines = (tmp_path / "metrics.json").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == flushes


def _same_writers_worker(rank: int, tmp: str) -> None:
    """A plain ``TrainerBase`` script as a user writes it: the same writers on every rank, no guard."""
    with _process_group(rank, 2, tmp):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = build_train_loader(_Regression(), total_batch_size=8)
        trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.mse_loss))
        out = os.path.join(tmp, "out")
        lines: list = []
        printed = logging.getLogger("treadle.events.printer")
        printed.setLevel(logging.INFO)
        printed.addHandler(_ListHandler(lines))
        trainer.register_hooks([PeriodicWriter([
            CommonMetricPrinter(MAX_ITER),
            JSONWriter(os.path.join(out, "metrics.json"), window_size=1),
            CSVWriter(os.path.join(out, "metrics.csv"), window_size=1),
            TensorboardWriter(out),
        ], period=WRITER_PERIOD)])
        trainer.train(0, MAX_ITER)
        losses = trainer.storage.history("total_loss").values()
        _dump(tmp, rank, {"losses": losses, "printed": lines})


class _ListHandler(logging.Handler):
    def __init__(self, lines: list) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_same_writers_on_every_rank_write_each_row_once(tmp_path):
    """A script that gives every rank the same writers: metrics.json, metrics.csv
    and the event file hold each flush's row once, the main process's values,
    and only the main process prints."""
    _spawn(_same_writers_worker, 2, str(tmp_path))
    r0, r1 = _load_ranks(tmp_path, 2)
    flushes = [4, 9, 14, 19, 22]
    out = tmp_path / "out"
    rows = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == flushes
    main_losses = dict((it, v) for v, it in r0["losses"])
    assert [row["total_loss"] for row in rows] == [main_losses[it] for it in flushes]
    csv_lines = (out / "metrics.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in csv_lines] == ["iteration"] + [str(it) for it in flushes]
    assert len(list(out.glob("events.out.tfevents.*"))) == 1
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("events.")) == ["metrics.csv", "metrics.json"]
    assert len([line for line in r0["printed"] if "iter: " in line]) == len(flushes)
    assert r1["printed"] == []


# ---------------------------------------------------------------------------- samplers, evaluation
WORLD3 = 3


class _Classification(torch.utils.data.Dataset):
    def __init__(self, n: int = 10):
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 3, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class _Argmax(nn.Module):
    def forward(self, x):
        return x


class _PutLoss(StepBase):
    def run_step(self):
        self.storage.put_scalar("total_loss", torch.tensor(1.0), kind=ScalarKind.LOSS)


def _sharding_worker(rank: int, tmp: str) -> None:
    with _process_group(rank, WORLD3, tmp):
        out = {}
        sampler = TrainingSampler(10, shuffle=True, seed=3, start=4)
        stream = sampler.iter_with_positions()
        out["training"] = [next(stream) for _ in range(9)]  # 27 positions over 3 ranks: crosses epochs
        out["inference"] = list(InferenceSampler(10))
        # A train loader's step k holds the global positions [kT, (k+1)T) over all ranks.
        loader = iter(build_train_loader(_Classification(), total_batch_size=6, seed=1))
        out["train_batches"] = [next(loader)[0].tolist() for _ in range(3)]

        test_loader = build_test_loader(_Classification(), batch_size=3)
        out["test_batches"] = len(test_loader)
        out["results"] = inference_on_dataset(_Argmax(), test_loader, build_evaluator(["accuracy", "loss"], loss_fn=nn.functional.cross_entropy))

        evals = []

        def evaluate():
            evals.append(trainer.iter)
            return inference_on_dataset(_Argmax(), build_test_loader(_Classification(), batch_size=3), build_evaluator(["accuracy"]))

        trainer = TrainerBase(_PutLoss())
        trainer.register_hooks([EvalHook(3, evaluate), PeriodicWriter([], period=2)])
        trainer.train(0, 7)
        out["eval_iters"] = evals
        out["stored_accuracy"] = trainer.storage.history("accuracy").values()
        _dump(tmp, rank, out)


def test_sharding_and_evaluation_over_three_processes(tmp_path):
    _spawn(_sharding_worker, WORLD3, str(tmp_path))
    ranks = _load_ranks(tmp_path, WORLD3)

    # TrainingSampler: rank r takes positions start + r, start + r + 3, ...; together, the global stream.
    single = TrainingSampler(10, shuffle=True, seed=3, start=4, rank=0, world_size=1).iter_with_positions()
    expected = [next(single) for _ in range(27)]
    merged = sorted(tuple(p) for r in ranks for p in r["training"])
    assert merged == [tuple(p) for p in expected]
    for rank, r in enumerate(ranks):
        assert [p for p, _ in r["training"]] == list(range(4 + rank, 4 + 27, 3))

    # InferenceSampler: contiguous shards, every index exactly once, the first rank one longer.
    assert [r["inference"] for r in ranks] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]

    # Train loader: over the ranks, each step is the next 6 positions of the global stream.
    data = _Classification()
    one_rank = iter(build_train_loader(data, total_batch_size=6, seed=1, rank=0, world_size=1))
    for step in range(3):
        whole = sorted(next(one_rank)[0].tolist())
        assert sorted(x for r in ranks for x in r["train_batches"][step]) == whole

    # inference_on_dataset: shards reduced to the whole dataset's results, on every rank.
    assert [r["test_batches"] for r in ranks] == [2, 1, 1]
    logits, labels = data.x, data.y
    accuracy = (logits.argmax(1) == labels).double().mean().item()
    loss = nn.functional.cross_entropy(logits.double(), labels).item()
    for r in ranks:
        assert r["results"]["accuracy"] == pytest.approx(accuracy, abs=1e-12)
        assert r["results"]["loss"] == pytest.approx(loss, rel=1e-6)

    # EvalHook runs on every rank at the same iterations (2, 5, then the last one, 6,
    # whose results are put at 7: iterations run).
    for r in ranks:
        assert r["eval_iters"] == [2, 5, 6]
        assert r["stored_accuracy"] == [[pytest.approx(accuracy), it] for it in (2, 5, 7)]


# ---------------------------------------------------------------------------- FSDP2
class _Tied(nn.Module):
    """Blocks in a ModuleList and an embedding tied to the output layer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor(1.0))

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x * self.scale)


def _batches(step: int):
    """The same global batch for every world size: 8 token ids and targets."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 6, (8,), generator=g), torch.randint(0, 6, (8,), generator=g)


def _train(model, optimizer, steps, rank, world, first_step=0):
    for step in range(first_step, first_step + steps):
        ids, targets = _batches(step)
        ids, targets = ids[rank::world], targets[rank::world]
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(ids), targets).backward()
        optimizer.step()


def _new(seed: int):
    torch.manual_seed(seed)
    model = _Tied()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def _fsdp_worker(rank: int, tmp: str) -> None:
    from torch.distributed.fsdp import FSDPModule

    with _process_group(rank, 2, tmp):
        out = {}
        # Seeds differ by rank, as default_setup's do: sync_module_states makes rank 0's weights everyone's.
        model, _ = _new(seed=rank)
        model = create_fsdp_model(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        out["sharded"] = sorted(n for n, m in model.named_modules() if isinstance(m, FSDPModule))
        _train(model, optimizer, 3, rank, 2)
        # The "file" format (the default under FSDP is "dcp", see tests/checkpoint/test_dcp_distributed.py).
        checkpointer = Checkpointer(model, os.path.join(tmp, "fsdp"), format="file", optimizer=optimizer)
        out["saved"] = checkpointer.save("after3", iteration=2)  # every rank calls; rank 0 writes

        # A plain model's checkpoint (written by the test) into a fresh FSDP model, then 2 more steps.
        fresh, _ = _new(seed=50 + rank)
        fresh = create_fsdp_model(fresh)
        fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        loader = Checkpointer(fresh, os.path.join(tmp, "fsdp-resumed"), format="file", optimizer=fresh_opt)
        extra = loader.load(os.path.join(tmp, "plain", "after3.pth"))
        out["extra"] = extra
        _train(fresh, fresh_opt, 2, rank, 2, first_step=3)
        loader.save("after5")
        _dump(tmp, rank, out)


def test_fsdp_checkpoints_are_plain_and_load_both_ways(tmp_path):
    """FSDP2 over two gloo processes: a "file" checkpoint holds the full state in the
    plain format (it loads into an unwrapped model and optimizer), and a plain
    checkpoint loads into an FSDP model and optimizer (training continues as
    the plain model does)."""
    # The reference: one process, the whole batch.
    plain, plain_opt = _new(seed=0)
    _train(plain, plain_opt, 3, 0, 1)
    Checkpointer(plain, str(tmp_path / "plain"), optimizer=plain_opt).save("after3", iteration=2)

    _spawn(_fsdp_worker, 2, str(tmp_path))
    r0, r1 = _load_ranks(tmp_path, 2)
    # Blocks inside the ModuleList are their own groups; the tied embedding/head stay with the root.
    assert r0["sharded"] == ["", "blocks.0", "blocks.1"]
    assert r0["saved"] == str(tmp_path / "fsdp" / "after3.pth") and r1["saved"] is None
    assert r0["extra"] == r1["extra"] == {"iteration": 2}
    assert sorted(os.listdir(tmp_path / "fsdp")) == ["after3.pth", "last_checkpoint"]

    # The FSDP checkpoint, read as plain data, is the plain run's state to float tolerance.
    fsdp = torch.load(tmp_path / "fsdp" / "after3.pth", weights_only=True)
    want = torch.load(tmp_path / "plain" / "after3.pth", weights_only=True)
    assert list(fsdp["model"]) == list(want["model"])
    for key, value in want["model"].items():
        torch.testing.assert_close(fsdp["model"][key], value, rtol=0, atol=1e-6)
    assert fsdp["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert sorted(fsdp["optimizer"]["state"]) == sorted(want["optimizer"]["state"]) == list(range(5))
    for index, state in want["optimizer"]["state"].items():
        torch.testing.assert_close(fsdp["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"], rtol=0, atol=1e-6)

    # It loads into a plain model and optimizer (the Checkpointer's own path).
    model, optimizer = _new(seed=9)
    Checkpointer(model, "", optimizer=optimizer).load(str(tmp_path / "fsdp" / "after3.pth"))
    for key, value in model.state_dict().items():
        assert torch.equal(value, fsdp["model"][key])

    # The plain checkpoint loaded into FSDP, trained 2 more steps: as the plain model trained 2 more.
    _train(plain, plain_opt, 2, 0, 1, first_step=3)
    resumed = torch.load(tmp_path / "fsdp-resumed" / "after5.pth", weights_only=True)
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=0, atol=1e-6)
    assert resumed["model"]["scale"].item() == 1.0
