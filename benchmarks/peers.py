"""treadle's per-iteration overhead beside a hand-written loop and its peers.

The same workload for everyone: an MLP on random data whose hand-written
step takes ~0.3-0.5 ms on one intra-op thread (``--width 128``; ``--width
4096`` gives ~2.5-3 ms; the time depends on the host), SGD with momentum,
cross-entropy, the same 64-sample batches in the same order from one
``DataLoader`` (a pre-made batch per index), ``--iters`` iterations.

Systems, each run in its own process, in interleaved rounds:

- ``hand``: a hand-written loop over the DataLoader;
- ``hand-recorded``: the same loop keeping what the bare engine records for
  its writers: each iteration's detached loss, its data-loading time and
  its duration;
- ``treadle-bare``: ``TrainerBase(EagerStep(...))``, ``register_hooks([])``;
- ``treadle-hooks``: ``IterationTimer`` and ``PeriodicWriter`` every 20
  iterations with ``CommonMetricPrinter``, ``JSONWriter`` and
  ``TensorboardWriter``, the console set up by ``setup_logger()`` (as
  detectron2's ``default_setup`` does; without it no handler would print
  the status lines);
- ``treadle-schedule``: ``treadle-bare`` with the ``LRScheduler`` hook of
  detectron2's default config (a cosine fvcore schedule with a linear
  warm-up, an ``LRMultiplier``): what a schedule costs (its weights are
  not the hand loop's, which has a constant rate);
- ``treadle-tour``: the README tour's loop (``### The loop``):
  ``EagerStep(..., clip_grad_norm=1.0)`` with
  ``IterationTimer``, ``LRScheduler`` (a torch ``CosineAnnealingLR``) and
  ``PeriodicWriter`` every 20 iterations with ``CommonMetricPrinter`` and
  ``JSONWriter``: what a reader of the README runs (its weights are not
  the hand loop's: clipping and a schedule);
- ``treadle-trainer``: the plain ``Trainer(...)`` with an ``output_dir``
  (its default hooks and writers: timer, LR schedule, checkpoint at the
  end, JSON and TensorBoard, console lines, run summary);
- the peers, when installed (``pip install -c constraints.txt -e ".[bench]"``;
  never a CI dependency): ``ignite`` (``create_supervised_trainer``, no
  handlers), ``accelerate`` (a loop prepared by Hugging Face's
  ``Accelerator``), ``mmengine`` / ``mmengine-log`` (``Runner`` with its
  default hooks, without / with its logger every 20 iterations),
  ``pytorch-accelerated`` / ``pytorch-accelerated-default`` (its
  ``Trainer`` with no callbacks but the device one / with its default
  callbacks), ``lightning`` / ``lightning-log`` (``Trainer`` without
  logger, progress bar and checkpoints / with ``self.log`` every step and
  its TensorBoard logger every 20).

What is timed: the steady state. The dataset stamps the clock when the
loader fetches batch ``iters // 10`` and the last batch, so the time per
iteration covers the iterations between, writer flushes included, and
leaves out each system's start (Lightning's setup, the first iterations)
and end (a final checkpoint); ``end-to-end`` is the whole ``fit``/``train``
call divided by ``--iters``. treadle's ``TensorboardWriter`` hands its rows
to TensorBoard's file writer every 10 seconds, which a default run does
not last: that cost (``benchmarks/flush.py``'s last row) is in the
``--instructions`` counts, where valgrind's slower clock brings it inside
the stretch, and not in the times. Each system is built, and the garbage its
start left collected (``gc.collect()``), before the clock starts: otherwise
the first collection of Python's younger generations walks the start's
objects inside the stretch, a one-off cost of up to ~10 ms. Each process
times a hand-written loop over pre-built batches (the reference) and its
system alternately, twice each, and keeps the fastest of each; ``ratio`` is
system / reference in that process, so a machine that drifts between
processes does not bias it. The
table shows medians over the rounds with the middle half of the rounds'
ratios (``ratio-IQR``: the noise a difference is read against), the added
microseconds per iteration, whether the final weights are bit-identical to
the hand-written loop's, and the peak resident memory against the ``hand``
process's.

``--paired`` answers the narrower question of what a system adds to the
hand-written loop over the same ``DataLoader``: each process trains
``hand`` and the system alternately, ``--pairs`` times each (which goes
first alternates too), so that the times compared are taken seconds
apart in one process. Each process keeps the fastest run of each (the
host only ever slows a run down) and their difference; the table gives, per system, the median over the ``--rounds`` processes
of the added microseconds per iteration, the middle half of them, and the
median ratio to ``hand``. A difference of two medians from separate
processes (the main table's ``+us/it`` rows) carries the noise of both
processes and of the reference loop each is divided by; this one, the
seconds between runs in one process only.

``--interleaved`` times what a system adds at a step long enough that
runs minutes or seconds apart differ by more than the overhead (a ~3 ms
step on a shared host): in each process ``hand`` and the system train at
once, each in a thread of its own (the main thread only waits), both
pinned to one CPU, an iteration each in turn (a loop's batch fetch hands
the turn over), so that the two iterations
compared are taken milliseconds apart. Each iteration is timed from its
batch's return to its next fetch. Per phase of the writers' period
(iteration ``i % 20``; a flush falls in one phase, and what it costs the
iterations after it falls in the next), the median difference over the
process's steady stretch; their mean is the process's figure, flushes
included. Which loop takes the first turn alternates between processes
(going first is worth a steady few tens of microseconds at a long step),
and the table gives the mean of the two orders' means with its standard
error, each order's from its own processes' spread: a process's layout in
memory moves its figure by tens of microseconds, which only more
processes average out. The steady stretch starts after ``--warmup``
iterations (a tenth of ``--iters`` by default): at a ~3 ms step the heap
settles over the first few hundred (in one process looked at, the bare
engine's grew once, by ~20 MB, between its iterations 200 and 300).
``hand`` in ``--systems`` is the control (the loop
against itself: zero, within its standard error), and ``hand-plus-30us``
(the loop with 30 us of busy waiting per iteration, run only when named)
the check that the method finds a difference of that size.

``--calls`` counts instead the Python and C functions each system calls per
iteration over the same stretch (``sys.setprofile``, one process each): a
figure a busy machine does not move; and, of them, the calls of treadle's own
Python functions (code under ``treadle/``): what a change to treadle adds or
removes per iteration, the peers' and torch's calls aside. ``--instructions`` counts the machine
instructions each system executes per iteration over that stretch, the
reference included, under valgrind's callgrind (one process each, side by
side; minutes: valgrind runs ~50x slower): what noise does not move
either, at any step size (``--width 4096``). Instructions, not time: cache
misses and branch mispredictions are not in it. With ``--cache-sim``
valgrind simulates the caches as well (L1i and L1d of 32 KiB, an L2 of 512
KiB) and the table adds each system's misses per iteration and callgrind's
cycle estimate from them: the misses the step's eviction of the loop's code
and data causes, still without the host's noise. The estimate weighs every
miss alike, where a step's streaming misses are mostly hidden by the
prefetchers and a loop's pointer-chasing ones are not. ``--profiles DIR`` keeps
each system's profile of the stretch, for ``callgrind_annotate``.

``--jobs N`` runs N measured processes at once (``--paired``, ``--interleaved`` and the main
table), each pinned to one logical CPU of a physical core of its own, the
core's other hardware threads left idle: on a many-core machine (a GPU
server's 16 cores, say) a table takes a fraction of the time, and a pinned
process is not moved between cores by the scheduler. The processes still
share the last-level cache and memory bandwidth; read the figures beside a
``--jobs 1`` run before trusting a small difference.

Every system's ``train`` (and the reference) is called with room on
CPython's frame stack (``treadle.utils.frame_stack.call_with_frame_room``,
which treadle's own loops use): on CPython 3.11 to 3.13.0 a loop that happens
to sit just below a 16 KiB chunk of that stack maps and unmaps a chunk at
every step, which would make a system's figure depend on how deep this
script calls it rather than on its code (``benchmarks/frame_depth.py``).
Each measured process also keeps a steady heap (``STEADY_HEAP``).

Console output of every system goes to ``os.devnull`` through its usual
path (``logging``, ``print``, progress bars): formatting a line is paid for,
a terminal is not.

Run: ``python benchmarks/peers.py`` (``--rounds 7``, ``--iters 2000``,
``--width``, ``--systems``, ``--paired``, ``--pairs``, ``--interleaved``, ``--jobs``, ``--calls``,
``--instructions``, ``--cache-sim``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

from treadle.utils.frame_stack import call_with_frame_room

TREADLE = ["treadle-bare", "treadle-hooks", "treadle-schedule", "treadle-tour", "treadle-trainer"]
PEERS = ["ignite", "accelerate", "mmengine", "mmengine-log", "pytorch-accelerated", "pytorch-accelerated-default",
         "lightning", "lightning-log"]
SYSTEMS = ["hand", "hand-recorded", *TREADLE, *PEERS]
# Not run unless named: the hand-written loop made 30 us per iteration
# slower, to check that a timing method finds a difference of that size.
CALIBRATION = ["hand-plus-30us"]
CALIBRATION_SECONDS = 30e-6
# The module each peer needs.
REQUIRES = {
    "ignite": "ignite",
    "accelerate": "accelerate",
    "mmengine": "mmengine",
    "mmengine-log": "mmengine",
    "pytorch-accelerated": "pytorch_accelerated",
    "pytorch-accelerated-default": "pytorch_accelerated",
    "lightning": "lightning",
    "lightning-log": "lightning",
}
BATCH = 64
IN_FEATURES, CLASSES = 64, 10
LR, MOMENTUM = 0.01, 0.9
WRITE_PERIOD = 20


def _only_item(items: List[Any]) -> Any:
    return items[0]


# Pre-made batches, one per index: the loader costs what a loader costs per
# batch, not 64 per-sample reads and a collate. A batch sampler of one index
# per batch rather than batch_size=None, which MMEngine's and
# pytorch-accelerated's loops need.
LOADER_OPTIONS: Dict[str, Any] = {"batch_size": 1, "shuffle": False, "collate_fn": _only_item, "num_workers": 0}

# A train() call, and the model whose weights it ends with.
Run = Tuple[Any, Callable[[], None]]


class Workload:
    """The data and a fresh (model, optimizer, loader) per run, identical for every system."""

    def __init__(self, width: int, iters: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.width, self.iters = width, iters
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(iters, BATCH, IN_FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (iters, BATCH), generator=g)
        self.dataset = _StampedBatches(self.x, self.y, first=iters // 10)

    def model(self) -> Any:
        import torch
        from torch import nn

        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(IN_FEATURES, self.width), nn.ReLU(), nn.Linear(self.width, CLASSES))

    def fresh(self) -> Tuple[Any, Any, Any]:
        import torch

        model = self.model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        return model, optimizer, self.loader()

    def loader(self) -> Any:
        import torch

        return torch.utils.data.DataLoader(self.dataset, **LOADER_OPTIONS)


class _StampedBatches:
    """Batch ``i`` of pre-made tensors; reads the clock when the batches
    that bound the timed stretch are fetched."""

    def __init__(self, x: Any, y: Any, first: int) -> None:
        self.x, self.y = x, y
        self.first, self.last = first, len(x) - 1
        self.stamps: Dict[int, float] = {}
        # Called with the batch index at the stretch's two ends (--calls).
        self.at_bounds: Optional[Callable[[int], None]] = None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Tuple[Any, Any]:
        if i == self.first or i == self.last:
            self.stamps[i] = time.perf_counter()
            if self.at_bounds is not None:
                self.at_bounds(i)
        return self.x[i], self.y[i]

    def steady_seconds_per_iter(self) -> float:
        return (self.stamps[self.last] - self.stamps[self.first]) / (self.last - self.first)


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for value in model.state_dict().values():
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _hand_steps(model: Any, optimizer: Any, batches: List[Tuple[Any, Any]]) -> None:
    import torch.nn.functional as F

    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def run_reference(work: Workload, workdir: str = "") -> Run:
    """The hand-written loop over pre-built batches: what every ratio is to."""
    model, optimizer, _ = work.fresh()
    batches = list(zip(work.x, work.y))
    return model, lambda: _hand_steps(model, optimizer, batches)


def run_reference_bounded(work: Workload, workdir: str = "") -> Run:
    """The reference, calling the dataset's ``at_bounds`` where a loader would
    fetch the stretch's first and last batches (``--instructions``)."""
    model, optimizer, _ = work.fresh()
    batches = list(zip(work.x, work.y))
    first, last = work.dataset.first, work.dataset.last

    def train() -> None:
        _hand_steps(model, optimizer, batches[:first])
        work.dataset.at_bounds(first)
        _hand_steps(model, optimizer, batches[first:last])
        work.dataset.at_bounds(last)
        _hand_steps(model, optimizer, batches[last:])

    return model, train


