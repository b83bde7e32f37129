"""What treadle's loop costs on a CUDA device, where the host must run ahead
of the GPU: the same MLP, data, order and optimizer trained by a hand-written
loop and by treadle, at a small step (the host's Python decides the speed)
and a large one (the GPU does).

Systems (each eager row is a fresh model and optimizer per round):

- ``hand``: zero_grad, forward, loss, backward, step over the batches; it
  never reads its loss (the floor);
- ``hand-log``: the same loop reading its loss every 20 iterations
  (``loss.item()``), as its users log it;
- ``treadle-bare``: ``TrainerBase(EagerStep(...))`` with no hooks;
- ``treadle-hooks``: plus ``IterationTimer`` and ``PeriodicWriter`` with the
  console, JSON and TensorBoard writers every 20 iterations;
- ``treadle-trainer``: the plain ``Trainer`` with an ``output_dir`` (its
  default hooks, checkpoint at the end);
- the peers, where installed (``pip install -c constraints.txt -e
  ".[bench]"``), logging every 20 iterations as their users do:
  ``accelerate-log`` (a loop over a model and optimizer prepared by Hugging
  Face's ``Accelerator``, reading its loss every 20) and ``lightning-log``
  (``self.log`` at every step, its TensorBoard logger every 20, no
  checkpoint or progress bar);
- ``hand-fp16`` / ``treadle-fp16``: autocast fp16 with a ``GradScaler`` (the
  torch.amp recipe, with the ``unscale_`` treadle does for hooks) and
  ``EagerStep(precision="fp16")``;
- ``hand-compiled`` / ``treadle-compiled`` (small step only): the forward and
  loss through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) and
  ``CompiledStep(mode="reduce-overhead")``. Compiling is slow, so each of these
  is built once and trains on through the rounds.

Time per iteration is read from CUDA events recorded when the batches that
bound the steady stretch (from a tenth of the run to its end) are fetched:
the device reaches them when the host does (host-bound) or when its queue
drains (device-bound), so the figure is the throughput in both cases. Figures
are medians over interleaved rounds; the ratio is to ``hand`` (``hand-fp16``,
``hand-compiled`` for their rows), with the added microseconds per
iteration; ``identical`` says whether the final weights equal the reference's
bit for bit.

Run: ``python benchmarks/gpu.py`` (``--rounds``, ``--iters``; needs CUDA).
``--cpu-check`` times nothing: it trains every system that runs without CUDA
(all but the fp16 and compiled rows) a few iterations on the CPU and says
whether its weights equal ``hand``'s, so that a broken system is found here
rather than on a lent GPU's short time (the tests run it).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

IN_FEATURES, CLASSES, LR, MOMENTUM, WRITE_PERIOD = 256, 10, 0.01, 0.9, 20
SIZES = {"small": (256, 64), "large": (4096, 1024)}  # (hidden width, batch)


class StampedBatches:
    """Batch ``i`` of pre-made GPU tensors; records a CUDA event when the
    stretch's first and last batches are fetched (every system
    iterates it alike)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.first, self.last = len(x) // 10, len(x) - 1
        self.events: Dict[int, torch.cuda.Event] = {}
        self.stamp = x.is_cuda  # --cpu-check times nothing

    def __len__(self) -> int:
        return len(self.x)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return map(self.__getitem__, range(len(self.x)))

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.stamp and (i == self.first or i == self.last):
            event = self.events[i] = torch.cuda.Event(enable_timing=True)
            event.record()
        return self.x[i], self.y[i]

    def ms_per_iter(self) -> float:
        torch.cuda.synchronize()
        return self.events[self.first].elapsed_time(self.events[self.last]) / (self.last - self.first)


class ReadyBatches:
    """A ``StampedBatches`` as treadle's ``Trainer`` takes ready batches: an
    iterable with a length that is not a sequence (a sequence is a dataset of
    samples to it, as to torch's ``DataLoader``). The same batches, in order."""

    def __init__(self, batches: StampedBatches) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)


class Workload:
    def __init__(self, size: str, iters: int, device: str = "cuda") -> None:
        self.width, batch = SIZES[size]
        self.iters = iters
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(0)
        self.data = StampedBatches(torch.randn(iters, batch, IN_FEATURES, generator=g).to(self.device),
                                   torch.randint(0, CLASSES, (iters, batch), generator=g).to(self.device))

    def fresh(self) -> Tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(IN_FEATURES, self.width), nn.ReLU(), nn.Linear(self.width, self.width), nn.ReLU(),
                              nn.Linear(self.width, CLASSES)).to(self.device)
        return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


# A system: its model, and a call that trains it over the workload once.
Run = Tuple[nn.Module, Callable[[], None]]


def run_hand(work: Workload, folder: str) -> Run:
    model, optimizer = work.fresh()

    def train() -> None:
        for x, y in work.data:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    return model, train


