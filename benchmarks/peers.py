"""treadle's per-iteration overhead beside a hand-written loop and its peers.

The same workload for everyone: an MLP on random data whose hand-written
step takes ~0.3 ms on one intra-op thread (``--width`` changes it; ``--width
1024`` gives ~3 ms), SGD with momentum, cross-entropy, batches of 64 from one
``DataLoader`` (same data, same order), ``--iters`` iterations.

Systems (each run in its own process, in interleaved rounds):

- ``hand``: a hand-written loop over the DataLoader;
- ``treadle-bare``: ``TrainerBase(EagerStep(...))``, no hooks;
- ``treadle-hooks``: ``IterationTimer`` and ``PeriodicWriter`` every 20
  iterations with ``JSONWriter``, ``CommonMetricPrinter`` and
  ``TensorboardWriter``;
- ``treadle-trainer``: the plain ``Trainer(...)`` with an ``output_dir``;
- ``ignite``: ``create_supervised_trainer``, no handlers, when
  ``pytorch-ignite`` is installed (an optional benchmark extra, never a CI
  dependency).

Each process times a hand-written loop over pre-built batches (the
reference) and its system, alternately, twice each, in the same process,
and reports the ratio of the fastest of each
(system time per iteration / reference time per iteration), the final
weights' digest and the process's peak resident memory. The table shows,
per system, the median ratio over the rounds, the added microseconds per
iteration, whether the final weights are bit-identical to the hand-written
loop's, and the peak RSS against the ``hand`` process's.

Run: ``python benchmarks/peers.py`` (``--rounds 5``, ``--iters 2000``,
``--width``, ``--systems``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

SYSTEMS = ["hand", "treadle-bare", "treadle-hooks", "treadle-trainer", "ignite"]
BATCH = 64
IN_FEATURES, CLASSES = 64, 10


def _setup(width: int, iters: int):
    import torch
    from torch import nn

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    # Pre-made batches, read with batch_size=None: the loader costs what a
    # loader costs per batch, not 64 per-sample reads and a collate.
    x = torch.randn(iters, BATCH, IN_FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (iters, BATCH), generator=g)
    dataset = torch.utils.data.TensorDataset(x, y)

    def fresh():
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(IN_FEATURES, width), nn.ReLU(), nn.Linear(width, CLASSES))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False)
        return model, optimizer, loader

    return dataset, fresh


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for value in model.state_dict().values():
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _reference(fresh: Callable, iters: int) -> float:
    """The hand-written loop over pre-built batches: the per-process reference."""
    import torch.nn.functional as F

    model, optimizer, loader = fresh()
    batches = list(loader)
    start = time.perf_counter()
    for x, y in batches[:iters]:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return (time.perf_counter() - start) / iters


def run_hand(fresh: Callable, iters: int, workdir: str) -> Any:
    import torch.nn.functional as F

    model, optimizer, loader = fresh()

    def train() -> None:
        for i, (x, y) in enumerate(loader):
            if i == iters:
                break
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

    return model, train


def run_treadle_bare(fresh: Callable, iters: int, workdir: str) -> Any:
    import torch.nn.functional as F

    from treadle.engine import EagerStep, TrainerBase

    model, optimizer, loader = fresh()
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=F.cross_entropy))
    trainer.register_hooks([])
    return model, lambda: trainer.train(0, iters)


def run_treadle_hooks(fresh: Callable, iters: int, workdir: str) -> Any:
    import torch.nn.functional as F

    from treadle.engine import EagerStep, TrainerBase
    from treadle.events import CommonMetricPrinter, JSONWriter, TensorboardWriter
    from treadle.hooks import IterationTimer, PeriodicWriter

    model, optimizer, loader = fresh()
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=F.cross_entropy))
    writers = [CommonMetricPrinter(iters), JSONWriter(os.path.join(workdir, "metrics.json")), TensorboardWriter(workdir)]
    trainer.register_hooks([IterationTimer(), PeriodicWriter(writers, period=20)])
    return model, lambda: trainer.train(0, iters)


def run_treadle_trainer(fresh: Callable, iters: int, workdir: str) -> Any:
    import torch.nn.functional as F

    from treadle.engine import Trainer

    model, optimizer, loader = fresh()
    trainer = Trainer(model, optimizer, loader, loss_fn=F.cross_entropy, max_iter=iters,
                      output_dir=os.path.join(workdir, "trainer"), device="cpu", progress_bar=False)
    return model, trainer.train


def run_ignite(fresh: Callable, iters: int, workdir: str) -> Any:
    import torch.nn.functional as F
    from ignite.engine import create_supervised_trainer

    model, optimizer, loader = fresh()
    engine = create_supervised_trainer(model, optimizer, F.cross_entropy)
    return model, lambda: engine.run(loader, max_epochs=1, epoch_length=iters)


RUNNERS: Dict[str, Callable] = {
    "hand": run_hand,
    "treadle-bare": run_treadle_bare,
    "treadle-hooks": run_treadle_hooks,
    "treadle-trainer": run_treadle_trainer,
    "ignite": run_ignite,
}


def available(system: str) -> bool:
    if system == "ignite":
        import importlib.util

        return importlib.util.find_spec("ignite") is not None
    return True


def child(system: str, iters: int, width: int) -> Dict[str, Any]:
    """One process: the reference, then the system; what the table needs."""
    import logging

    logging.disable(logging.WARNING)  # the console printer's lines are not what is measured
    _, fresh = _setup(width, iters)
    run = RUNNERS[system]
    with tempfile.TemporaryDirectory() as workdir:
        _reference(fresh, min(iters, 200))  # warm up the allocator and the kernels
        references, times = [], []
        for rep in range(2):  # alternated, the fastest of each: warm-up and drift hit both alike
            references.append(_reference(fresh, iters))
            folder = os.path.join(workdir, f"rep{rep}")  # a fresh output folder each time
            os.makedirs(folder)
            model, train = run(fresh, iters, folder)  # built (imports included) outside the timing
            start = time.perf_counter()
            train()
            times.append((time.perf_counter() - start) / iters)
        reference, seconds = min(references), min(times)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"system": system, "ratio": seconds / reference, "added_us": (seconds - reference) * 1e6,
            "per_iter_ms": seconds * 1e3, "digest": _digest(model), "peak_rss": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--width", type=int, default=128, help="hidden width: 128 ~ 0.3 ms, 1024 ~ 3 ms per step")
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.iters, args.width)))
        return
    systems = [s for s in args.systems if available(s)]
    skipped = [s for s in args.systems if s not in systems]
    results: Dict[str, List[Dict[str, Any]]] = {s: [] for s in systems}
    for _ in range(args.rounds):
        for system in systems:  # interleaved: a drift of the machine hits every system alike
            out = subprocess.run(
                [sys.executable, __file__, "--child", system, "--iters", str(args.iters), "--width", str(args.width)],
                capture_output=True, text=True, check=True,
            ).stdout
            results[system].append(json.loads(out.strip().splitlines()[-1]))
    hand_digest = results["hand"][0]["digest"] if "hand" in results else None
    hand_rss = statistics.median(r["peak_rss"] for r in results["hand"]) if "hand" in results else None
    print(f"per-iteration overhead, width {args.width}, {args.iters} iterations, one thread, "
          f"medians of {args.rounds} interleaved rounds")
    print(f"{'system':<18} {'ms/it':>7} {'ratio':>7} {'added us':>9} {'bit-identical':>14} {'peak RSS':>9}")
    for system, rows in results.items():
        ratio = statistics.median(r["ratio"] for r in rows)
        added = statistics.median(r["added_us"] for r in rows)
        per_iter = statistics.median(r["per_iter_ms"] for r in rows)
        same = all(r["digest"] == hand_digest for r in rows)
        rss = statistics.median(r["peak_rss"] for r in rows) / hand_rss if hand_rss else float("nan")
        print(f"{system:<18} {per_iter:7.3f} {ratio:7.3f} {added:+9.1f} {str(same):>14} {rss:8.2f}x")
    if skipped:
        print(f"not installed, skipped: {', '.join(skipped)}")


if __name__ == "__main__":
    main()