def _reference(work: Workload) -> float:
    """Seconds per iteration of the reference, timed in this process."""
    _, train = run_reference(work)
    start = time.perf_counter()
    call_with_frame_room(train)
    return (time.perf_counter() - start) / work.iters


# ---------------------------------------------------------------------- systems
def run_hand(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F

    model, optimizer, loader = work.fresh()

    def train() -> None:
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    return model, train


def run_hand_plus_30us(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F

    model, optimizer, loader = work.fresh()
    clock = time.perf_counter

    def train() -> None:
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            until = clock() + CALIBRATION_SECONDS
            while clock() < until:
                pass

    return model, train


def run_hand_recorded(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F

    model, optimizer, loader = work.fresh()
    losses: List[Tuple[Any, int]] = []
    data_times: List[Tuple[float, int]] = []
    iteration_times: List[Tuple[float, int]] = []

    def train() -> None:
        clock = time.perf_counter
        batches = iter(loader)
        for it in range(work.iters):
            start = clock()
            optimizer.zero_grad(set_to_none=True)
            x, y = next(batches)
            data_time = clock() - start
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append((loss.detach(), it))
            data_times.append((data_time, it))
            iteration_times.append((clock() - start, it))

    return model, train


def run_treadle_bare(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F

    from treadle.engine import EagerStep, TrainerBase

    model, optimizer, loader = work.fresh()
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=F.cross_entropy))
    trainer.register_hooks([])
    return model, lambda: trainer.train(0, work.iters)


def run_treadle_hooks(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F

    from treadle.engine import EagerStep, TrainerBase
    from treadle.events import CommonMetricPrinter, JSONWriter, TensorboardWriter
    from treadle.hooks import IterationTimer, PeriodicWriter
    from treadle.utils.logger import setup_logger

    # The console handler writes to whatever sys.stdout is when a line comes:
    # the timed run's os.devnull, as for the plain Trainer's.
    setup_logger()
    model, optimizer, loader = work.fresh()
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=F.cross_entropy))
    writers = [CommonMetricPrinter(work.iters), JSONWriter(os.path.join(workdir, "metrics.json")), TensorboardWriter(workdir)]
    trainer.register_hooks([IterationTimer(), PeriodicWriter(writers, period=WRITE_PERIOD)])
    return model, lambda: trainer.train(0, work.iters)


def run_treadle_schedule(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F
    from fvcore.common.param_scheduler import CosineParamScheduler

    from treadle.engine import EagerStep, TrainerBase
    from treadle.hooks import LRScheduler
    from treadle.solver import WarmupParamScheduler

    model, optimizer, loader = work.fresh()
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=F.cross_entropy))
    schedule = WarmupParamScheduler(CosineParamScheduler(1.0, 0.0), warmup_factor=0.001, warmup_length=0.05)
    trainer.register_hooks([LRScheduler(optimizer, schedule)])
    return model, lambda: trainer.train(0, work.iters)