def run_hand_log(work: Workload, folder: str) -> Run:
    model, optimizer = work.fresh()

    def train() -> None:
        for i, (x, y) in enumerate(work.data):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if (i + 1) % WRITE_PERIOD == 0:
                print(f"iteration {i}: loss {loss.item():.4f}")

    return model, train


def run_accelerate_log(work: Workload, folder: str) -> Run:
    from accelerate import Accelerator

    model, optimizer = work.fresh()
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)

    def train() -> None:
        for i, (x, y) in enumerate(work.data):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            if (i + 1) % WRITE_PERIOD == 0:
                accelerator.print(f"iteration {i}: loss {loss.item():.4f}")

    return accelerator.unwrap_model(model), train


def run_lightning_log(work: Workload, folder: str) -> Run:
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import lightning_classifier

    # Lightning's own handler writes its INFO lines (devices, tips) to the console, past the redirect.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    model, _ = work.fresh()
    trainer = L.Trainer(
        accelerator="gpu" if work.device.type == "cuda" else "cpu", devices=1, max_steps=work.iters, max_epochs=1, default_root_dir=folder,
        logger=TensorBoardLogger(folder), log_every_n_steps=WRITE_PERIOD, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    # batch_size=None: the loader hands over each pre-made batch as it is (stamped when fetched).
    loader = torch.utils.data.DataLoader(work.data, batch_size=None)
    module = lightning_classifier(model, logging_on=True, lr=LR, momentum=MOMENTUM)
    return model, lambda: trainer.fit(module, loader)


def run_hand_fp16(work: Workload, folder: str) -> Run:
    model, optimizer = work.fresh()
    scaler = torch.amp.GradScaler("cuda")

    def train() -> None:
        for x, y in work.data:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()

    return model, train


def _trainer_base(work: Workload, hooks: List[Any], **step_options: Any) -> Run:
    from treadle.engine import EagerStep, TrainerBase

    model, optimizer = work.fresh()
    trainer = TrainerBase(EagerStep(model, work.data, optimizer, loss_fn=F.cross_entropy, **step_options))
    trainer.register_hooks(hooks)
    return model, lambda: trainer.train(0, work.iters)


def run_treadle_bare(work: Workload, folder: str) -> Run:
    return _trainer_base(work, [])


def run_treadle_fp16(work: Workload, folder: str) -> Run:
    return _trainer_base(work, [], precision="fp16")


def run_treadle_hooks(work: Workload, folder: str) -> Run:
    from treadle.events import CommonMetricPrinter, JSONWriter, TensorboardWriter
    from treadle.hooks import IterationTimer, PeriodicWriter

    writers = [CommonMetricPrinter(work.iters), JSONWriter(os.path.join(folder, "metrics.json")), TensorboardWriter(folder)]
    return _trainer_base(work, [IterationTimer(), PeriodicWriter(writers, period=WRITE_PERIOD)])


def run_treadle_trainer(work: Workload, folder: str) -> Run:
    from treadle.trainer import Trainer

    model, optimizer = work.fresh()
    trainer = Trainer(model, optimizer, ReadyBatches(work.data), loss_fn=F.cross_entropy, max_iter=work.iters,
                      log_period=WRITE_PERIOD, output_dir=os.path.join(folder, "trainer"), device=work.device.type,
                      progress_bar=False, num_threads=None)  # the process's threads, as the other systems train
    return model, trainer.train


def _persistent(build: Callable[[Workload], Run]) -> Callable[[Workload, str], Run]:
    """A system built once per process (compiling is slow); later rounds train it on."""
    built: Dict[int, Run] = {}

    def run(work: Workload, folder: str) -> Run:
        if id(work) not in built:
            built[id(work)] = build(work)
        return built[id(work)]

    return run


def _hand_compiled(work: Workload) -> Run:
    model, optimizer = work.fresh()
    loss_of = torch.compile(lambda x, y: F.cross_entropy(model(x), y), mode="reduce-overhead")

    def train() -> None:
        for x, y in work.data:
            torch.compiler.cudagraph_mark_step_begin()
            optimizer.zero_grad(set_to_none=True)
            loss_of(x, y).backward()
            optimizer.step()

    return model, train


def _treadle_compiled(work: Workload) -> Run:
    from treadle.engine import CompiledStep, TrainerBase

    model, optimizer = work.fresh()
    step = CompiledStep(model, work.data, optimizer, loss_fn=F.cross_entropy, mode="reduce-overhead")
    trainer = TrainerBase(step)
    trainer.register_hooks([])

    def train() -> None:
        if not step.compiled:
            raise RuntimeError(f"CompiledStep fell back to eager: {step._fell_back_reason}")
        trainer.train(0, work.iters)

    return model, train


RUNNERS: Dict[str, Callable[[Workload, str], Run]] = {
    "hand": run_hand,
    "hand-log": run_hand_log,
    "treadle-bare": run_treadle_bare,
    "treadle-hooks": run_treadle_hooks,
    "treadle-trainer": run_treadle_trainer,
    "accelerate-log": run_accelerate_log,
    "lightning-log": run_lightning_log,
    "hand-fp16": run_hand_fp16,
    "treadle-fp16": run_treadle_fp16,
    "hand-compiled": _persistent(_hand_compiled),
    "treadle-compiled": _persistent(_treadle_compiled),
}
REFERENCE = {"hand-fp16": "hand-fp16", "treadle-fp16": "hand-fp16", "hand-compiled": "hand-compiled",
             "treadle-compiled": "hand-compiled"}
COMPILED = ("hand-compiled", "treadle-compiled")
CUDA_ONLY = COMPILED + ("hand-fp16", "treadle-fp16")
# Timed where their package is installed.
PEERS = {"accelerate-log": "accelerate", "lightning-log": "lightning"}


def installed(system: str) -> bool:
    package = PEERS.get(system)
    return package is None or importlib.util.find_spec(package) is not None


def _digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for value in model.state_dict().values():
        h.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def train_quietly(system: str, work: Workload, folder: str) -> str:
    """Builds ``system`` and trains it over ``work`` once, its console output
    discarded; returns its weights' digest."""
    model, train = RUNNERS[system](work, folder)
    work.data.events.clear()
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        train()
    return _digest(model)


def measure(size: str, systems: List[str], rounds: int, iters: int) -> List[Dict[str, Any]]:
    work = Workload(size, iters)
    times: Dict[str, List[float]] = {s: [] for s in systems}
    digests: Dict[str, str] = {}
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds + 1):  # round 0 warms up (cuBLAS, allocator, compilation) and is not counted
            for system in systems:
                digests[system] = train_quietly(system, work, os.path.join(root, f"{system}-{r}"))
                if r:
                    times[system].append(work.data.ms_per_iter())
    rows = []
    for system in systems:
        reference = REFERENCE.get(system, "hand")
        ratios = [t / h for t, h in zip(times[system], times[reference])]
        rows.append({
            "size": size, "system": system, "ms": statistics.median(times[system]), "reference": reference,
            "ratio": statistics.median(ratios),
            "added_us": statistics.median([(t - h) * 1e3 for t, h in zip(times[system], times[reference])]),
            "identical": digests[system] == digests[reference],
        })
    return rows


