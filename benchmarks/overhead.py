"""What treadle's loop costs over a hand-written PyTorch loop.

The same model, data, optimizer and LR schedule are run by

* a hand-written loop (zero_grad, forward, loss, backward, step, scheduler
  step, and the loss read with ``.item()`` and logged every 20 iterations),
* ``TrainerBase`` + ``EagerStep`` + the default hooks: ``IterationTimer``,
  ``LRScheduler`` and ``PeriodicWriter`` every 20 iterations with
  ``JSONWriter`` and ``CommonMetricPrinter``,

in interleaved rounds (so drifts of the machine hit both alike); the figures
are medians of seconds per iteration over the rounds, the ratio is
treadle / hand-written, "paired" is the median of the per-round ratios
with its quartiles (the noise), and "fastest" is the ratio of the fastest
rounds (timeit's convention: a busy machine only ever adds time). Two step sizes are measured: ~1 ms and
~0.2 ms. Then where treadle's time goes, from ``trainer.timings()``.

A third loop, treadle without the JSON and console writers (the storage is
still flushed), shows what the writers cost.

``--breakdown`` adds the parts one at a time at the ~1 ms step (the bare
loop, TrainerBase with a minimal step, EagerStep, each default hook) and
prints what each adds.

Then ``CompiledStep`` against ``EagerStep`` on the small character-level
transformer of ``configs/charlm_transformer.py``, in fp32 and bf16
(throughput after compilation; skip with ``--no-compile``).

Run: ``python benchmarks/overhead.py`` (``--rounds``, ``--iters``, ``--threads``,
``--breakdown``, ``--no-compile``).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from treadle.engine import CompiledStep, EagerStep, StepBase, TrainerBase
from treadle.events.writers import CommonMetricPrinter, JSONWriter
from treadle.hooks import IterationTimer, LRScheduler, PeriodicWriter
from treadle.models import CharTransformerLM, lm_cross_entropy

LOG_PERIOD = 20


def make_problem(width: int, batch: int, seed: int = 0) -> Tuple[nn.Module, List[Tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    data = [(torch.randn(batch, 64), torch.randint(0, 10, (batch,))) for _ in range(32)]
    return model, data


def make_optimizer(model: nn.Module, iters: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=iters)
    return opt, sched


def run_raw(width: int, batch: int, iters: int, log: logging.Logger) -> float:
    model, data = make_problem(width, batch)
    opt, sched = make_optimizer(model, iters)
    stream = itertools.cycle(data)
    loss_fn = nn.functional.cross_entropy
    start = time.perf_counter()
    for it in range(iters):
        x, y = next(stream)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        if (it + 1) % LOG_PERIOD == 0:
            log.info("iter %d loss %.4f lr %.5f", it, loss.item(), opt.param_groups[0]["lr"])
    return (time.perf_counter() - start) / iters


def run_treadle(width: int, batch: int, iters: int, out_dir: str, timings: Dict[str, float]) -> float:
    """TrainerBase + EagerStep + the default hooks; ``timings`` gets ``trainer.timings()``."""
    return run_part(width, batch, iters, False, 3, out_dir, timings)


def interleaved(
    runners: Dict[str, Callable[[], float]], rounds: int
) -> Dict[str, List[float]]:
    results: Dict[str, List[float]] = {name: [] for name in runners}
    for fn in runners.values():  # warm-up round, not counted
        fn()
    for r in range(rounds):
        order = list(runners.items()) if r % 2 == 0 else list(reversed(runners.items()))
        for name, fn in order:
            results[name].append(fn())
    return results


def bench_overhead(rounds: int, iters: int) -> None:
    out_dir = tempfile.mkdtemp(prefix="treadle-bench-")
    log = logging.getLogger("bench.raw")
    log_file = open(os.path.join(out_dir, "raw.log"), "w")
    handler = logging.StreamHandler(log_file)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    treadle_log = logging.getLogger("treadle")
    treadle_log.handlers[:] = [logging.StreamHandler(open(os.path.join(out_dir, "treadle.log"), "w"))]
    treadle_log.setLevel(logging.INFO)
    treadle_log.propagate = False

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} rounds x {iters} iterations")
    print("ratio: of the medians; paired: median (and quartiles) of the per-round ratios, which drifts of the machine affect less;")
    print("fastest: of the fastest rounds, which a busy machine affects least")
    print(f"{'step':>10} {'raw ms/it':>10} {'treadle ms/it':>14} {'ratio':>7} {'paired (q1-q3)':>22} {'fastest':>8}")
    breakdowns = []
    for label, width, batch in (("~1 ms", 384, 128), ("~0.2 ms", 64, 32)):
        timings: Dict[str, float] = {}
        results = interleaved(
            {
                "raw": lambda width=width, batch=batch: run_raw(width, batch, iters, log),
                "treadle": lambda width=width, batch=batch, timings=timings: run_treadle(
                    width, batch, iters, out_dir, timings
                ),
                "no writers": lambda width=width, batch=batch: run_part(
                    width, batch, iters, False, 3, out_dir, writers=False
                ),
            },
            rounds,
        )
        raw = statistics.median(results["raw"])
        ours = statistics.median(results["treadle"])
        paired = [t / r for t, r in zip(results["treadle"], results["raw"])]
        q1, median, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
        print(
            f"{label:>10} {raw * 1e3:>10.4f} {ours * 1e3:>14.4f} {ours / raw:>7.3f} "
            f"{statistics.median(paired):>9.3f} ({q1:.3f}-{q3:.3f}) {min(results['treadle']) / min(results['raw']):>8.3f}"
        )
        without = [t / r for t, r in zip(results["no writers"], results["raw"])]
        print(
            f"{'':>10} treadle without the JSON and console writers (the storage still flushed): "
            f"paired {statistics.median(without):.3f}, fastest {min(results['no writers']) / min(results['raw']):.3f}"
        )
        breakdowns.append((label, timings))
    print("\nWhere treadle's time goes, last round (trainer.timings(), microseconds per iteration;")
    print("'step' is the loop less its hooks, i.e. the step object and the loop's own bookkeeping):")
    for label, timings in breakdowns:
        parts = sorted(((k, v) for k, v in timings.items() if v > 0), key=lambda kv: -kv[1])
        print(f"  {label}: " + ", ".join(f"{k} {1e6 * v / iters:.1f}" for k, v in parts if 1e6 * v / iters >= 0.05))
    log_file.close()


def _torch_ops(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, op_times: Optional[List[float]]) -> None:
    """zero_grad, forward, loss, backward, optimizer step; their duration appended to ``op_times``."""
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    if op_times is not None:
        op_times.append(time.perf_counter() - start)


class _MinimalStep(StepBase):
    """The hand-written iteration as a step object: no data time, no loss contract, no puts."""

    def __init__(self, model: nn.Module, stream, optimizer, op_times: Optional[List[float]] = None) -> None:
        self.model, self.stream, self.optimizer, self.op_times = model, stream, optimizer, op_times

    def run_step(self) -> None:
        x, y = next(self.stream)
        _torch_ops(self.model, self.optimizer, x, y, self.op_times)


def run_bare(width: int, batch: int, iters: int, op_times: Optional[List[float]] = None) -> float:
    """The hand-written loop without its scheduler and logging."""
    model, data = make_problem(width, batch)
    opt, _ = make_optimizer(model, iters)
    stream = itertools.cycle(data)
    start = time.perf_counter()
    for _ in range(iters):
        x, y = next(stream)
        _torch_ops(model, opt, x, y, op_times)
    return (time.perf_counter() - start) / iters


def run_part(
    width: int,
    batch: int,
    iters: int,
    minimal_step: bool,
    hooks: int,
    out_dir: str,
    timings: Optional[Dict[str, float]] = None,
    op_times: Optional[List[float]] = None,
    writers: bool = True,
) -> float:
    """TrainerBase with the minimal step or EagerStep and the first ``hooks``
    default hooks; without ``writers`` the PeriodicWriter flushes the storage
    to no writer."""
    model, data = make_problem(width, batch)
    opt, sched = make_optimizer(model, iters)
    if minimal_step:
        step: StepBase = _MinimalStep(model, itertools.cycle(data), opt, op_times)
    else:
        step = EagerStep(model, itertools.cycle(data), opt, loss_fn=nn.functional.cross_entropy)
    trainer = TrainerBase(step)
    metrics = os.path.join(out_dir, "metrics.json")
    if os.path.exists(metrics):
        os.remove(metrics)
    default_hooks = [
        IterationTimer(),
        LRScheduler(scheduler=sched),
        PeriodicWriter([JSONWriter(metrics), CommonMetricPrinter(iters)] if writers else [], period=LOG_PERIOD),
    ]
    trainer.register_hooks(default_hooks[:hooks])
    start = time.perf_counter()
    trainer.train(0, iters)
    elapsed = time.perf_counter() - start
    if timings is not None:
        timings.clear()
        timings.update(trainer.timings())
    return elapsed / iters


def bench_breakdown(rounds: int, iters: int) -> None:
    """Each part added one at a time, at the ~1 ms step, against the bare loop (paired medians)."""
    out_dir = tempfile.mkdtemp(prefix="treadle-bench-")
    width, batch = 384, 128
    runners = {
        "bare loop (no scheduler, no logging)": lambda: run_bare(width, batch, iters),
        "TrainerBase + minimal step": lambda: run_part(width, batch, iters, True, 0, out_dir),
        "TrainerBase + EagerStep": lambda: run_part(width, batch, iters, False, 0, out_dir),
        "+ IterationTimer": lambda: run_part(width, batch, iters, False, 1, out_dir),
        "+ LRScheduler (incl. torch's scheduler.step)": lambda: run_part(width, batch, iters, False, 2, out_dir),
        "+ PeriodicWriter (JSON + console)": lambda: run_part(width, batch, iters, False, 3, out_dir),
    }
    # The torch operations alone, timed inside the bare loop and inside
    # TrainerBase with every default hook around the minimal step.
    ops_bare: List[float] = []
    ops_hooked: List[float] = []
    runners["bare loop, torch ops timed"] = lambda: run_bare(width, batch, iters, ops_bare)
    runners["minimal step + default hooks, torch ops timed"] = lambda: run_part(
        width, batch, iters, True, 3, out_dir, op_times=ops_hooked
    )
    results = interleaved(runners, rounds)
    base = results["bare loop (no scheduler, no logging)"]
    print(f"\nBreakdown at the ~1 ms step, {rounds} rounds x {iters} iterations, against the bare loop:")
    previous = 0.0
    for name, times in list(results.items())[:-2]:
        added = statistics.median([t - b for t, b in zip(times, base)]) * 1e6
        print(f"  {name:<46} {statistics.median(times) * 1e3:8.4f} ms/it  {added:+7.1f} us  (this part {added - previous:+6.1f} us)")
        previous = added
    bare_ops, hooked_ops = statistics.median(ops_bare), statistics.median(ops_hooked)
    print(
        f"  the torch operations alone (zero_grad to optimizer.step), median: {bare_ops * 1e6:.1f} us in the bare loop, "
        f"{hooked_ops * 1e6:.1f} us between treadle's hooks ({(hooked_ops - bare_ops) * 1e6:+.1f} us)"
    )


def bench_compiled(iters: int) -> None:
    """CompiledStep vs EagerStep on the char-level transformer of configs/charlm_transformer.py."""
    torch.manual_seed(0)
    seq, batch = 128, 32
    tokens = torch.randint(0, 98, (4, batch, seq + 1))
    data = [(t[:, :-1], t[:, 1:]) for t in tokens]
    print(f"\nCompiledStep vs EagerStep, CharTransformerLM (dim 128, depth 2, seq {seq}, batch {batch}), fp32 and bf16:")
    for precision in ("fp32", "bf16"):
        rates = {}
        for kind in ("eager", "compiled"):
            torch.manual_seed(0)
            model = CharTransformerLM(98, seq_len=seq, dim=128, depth=2, heads=4)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            cls = CompiledStep if kind == "compiled" else EagerStep
            step = cls(model, itertools.cycle(data), opt, loss_fn=lm_cross_entropy, precision=precision)
            trainer = TrainerBase(step)
            t0 = time.perf_counter()
            trainer.train(0, 3)  # compilation happens here
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            trainer.train(3, 3 + iters)
            per_it = (time.perf_counter() - t0) / iters
            rates[kind] = batch / per_it
            print(f"  {precision} {kind:>8}: {per_it * 1e3:8.2f} ms/it, {rates[kind]:8.1f} sequences/s (first 3 iterations: {warm:.1f} s)")
        print(f"  {precision} speed-up of CompiledStep: {rates['compiled'] / rates['eager']:.2f}x")


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--compiled-iters", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--breakdown", action="store_true",
        help="also add the parts one at a time at the ~1 ms step, to see what each costs",
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch threads for both loops (default: torch's); 1 removes most OpenMP jitter on a small shared machine",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bench_overhead(args.rounds, args.iters)
    if args.breakdown:
        bench_breakdown(args.rounds, args.iters)
    if not args.no_compile:
        bench_compiled(args.compiled_iters)


if __name__ == "__main__":
    main(sys.argv[1:])