def run_treadle_tour(work: Workload, workdir: str) -> Run:
    import torch
    import torch.nn.functional as F

    from treadle.engine import EagerStep, TrainerBase
    from treadle.events import CommonMetricPrinter, JSONWriter
    from treadle.hooks import IterationTimer, LRScheduler, PeriodicWriter
    from treadle.utils.logger import setup_logger

    # README.md's "### The loop", at this workload's length.
    setup_logger()
    model, optimizer, loader = work.fresh()
    step = EagerStep(model, loader, optimizer, loss_fn=F.cross_entropy, grad_accum_steps=1, clip_grad_norm=1.0)
    trainer = TrainerBase(step)
    trainer.register_hooks([
        IterationTimer(),
        LRScheduler(scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, work.iters)),
        PeriodicWriter([CommonMetricPrinter(work.iters), JSONWriter(os.path.join(workdir, "metrics.json"))],
                       period=WRITE_PERIOD),
    ])
    return model, lambda: trainer.train(0, work.iters)


def run_treadle_trainer(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F

    from treadle.trainer import Trainer

    model, optimizer, loader = work.fresh()
    trainer = Trainer(model, optimizer, loader, loss_fn=F.cross_entropy, max_iter=work.iters, log_period=WRITE_PERIOD,
                      output_dir=os.path.join(workdir, "trainer"), device="cpu", progress_bar=False)
    return model, trainer.train


def run_ignite(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F
    from ignite.engine import create_supervised_trainer

    model, optimizer, loader = work.fresh()
    engine = create_supervised_trainer(model, optimizer, F.cross_entropy)
    return model, lambda: engine.run(loader, max_epochs=1, epoch_length=work.iters)


def run_accelerate(work: Workload, workdir: str) -> Run:
    import torch.nn.functional as F
    from accelerate import Accelerator

    model, optimizer, loader = work.fresh()
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def train() -> None:
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()

    return accelerator.unwrap_model(model), train


def _run_mmengine(work: Workload, workdir: str, logging_on: bool) -> Run:
    import torch.nn.functional as F
    from mmengine.model import BaseModel
    from mmengine.optim import OptimWrapper
    from mmengine.runner import Runner

    model, optimizer, loader = work.fresh()

    class Classifier(BaseModel):
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def forward(self, inputs: Any, labels: Any, mode: str = "loss") -> Any:
            return {"loss": F.cross_entropy(self.net(inputs), labels)}

    hooks: Dict[str, Any] = {"checkpoint": None}
    if logging_on:
        hooks["logger"] = {"type": "LoggerHook", "interval": WRITE_PERIOD}
    else:
        hooks["logger"] = None
    runner = Runner(
        model=Classifier(model),
        work_dir=workdir,
        train_dataloader=loader,
        optim_wrapper=OptimWrapper(optimizer=optimizer),
        train_cfg={"by_epoch": False, "max_iters": work.iters},
        default_hooks=hooks,
        randomness={"seed": 0},
        log_level="INFO" if logging_on else "WARNING",
    )
    return model, runner.train


run_mmengine = functools.partial(_run_mmengine, logging_on=False)
run_mmengine_log = functools.partial(_run_mmengine, logging_on=True)


def _run_pytorch_accelerated(work: Workload, workdir: str, default_callbacks: bool) -> Run:
    import torch.nn.functional as F
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import MoveModulesToDeviceCallback

    model, optimizer, _ = work.fresh()
    kwargs = {} if default_callbacks else {"callbacks": (MoveModulesToDeviceCallback,)}
    options = dict(LOADER_OPTIONS)
    collate_fn = options.pop("collate_fn")
    trainer = Trainer(model=model, loss_func=F.cross_entropy, optimizer=optimizer, **kwargs)

    def train() -> None:
        # It builds its DataLoader from the dataset, with the same options.
        trainer.train(train_dataset=work.dataset, num_epochs=1, collate_fn=collate_fn, train_dataloader_kwargs=options)

    return model, train


run_pytorch_accelerated = functools.partial(_run_pytorch_accelerated, default_callbacks=False)
run_pytorch_accelerated_default = functools.partial(_run_pytorch_accelerated, default_callbacks=True)


def lightning_classifier(net: Any, logging_on: bool, lr: float = LR, momentum: float = MOMENTUM) -> Any:
    """``net`` as a LightningModule: cross-entropy, SGD with momentum, and
    ``self.log`` of the loss at every step when ``logging_on`` (as its users
    log). ``benchmarks/gpu.py`` uses it too."""
    import lightning as L
    import torch
    import torch.nn.functional as F

    class Module(L.LightningModule):
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            if logging_on:
                self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.net.parameters(), lr=lr, momentum=momentum)

    return Module(net)


def _run_lightning(work: Workload, workdir: str, logging_on: bool) -> Run:
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    model, _, loader = work.fresh()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=work.iters, max_epochs=1, default_root_dir=workdir,
        logger=TensorBoardLogger(workdir) if logging_on else False, log_every_n_steps=WRITE_PERIOD,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    module = lightning_classifier(model, logging_on)
    return model, lambda: trainer.fit(module, loader)


run_lightning = functools.partial(_run_lightning, logging_on=False)
run_lightning_log = functools.partial(_run_lightning, logging_on=True)


RUNNERS: Dict[str, Callable[[Workload, str], Run]] = {
    name: globals()["run_" + name.replace("-", "_")] for name in SYSTEMS + CALIBRATION
}


def available(system: str) -> bool:
    module = REQUIRES.get(system)
    return module is None or importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------- processes
def _quiet_console() -> Any:
    """``os.devnull``, and logging's root handler writing there (see the module docstring)."""
    devnull = open(os.devnull, "w")
    logging.basicConfig(stream=devnull, level=logging.INFO, force=True)
    return devnull


def _settle_garbage_collector() -> None:
    """Collects the garbage a system's start left (imports, the objects it
    built): otherwise the first collection of Python's younger generations
    inside the stretch walks them all, a one-off cost of the start (up to
    ~10 ms here, for the systems that import the most) that would land in
    the steady stretch of some systems and not of others."""
    import gc

    gc.collect()


def count_calls(system: str, iters: int, width: int) -> Dict[str, Any]:
    """One process: the Python and C functions ``system`` calls per iteration
    over the steady stretch (``sys.setprofile`` events from batch ``first``
    to the last), a figure the host's noise does not move."""
    import warnings

    warnings.filterwarnings("ignore")
    devnull = _quiet_console()
    work = Workload(width, iters)
    calls = own = 0
    import treadle

    # Whichever treadle this process imports (PYTHONPATH may name another checkout).
    treadle_dir = os.path.dirname(treadle.__file__ or "") + os.sep

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls, own
        if event == "call":
            calls += 1
            if frame.f_code.co_filename.startswith(treadle_dir):
                own += 1
        elif event == "c_call":
            calls += 1

    def at_bounds(i: int) -> None:
        sys.setprofile(profile if i == work.dataset.first else None)

    work.dataset.at_bounds = at_bounds
    with tempfile.TemporaryDirectory() as workdir:
        _, train = RUNNERS[system](work, workdir)
        _settle_garbage_collector()
        with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            try:
                call_with_frame_room(train)
            finally:
                sys.setprofile(None)
    stretch = work.dataset.last - work.dataset.first
    return {"system": system, "calls_per_iter": calls / stretch, "treadle_calls_per_iter": own / stretch}


def _timed_run(work: Workload, run: Callable[[Workload, str], Run], folder: str, devnull: Any) -> Tuple[float, float, Any]:
    """Builds a system in ``folder`` (imports included, outside the timing)
    and trains it once: its seconds per iteration over the steady stretch
    and end to end, and its model."""
    os.makedirs(folder)
    model, train = run(work, folder)
    _settle_garbage_collector()
    work.dataset.stamps.clear()
    with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        start = time.perf_counter()
        call_with_frame_room(train)
        whole = (time.perf_counter() - start) / work.iters
    return work.dataset.steady_seconds_per_iter(), whole, model


def child(system: str, iters: int, width: int) -> Dict[str, Any]:
    """One process: the reference, then the system; what the table needs."""
    import warnings

    warnings.filterwarnings("ignore")
    devnull = _quiet_console()
    work = Workload(width, iters)
    run = RUNNERS[system]
    with tempfile.TemporaryDirectory() as workdir:
        _reference(work)  # warms the allocator and the kernels
        references, steady, whole = [], [], []
        for rep in range(2):  # alternated, the fastest of each: warm-up and drift hit both alike
            references.append(_reference(work))
            # A fresh output folder each time.
            seconds, end_to_end, model = _timed_run(work, run, os.path.join(workdir, f"rep{rep}"), devnull)
            steady.append(seconds)
            whole.append(end_to_end)
        reference = min(references)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "system": system,
        "ratio": min(steady) / reference,
        "added_us": (min(steady) - reference) * 1e6,
        "per_iter_ms": min(steady) * 1e3,
        "end_to_end": min(whole) / reference,
        "digest": _digest(model),
        "peak_rss": peak,
        "cpus": _cpus(),
    }