def cpu_check(iters: int) -> bool:
    """Trains each system that runs without CUDA once on the CPU; prints
    whether its weights equal ``hand``'s. True where all do."""
    work = Workload("small", iters, device="cpu")
    systems = [s for s in RUNNERS if s not in CUDA_ONLY and installed(s)]
    missing = [s for s in RUNNERS if not installed(s)]
    if missing:
        print(f"not installed, not checked: {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as root:
        digests = {system: train_quietly(system, work, os.path.join(root, system)) for system in systems}
    print(f"CPU check, {iters} iterations (nothing timed): identical weights to hand")
    for system in systems:
        print(f"{system:>17} {digests[system] == digests['hand']}")
    return all(d == digests["hand"] for d in digests.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the timed table (default 5)")
    parser.add_argument("--iters", type=int, default=600, help="iterations per run at the small step (the large: a third)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled rows")
    parser.add_argument("--cpu-check", action="store_true",
                        help="time nothing: train each system that runs without CUDA on the CPU, compare its weights")
    args = parser.parse_args()
    if args.cpu_check:
        if args.rounds is not None or args.no_compile:
            parser.error("--cpu-check times nothing: --rounds and --no-compile go with the timed table")
        if args.iters < 1:
            parser.error("--iters must be at least 1")
        logging.basicConfig(stream=open(os.devnull, "w"), level=logging.INFO, force=True)
        sys.exit(0 if cpu_check(args.iters) else 1)
    args.rounds = 5 if args.rounds is None else args.rounds
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device; none is visible here")
    if args.rounds < 1 or args.iters < 20:
        sys.exit("--rounds must be at least 1 and --iters at least 20")
    logging.basicConfig(stream=open(os.devnull, "w"), level=logging.INFO, force=True)
    small = [s for s in RUNNERS if installed(s) and not (args.no_compile and s in COMPILED)]
    large = [s for s in RUNNERS if installed(s) and s not in COMPILED]
    missing = [s for s in RUNNERS if not installed(s)]
    if missing:
        print(f"not installed, not timed: {', '.join(missing)} (pip install -c constraints.txt -e '.[bench]')")
    rows = measure("small", small, args.rounds, args.iters) + measure("large", large, args.rounds, max(20, args.iters // 3))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; medians of {args.rounds} rounds")
    print(f"{'size':>6} {'system':>17} {'ms/it':>8} {'to':>14} {'ratio':>6} {'+us/it':>7} {'identical':>9}")
    for r in rows:
        print(f"{r['size']:>6} {r['system']:>17} {r['ms']:8.4f} {r['reference']:>14} {r['ratio']:6.3f} "
              f"{r['added_us']:+7.1f} {str(r['identical']):>9}")


if __name__ == "__main__":
    main()