def _cpus() -> Optional[List[int]]:
    """The logical CPUs this process may run on (one with ``--jobs``)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def paired_child(system: str, iters: int, width: int, pairs: int) -> Dict[str, Any]:
    """One process (``--paired``): ``hand`` and ``system`` trained
    alternately, ``pairs`` times each, which goes first alternating too;
    each pair's two steady-stretch times, taken seconds apart in one
    process, and whether every run ended with ``hand``'s weights."""
    import warnings

    warnings.filterwarnings("ignore")
    devnull = _quiet_console()
    work = Workload(width, iters)
    times: Dict[str, List[float]] = {"hand": [], system: []}
    digests = set()
    with tempfile.TemporaryDirectory() as workdir:
        _reference(work)  # warms the allocator and the kernels
        for rep in range(pairs):
            for name in ("hand", system) if rep % 2 == 0 else (system, "hand"):
                seconds, _, model = _timed_run(work, RUNNERS[name], os.path.join(workdir, f"{name}{rep}"), devnull)
                times[name].append(seconds)
                digests.add(_digest(model))
    return {"system": system, "hand": times["hand"], "times": times[system], "bit_identical": len(digests) == 1,
            "cpus": _cpus()}


class _TakingTurns:
    """Two training loops in two threads of one process, one iteration each
    in turn: a loop's batch fetch hands the turn to the other loop and waits
    for it back; loop 0 goes first. A loop that has returned gives up its
    turns for good."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._turn = 0
        self._finished = [False, False]

    def hand_over(self, me: int) -> None:
        with self._changed:
            self._turn = 1 - me
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._turn == me or self._finished[1 - me])

    def wait_for_first_turn(self, me: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._turn == me or self._finished[1 - me])

    def finish(self, me: int) -> None:
        with self._changed:
            self._finished[me] = True
            self._turn = 1 - me
            self._changed.notify_all()


class _TurnBatches(_StampedBatches):
    """The batches of a loop taking turns (``--interleaved``): each fetch
    hands the turn over, and the clock is read when a fetch begins and when
    it returns, so that iteration ``i`` is timed from its batch's return to
    the next fetch, the other loop's iteration left out."""

    def __init__(self, x: Any, y: Any, first: int, turns: _TakingTurns, me: int) -> None:
        super().__init__(x, y, first)
        self.turns, self.me = turns, me
        self.began = [0.0] * len(x)
        self.returned = [0.0] * len(x)
        # The process's minor page faults at the same moments: the other
        # loop's iterations fall outside this loop's spans.
        self.faults_began = [0] * len(x)
        self.faults_returned = [0] * len(x)
        # The loop's thread, for tools that attribute samples to it (perf_spans.py).
        self.thread_id: Optional[int] = None

    def __getitem__(self, i: int) -> Tuple[Any, Any]:
        if self.thread_id is None:
            self.thread_id = threading.get_native_id()
        self.began[i] = time.perf_counter()
        self.faults_began[i] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.turns.hand_over(self.me)
        self.faults_returned[i] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.returned[i] = time.perf_counter()
        return self.x[i], self.y[i]

    def iteration_seconds(self) -> List[float]:
        """Iterations ``first`` to ``last - 1``: from the batch's return to the next fetch."""
        return [self.began[i + 1] - self.returned[i] for i in range(self.first, self.last)]

    def faults_per_iteration(self) -> float:
        """Minor page faults per iteration over the same spans."""
        faults = sum(self.faults_began[i + 1] - self.faults_returned[i] for i in range(self.first, self.last))
        return faults / (self.last - self.first)


def interleaved_child(system: str, iters: int, width: int, system_first: bool,
                      warmup: Optional[int] = None, spans: Optional[str] = None) -> Dict[str, Any]:
    """One process (``--interleaved``): ``hand`` and ``system`` train at
    once in two threads on one CPU, an iteration each in turn. ``system``
    takes the first turn with ``system_first``, ``hand`` otherwise (a
    loop's place in the turns is worth tens of microseconds at a long step,
    so processes alternate them). For each phase of the writers' period
    (iteration ``i % 20``: a flush falls in one phase), the median over the
    steady stretch of what ``system``'s iteration took more than ``hand``'s
    of the same index; the mean over the phases is what it adds per
    iteration, flushes included. The steady stretch starts after
    ``warmup`` iterations (a tenth of them by default). With ``spans``, a
    JSON file there gets each loop's thread id and the timed spans of its
    iterations (``time.perf_counter``, CLOCK_MONOTONIC on Linux), for
    ``perf_spans.py``."""
    import warnings

    warnings.filterwarnings("ignore")
    if len(os.sched_getaffinity(0)) > 1:
        # Both loops on one CPU: two CPUs of a shared host are slowed unequally.
        os.sched_setaffinity(0, {physical_cores()[-1]})
    devnull = _quiet_console()
    turns = _TakingTurns()
    # Slot 0 goes first.
    names = (system, "hand") if system_first else ("hand", system)
    works = []
    for me in (0, 1):
        work = Workload(width, iters)
        work.dataset = _TurnBatches(work.x, work.y, iters // 10 if warmup is None else warmup, turns, me)
        works.append(work)
    with tempfile.TemporaryDirectory() as workdir:
        _reference(Workload(width, min(iters, 200)))  # warms the allocator and the kernels
        built = []
        for me, name in enumerate(names):
            os.makedirs(os.path.join(workdir, str(me)))
            built.append(RUNNERS[name](works[me], os.path.join(workdir, str(me))))
        _settle_garbage_collector()
        failures: List[BaseException] = []

        def train(me: int) -> None:
            turns.wait_for_first_turn(me)
            try:
                call_with_frame_room(built[me][1])
            except BaseException as error:  # noqa: BLE001 - raised again by the main thread
                failures.append(error)
            finally:
                turns.finish(me)

        # Each loop in a thread of its own, neither in this one: glibc gives
        # each new thread a fresh malloc arena, whereas this thread's main
        # arena holds what the imports and the builds left. A loop run here
        # spent 15-45 us more per iteration of a ~3 ms step in glibc's
        # malloc than the same loop in the other thread (perf samples of
        # the timed spans), a difference between the two slots, not systems.
        threads = [threading.Thread(target=train, args=(me,)) for me in (0, 1)]
        with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if failures:
            raise failures[0]
    system_slot = 0 if system_first else 1
    if spans:
        with open(spans, "w") as f:
            json.dump([{"name": name, "is_system": slot == system_slot, "thread_id": work.dataset.thread_id,
                        "first": work.dataset.first,
                        "spans": [(work.dataset.returned[i], work.dataset.began[i + 1])
                                  for i in range(work.dataset.first, work.dataset.last)]}
                       for slot, (name, work) in enumerate(zip(names, works))], f)
    hand_times, times = (works[slot].dataset.iteration_seconds() for slot in (1 - system_slot, system_slot))
    first = works[0].dataset.first
    by_phase: List[List[float]] = [[] for _ in range(WRITE_PERIOD)]
    for i, (h, t) in enumerate(zip(hand_times, times)):
        by_phase[(first + i) % WRITE_PERIOD].append((t - h) * 1e6)
    phases = [statistics.median(d) for d in by_phase if d]
    return {
        "system": system,
        "system_first": system_first,
        "warmup": first,
        "added_us": statistics.fmean(phases),
        "flush_phase_us": phases[-1] if len(phases) == WRITE_PERIOD else float("nan"),
        "phases_us": phases,
        "hand_ms": statistics.median(hand_times) * 1e3,
        "hand_faults": works[1 - system_slot].dataset.faults_per_iteration(),
        "faults": works[system_slot].dataset.faults_per_iteration(),
        "bit_identical": _digest(built[0][0]) == _digest(built[1][0]),
        "cpus": _cpus(),
    }


def run_bounded(system: str, iters: int, width: int) -> Dict[str, Any]:
    """One process, run under callgrind by ``--instructions``: ``system``
    trains once and calls ``os.getsid`` where the steady stretch starts and
    ends; callgrind, told to dump its counts before each such call, writes
    the stretch's instructions to a file of their own."""
    import warnings

    warnings.filterwarnings("ignore")
    devnull = _quiet_console()
    work = Workload(width, iters)
    work.dataset.at_bounds = lambda i: os.getsid(0)
    with tempfile.TemporaryDirectory() as workdir:
        _, train = (run_reference_bounded if system == "reference" else RUNNERS[system])(work, workdir)
        _settle_garbage_collector()
        with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            call_with_frame_room(train)
    return {"system": system, "stretch": work.dataset.last - work.dataset.first}


# --cache-sim: this host's per-core sizes (and typical of current x86
# cores), fixed so that counts compare across machines. valgrind simulates
# two levels; the last is the core's L2, whose misses go to the shared L3.
CACHE_SIM = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=524288,8,64"]
# valgrind's event names: instruction reads; level-1 instruction, data-read
# and data-write misses; the same at the last level.
L1_MISSES = ("I1mr", "D1mr", "D1mw")
LL_MISSES = ("ILmr", "DLmr", "DLmw")


# glibc's malloc, left to itself, gives memory back to the system and takes
# it again (page faults) depending on where each process's allocations lie:
# at a ~3 ms step (activations of a megabyte or more) one process faulted
# ~200 times per iteration and the next ~800, tens to hundreds of
# microseconds that follow no system. Fixed thresholds keep what a process
# frees for its next step, as a long run's heap does. --malloc-defaults
# leaves glibc's own.
STEADY_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def child_environment(**extra: str) -> Dict[str, str]:
    """The environment of every measured process. This is a CPU benchmark:
    no GPU is visible, since MMEngine's ``Runner`` and pytorch-accelerated's
    ``Trainer`` move the model to one on their own when they see it (on a
    GPU machine they trained there, with other numbers, while every other
    system trained on the CPU). The heap is kept steady (``STEADY_HEAP``)
    unless ``TREADLE_BENCH_MALLOC_DEFAULTS`` is set (``--malloc-defaults``)."""
    heap = {} if os.environ.get("TREADLE_BENCH_MALLOC_DEFAULTS") else STEADY_HEAP
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", **heap, **extra}


def events_per_iter(system: str, iters: int, width: int, profiles: Optional[str] = None,
                    cache_sim: bool = False) -> Dict[str, float]:
    """valgrind's counts per iteration over the steady stretch, by event
    (``Ir``, instructions; with ``cache_sim``, the simulated cache misses
    too): the same stretch the timing covers, writer flushes included,
    start and end left out."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", "--dump-before=getsid", f"--callgrind-out-file={out}",
                   *(CACHE_SIM if cache_sim else []),
                   sys.executable, __file__, "--child", system, "--bounded", "--iters", str(iters), "--width", str(width)]
        # The same hash seed for every process: dict and set layouts, and so
        # the instructions spent on them, do not change between runs. One
        # BLAS thread: numpy's OpenBLAS threads otherwise spin while idle,
        # instructions that depend on the clock, not on the work.
        env = child_environment(PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{system} failed under valgrind:\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        # Dump 1: up to the stretch; dump 2: the stretch; the last file: the rest.
        stretch_file = out + ".2"
        if not os.path.exists(stretch_file) or os.path.exists(out + ".3"):
            raise SystemExit(f"{system}: callgrind did not dump exactly at the stretch's two ends")
        with open(stretch_file) as f:
            header = {key: value.split() for key, _, value in (line.partition(": ") for line in f)
                      if key in ("events", "summary")}
        if profiles:
            shutil.copy(stretch_file, os.path.join(profiles, f"callgrind.out.{system}"))
    return {event: int(count) / result["stretch"] for event, count in zip(header["events"], header["summary"])}


def estimated_cycles(events: Dict[str, float]) -> float:
    """callgrind's cycle estimate from instructions and cache misses
    (kcachegrind's ``CEst`` without branches): a level-1 miss costs 10
    cycles, a last-level miss 100."""
    return events["Ir"] + 10 * sum(events[e] for e in L1_MISSES) + 100 * sum(events[e] for e in LL_MISSES)


def print_instructions(systems: List[str], iters: int, width: int, profiles: Optional[str] = None,
                       cache_sim: bool = False) -> None:
    names = ["reference", *systems]
    if profiles:
        os.makedirs(profiles, exist_ok=True)
    # Counts do not depend on what else the machine runs.
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        events = dict(zip(names, pool.map(lambda s: events_per_iter(s, iters, width, profiles, cache_sim), names)))
    counts = {name: e["Ir"] for name, e in events.items()}
    reference = counts.pop("reference")
    _print_counts(f"instructions per iteration over the steady stretch (valgrind callgrind), width {width}, {iters} "
                  f"iterations; reference: a hand-written loop over pre-built batches, {reference / 1e3:.1f}k "
                  "instructions", "k instr/it", counts, unit=1e3, reference=reference)
    if not cache_sim:
        return
    print()
    print("simulated caches (32 KiB 8-way L1i and L1d, 512 KiB 8-way L2, 64-byte lines), misses per iteration; "
          "estimated cycles = instructions + 10 x L1 misses + 100 x L2 misses")
    print(f"{'system':<28} {'L1i miss':>9} {'L1d miss':>9} {'L2 miss':>8} {'k cycles/it':>12} {'ratio':>7} {'vs hand':>9}")
    cycles = {name: estimated_cycles(e) for name, e in events.items()}
    for name, e in events.items():
        extra = f"{(cycles[name] - cycles['hand']) / 1e3:+9.1f}" if "hand" in cycles and name != "reference" else ""
        print(f"{name:<28} {e['I1mr']:9.0f} {e['D1mr'] + e['D1mw']:9.0f} {sum(e[k] for k in LL_MISSES):8.0f} "
              f"{cycles[name] / 1e3:12.1f} {cycles[name] / cycles['reference']:7.3f} {extra:>9}")


def _run_child(system: str, iters: int, width: int, *options: str, cpu: Optional[int] = None) -> Dict[str, Any]:
    pin = [] if cpu is None else ["--cpu", str(cpu)]
    proc = subprocess.run(
        [sys.executable, __file__, "--child", system, "--iters", str(iters), "--width", str(width), *options, *pin],
        capture_output=True, text=True, env=child_environment(),
    )
    if proc.returncode != 0:
        raise SystemExit(f"{system} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def physical_cores() -> List[int]:
    """One logical CPU of each physical core this process may run on, in
    order: hardware threads that share a core with an earlier one are left
    out (Linux's ``thread_siblings_list``)."""
    cores, seen = [], set()
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                core = f.read().strip()
        except OSError:
            core = str(cpu)
        if core not in seen:
            seen.add(core)
            cores.append(cpu)
    return cores


def run_children(tasks: List[Tuple[str, Tuple[str, ...]]], iters: int, width: int, jobs: int = 1) -> List[Dict[str, Any]]:
    """Each ``(system, options)`` of ``tasks`` in a process of its own, in
    order; with ``jobs`` > 1 that many at a time, each pinned to a core of
    its own (the last ``jobs`` physical cores: the first ones take the
    machine's interrupts and this process). Results in the order of ``tasks``."""
    if jobs <= 1:
        return [_run_child(system, iters, width, *options) for system, options in tasks]
    free = physical_cores()[-jobs:]
    lock = threading.Lock()

    def run(task: Tuple[str, Tuple[str, ...]]) -> Dict[str, Any]:
        with lock:
            cpu = free.pop(0)
        try:
            return _run_child(task[0], iters, width, *task[1], cpu=cpu)
        finally:
            with lock:
                free.append(cpu)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run, tasks))


def print_calls(systems: List[str], iters: int, width: int) -> None:
    """``--calls``: two tables of the same processes, treadle's own calls per
    iteration first, then every Python and C call with its difference to ``hand``'s."""
    rows = [_run_child(system, iters, width, "--calls") for system in systems]
    print(f"Calls of treadle's own Python functions (code under treadle/) per iteration over the steady stretch, "
          f"width {width}, {iters} iterations")
    print(f"{'system':<28} {'treadle calls/it':>16}")
    for row in rows:
        print(f"{row['system']:<28} {row['treadle_calls_per_iter']:16.1f}")
    _print_counts(f"Python and C function calls per iteration over the steady stretch (sys.setprofile), width {width}, "
                  f"{iters} iterations", "calls/it", {row["system"]: row["calls_per_iter"] for row in rows})


def _print_counts(title: str, column: str, counts: Dict[str, float], unit: float = 1.0,
                  reference: Optional[float] = None) -> None:
    """A per-iteration count per system (in ``unit``), with its difference to
    ``hand``'s and, given the reference's count, the ratio to it."""
    print(title)
    print(f"{'system':<28} {column:>11}" + (f" {'ratio':>7}" if reference else "") + f" {'vs hand':>9}")
    for system, count in counts.items():
        ratio = f" {count / reference:7.3f}" if reference else ""
        extra = f"{(count - counts['hand']) / unit:+9.1f}" if "hand" in counts else ""
        print(f"{system:<28} {count / unit:11.1f}{ratio} {extra:>9}")


def print_paired(systems: List[str], rounds: int, pairs: int, iters: int, width: int, jobs: int = 1) -> None:
    """``--paired``: per system, ``rounds`` processes (see
    :func:`paired_child`), interleaved across systems. In each process the
    fastest of its runs of the system against the fastest of its runs of
    ``hand`` (the host only ever slows a run down); the table gives the
    median over the processes and the middle half of them."""
    results: Dict[str, List[Dict[str, Any]]] = {s: [] for s in systems}
    tasks = [(system, ("--paired", "--pairs", str(pairs))) for _ in range(rounds) for system in systems]
    for row in run_children(tasks, iters, width, jobs):
        results[row["system"]].append(row)
    print(f"per-iteration time against the hand-written DataLoader loop trained alternately in the same process, "
          f"width {width}, {iters} iterations, one thread, {_plural(rounds, 'process', 'processes')} x "
          f"{_plural(pairs, 'pair')} per system, "
          "fastest of each in a process" + _jobs_note(jobs))
    print(f"{'system':<28} {'hand ms/it':>10} {'ms/it':>7} {'+us over hand':>14} {'IQR':>16} "
          f"{'ratio to hand':>14} {'bit-identical':>14}")
    for system, rows in results.items():
        hand = [min(r["hand"]) for r in rows]
        times = [min(r["times"]) for r in rows]
        added = [(t - h) * 1e6 for t, h in zip(times, hand)]
        spread = _interquartile(added, "+.1f", "..")
        same = all(r["bit_identical"] for r in rows)
        ratio = statistics.median(t / h for t, h in zip(times, hand))
        print(f"{system:<28} {statistics.median(hand) * 1e3:10.3f} {statistics.median(times) * 1e3:7.3f} "
              f"{statistics.median(added):+14.1f} {spread:>16} {ratio:14.3f} {str(same):>14}")


def print_interleaved(systems: List[str], rounds: int, iters: int, width: int, jobs: int = 1,
                      warmup: Optional[int] = None) -> None:
    """``--interleaved``: per system, ``rounds`` processes (see
    :func:`interleaved_child`), which loop takes the first turn alternating
    between them; what the system adds per iteration, the mean of the two
    orders' means, with its standard error (:func:`_mean_over_slots`). ``hand`` in ``systems`` is the
    control: the hand-written loop against itself, which should read zero."""
    results: Dict[str, List[Dict[str, Any]]] = {s: [] for s in systems}
    common = ("--interleaved",) + (() if warmup is None else ("--warmup", str(warmup)))
    tasks = [(system, common + (("--system-first",) if r % 2 else ())) for r in range(rounds) for system in systems]
    for row in run_children(tasks, iters, width, jobs):
        results[row["system"]].append(row)
    print(f"per-iteration time against the hand-written DataLoader loop taking turns with it, an iteration each, in "
          f"the same process on one CPU, width {width}, {iters} iterations, one thread each, "
          f"{_plural(rounds, 'process', 'processes')} per system, half with each loop first, mean of the two halves' "
          "means" + _jobs_note(jobs))
    print(f"{'system':<28} {'hand ms/it':>10} {'+us over hand':>14} {'std err':>8} {'IQR':>16} "
          f"{'ratio to hand':>14} {'flush iter +us':>15} {'faults/it':>12} {'bit-identical':>14}")
    for system, rows in results.items():
        added = [r["added_us"] for r in rows]
        mean, error = _mean_over_slots(rows)
        hand_ms = statistics.median(r["hand_ms"] for r in rows)
        flush = statistics.fmean(r["flush_phase_us"] for r in rows)
        same = all(r["bit_identical"] for r in rows)
        # Minor page faults per iteration, the system's / hand's (see STEADY_HEAP).
        faults = f"{statistics.fmean(r['faults'] for r in rows):.1f}/{statistics.fmean(r['hand_faults'] for r in rows):.1f}"
        label = "hand (against itself)" if system == "hand" else system
        print(f"{label:<28} {hand_ms:10.3f} {mean:+14.1f} {error:8.1f} {_interquartile(added, '+.1f', '..'):>16} "
              f"{1 + mean / (hand_ms * 1e3):14.4f} {flush:+15.1f} {faults:>12} {str(same):>14}")


def _mean_over_slots(rows: List[Dict[str, Any]]) -> Tuple[float, float]:
    """What a system adds per iteration and its standard error: the mean
    of the two slots' means (the system's loop first, or ``hand``'s), the
    error of that mean from each slot's own spread. Which loop goes first
    is worth a steady few tens of microseconds at a long step, the same in
    every process of a slot: pooling the two slots would count it as noise.
    Processes of one slot only: their mean and its error."""
    slots = [[r["added_us"] for r in rows if r["system_first"] is first] for first in (True, False)]
    if all(len(values) > 1 for values in slots):
        means = [statistics.fmean(values) for values in slots]
        variance = sum(statistics.variance(values) / len(values) for values in slots) / 4
        return statistics.fmean(means), variance ** 0.5
    added = [r["added_us"] for r in rows]
    error = statistics.stdev(added) / len(added) ** 0.5 if len(added) > 1 else float("nan")
    return statistics.fmean(added), error


def _plural(count: int, one: str, many: str = "") -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def _jobs_note(jobs: int) -> str:
    return f"; {jobs} processes at a time, each pinned to a core of its own" if jobs > 1 else ""


def _interquartile(values: List[float], fmt: str = ".3f", sep: str = "-") -> str:
    """The middle half of the rounds' values, ``low-high``: how far apart
    rounds land on this machine, against which a difference of medians is read."""
    if len(values) < 4:
        low, high = min(values), max(values)
    else:
        low, _, high = statistics.quantiles(values, n=4)
    return f"{low:{fmt}}{sep}{high:{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--width", type=int, default=128, help="hidden width: 128 ~ 0.3-0.5 ms, 4096 ~ 2.5-3 ms per step")
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS + CALIBRATION,
                        help="hand-plus-30us, run only when named, is the hand-written loop with 30 us of busy "
                             "waiting per iteration: what a timing method should read as +30 us")
    parser.add_argument("--calls", action="store_true",
                        help="count the functions each system calls per iteration instead of timing it")
    parser.add_argument("--instructions", action="store_true",
                        help="count the instructions each system executes per iteration (valgrind) instead of timing it")
    parser.add_argument("--profiles", metavar="DIR",
                        help="with --instructions: keep each system's callgrind profile of the stretch in DIR "
                             "(read them with callgrind_annotate)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="with --instructions: simulate the caches too (misses and estimated cycles per iteration; "
                             "about twice as slow)")
    parser.add_argument("--paired", action="store_true",
                        help="time each system against the hand-written DataLoader loop trained alternately in the "
                             "same process, and print what it adds per iteration (fastest of each in a process, "
                             "median over --rounds processes)")
    parser.add_argument("--pairs", type=int, default=4, help="with --paired: pairs per process (default 4)")
    parser.add_argument("--interleaved", action="store_true",
                        help="time each system and the hand-written DataLoader loop taking turns an iteration each in "
                             "one process on one CPU, and print what it adds per iteration (mean over --rounds "
                             "processes); hand in --systems is the loop against itself, the control")
    parser.add_argument("--warmup", type=int,
                        help="with --interleaved: iterations left out at the start, before the steady stretch "
                             "(default a tenth of --iters); at a long step the heap settles over the first few hundred")
    parser.add_argument("--jobs", type=int, default=1,
                        help="measured processes at a time, each pinned to a physical core of its own (default 1)")
    parser.add_argument("--malloc-defaults", action="store_true",
                        help="leave glibc's malloc its own thresholds in the measured processes (by default they "
                             "are fixed, so that no process returns freed memory and faults it in again each step)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bounded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--system-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spans", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.malloc_defaults:
        os.environ["TREADLE_BENCH_MALLOC_DEFAULTS"] = "1"
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.child:
        if args.bounded:
            print(json.dumps(run_bounded(args.child, args.iters, args.width)))
            return
        if args.paired:
            print(json.dumps(paired_child(args.child, args.iters, args.width, args.pairs)))
            return
        if args.interleaved:
            print(json.dumps(interleaved_child(args.child, args.iters, args.width, args.system_first, args.warmup,
                                                  args.spans)))
            return
        measure = count_calls if args.calls else child
        print(json.dumps(measure(args.child, args.iters, args.width)))
        return
    if (args.cache_sim or args.profiles) and not args.instructions:
        parser.error("--cache-sim and --profiles go with --instructions")
    if args.paired and (args.calls or args.instructions):
        parser.error("--paired times; it does not go with --calls or --instructions")
    if args.interleaved and (args.paired or args.calls or args.instructions):
        parser.error("--interleaved is a timing of its own; it does not go with --paired, --calls or --instructions")
    if args.interleaved and args.iters < 4 * WRITE_PERIOD:
        parser.error(f"--interleaved needs --iters of at least {4 * WRITE_PERIOD} (a steady stretch of whole "
                     f"writer periods), got {args.iters}")
    if args.warmup is not None and not args.interleaved:
        parser.error("--warmup goes with --interleaved")
    if args.warmup is not None and not 0 <= args.warmup <= args.iters - 4 * WRITE_PERIOD:
        parser.error(f"--warmup must be from 0 to --iters - {4 * WRITE_PERIOD} (a steady stretch of whole writer "
                     f"periods must remain), got {args.warmup}")
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, got {args.pairs}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1:
        if args.calls or args.instructions:
            parser.error("--jobs goes with the timed tables, not with --calls or --instructions "
                         "(--instructions runs its processes side by side already: counts do not depend on neighbours)")
        if not hasattr(os, "sched_setaffinity"):
            parser.error("--jobs pins processes to cores, which this system does not let a process do")
        if args.jobs > len(physical_cores()):
            parser.error(f"--jobs {args.jobs}: this process may run on {len(physical_cores())} physical cores; "
                         "each measured process needs one of its own")
    if args.paired and set(args.systems) <= {"hand"}:
        parser.error("--paired times systems against hand: name at least one other in --systems")
    systems = [s for s in args.systems if available(s)]
    skipped = [s for s in args.systems if s not in systems]
    if args.calls or args.instructions:
        if args.instructions and shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind on the PATH (apt install valgrind)")
        if args.instructions:
            print_instructions(systems, args.iters, args.width, args.profiles, args.cache_sim)
        else:
            print_calls(systems, args.iters, args.width)
        if skipped:
            print(f"not installed, skipped: {', '.join(skipped)}")
        return
    if args.interleaved:
        print_interleaved(systems, args.rounds, args.iters, args.width, args.jobs, args.warmup)
        if skipped:
            print(f"not installed, skipped: {', '.join(skipped)}")
        return
    if args.paired:
        print_paired([s for s in systems if s != "hand"], args.rounds, args.pairs, args.iters, args.width, args.jobs)
        if skipped:
            print(f"not installed, skipped: {', '.join(skipped)}")
        return
    results: Dict[str, List[Dict[str, Any]]] = {s: [] for s in systems}
    # Interleaved: a drift of the machine hits every system alike.
    for row in run_children([(system, ()) for _ in range(args.rounds) for system in systems], args.iters, args.width,
                            args.jobs):
        results[row["system"]].append(row)
    hand_digest = results["hand"][0]["digest"] if "hand" in results else None
    hand_rss = statistics.median(r["peak_rss"] for r in results["hand"]) if "hand" in results else None
    print(f"per-iteration time, width {args.width}, {args.iters} iterations, one thread, "
          f"medians of {args.rounds} interleaved rounds; ratio to a hand-written loop over pre-built batches"
          + _jobs_note(args.jobs))
    print(f"{'system':<28} {'ms/it':>7} {'ratio':>7} {'ratio-IQR':>13} {'+us/it':>9} {'end-to-end':>11} "
          f"{'bit-identical':>14} {'peak-RSS':>9}")
    for system, rows in results.items():
        ratio = statistics.median(r["ratio"] for r in rows)
        spread = _interquartile([r["ratio"] for r in rows])
        added = statistics.median(r["added_us"] for r in rows)
        per_iter = statistics.median(r["per_iter_ms"] for r in rows)
        end_to_end = statistics.median(r["end_to_end"] for r in rows)
        same = all(r["digest"] == hand_digest for r in rows)
        rss = statistics.median(r["peak_rss"] for r in rows) / hand_rss if hand_rss else float("nan")
        print(f"{system:<28} {per_iter:7.3f} {ratio:7.3f} {spread:>13} {added:+9.1f} {end_to_end:11.3f} {str(same):>14} "
              f"{rss:8.2f}x")
    if skipped:
        print(f"not installed, skipped: {', '.join(skipped)}")


if __name__ == "__main__":
    main()
