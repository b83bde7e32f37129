"""Where ``CompiledStep``'s time over a hand-written compiled loop goes, on a GPU.

``benchmarks/gpu.py`` measures ``CompiledStep(mode="reduce-overhead")``
against a hand-written loop that compiles the same forward and loss. This
script takes the difference apart on ``gpu.py``'s small (host-bound) step,
with variants of the hand-written loop that each do one thing
``CompiledStep`` does:

- ``hand``: ``torch.compile(lambda x, y: loss(model(x), y))``, the model closed over;
- ``hand+clone``: the same, and the loss cloned out of the graph's output
  each iteration (``CompiledStep`` keeps a copy: the next replay overwrites
  the output, and the storage reads losses only at the flush);
- ``hand+arg``: the loss contract's ``forward_loss`` compiled, the model passed as an argument;
- ``hand+arg+clone``: both;
- ``treadle``: ``TrainerBase(CompiledStep(...))``, no hooks.

Each is compiled and warmed once, then timed in interleaved rounds in one
process (wall clock between two ``torch.cuda.synchronize()``, which is the
throughput when the host is the bottleneck). Then ``torch.profiler``
reports the host time of 100 iterations of ``hand`` and ``treadle``, top
operations by self time.

Run: ``python benchmarks/gpu_compiled.py`` (``--rounds``, ``--iters``; needs CUDA).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

IN_FEATURES, WIDTH, BATCH, CLASSES = 256, 256, 64, 10  # benchmarks/gpu.py's small step
WARMUP = 40

# A variant: runs iterations [start, stop) of the data.
Loop = Callable[[int, int], None]


def _model_and_optimizer() -> Tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(IN_FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                          nn.Linear(WIDTH, CLASSES)).cuda()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _hand(data: List[Tuple[torch.Tensor, torch.Tensor]], *, as_argument: bool, clone: bool) -> Loop:
    from treadle.evaluation.loss import forward_loss

    model, optimizer = _model_and_optimizer()
    if as_argument:
        compiled = torch.compile(forward_loss, mode="reduce-overhead")

        def loss_of(batch: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return compiled(model, F.cross_entropy, batch)
    else:
        closed = torch.compile(lambda x, y: F.cross_entropy(model(x), y), mode="reduce-overhead")

        def loss_of(batch: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return closed(*batch)
    kept: List[torch.Tensor] = []

    def loop(start: int, stop: int) -> None:
        for i in range(start, stop):
            torch.compiler.cudagraph_mark_step_begin()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(data[i])
            loss.backward()
            optimizer.step()
            if clone:
                kept.append(loss.detach().clone())
        kept.clear()

    return loop


def _treadle(data: List[Tuple[torch.Tensor, torch.Tensor]]) -> Loop:
    from treadle.engine import CompiledStep, TrainerBase

    model, optimizer = _model_and_optimizer()
    step = CompiledStep(model, data, optimizer, loss_fn=F.cross_entropy, mode="reduce-overhead")
    trainer = TrainerBase(step)
    trainer.register_hooks([])

    def loop(start: int, stop: int) -> None:
        trainer.train(start, stop)
        if not step.compiled:
            raise RuntimeError(f"CompiledStep fell back to eager: {step._fell_back_reason}")

    return loop


def _us_per_iter(loop: Loop, iters: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    loop(WARMUP, iters)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (iters - WARMUP) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=400, help=f"iterations per round, the first {WARMUP} untimed")
    parser.add_argument("--profile-iters", type=int, default=100)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_compiled.py needs a CUDA device; none is visible here")
    if args.iters <= WARMUP or args.rounds < 1:
        parser.error(f"--iters must be above {WARMUP} and --rounds at least 1")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.iters, BATCH, IN_FEATURES, generator=generator).cuda()
    y = torch.randint(0, CLASSES, (args.iters, BATCH), generator=generator).cuda()
    data = [(x[i], y[i]) for i in range(args.iters)]
    loops: Dict[str, Loop] = {
        "hand": _hand(data, as_argument=False, clone=False),
        "hand+clone": _hand(data, as_argument=False, clone=True),
        "hand+arg": _hand(data, as_argument=True, clone=False),
        "hand+arg+clone": _hand(data, as_argument=True, clone=True),
        "treadle": _treadle(data),
    }
    for loop in loops.values():
        loop(0, WARMUP)  # compiles, records the CUDA graphs
    times: Dict[str, List[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            times[name].append(_us_per_iter(loop, args.iters))
    reference = statistics.median(times["hand"])
    print(f"us per iteration, medians of {args.rounds} interleaved rounds of {args.iters - WARMUP} iterations "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
    print(f"{'variant':16s} {'us/it':>8s} {'ratio':>6s} {'+us/it':>7s}  rounds")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:16s} {median:8.1f} {median / reference:6.3f} {median - reference:+7.1f}  "
              + " ".join(f"{v:.0f}" for v in values))
    from torch.profiler import ProfilerActivity, profile

    stop = min(WARMUP + args.profile_iters, args.iters)
    for name in ("hand", "treadle"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loops[name](WARMUP, stop)
            torch.cuda.synchronize()
        total_ms = sum(event.self_cpu_time_total for event in prof.key_averages()) / 1e3
        print(f"\n{name}: {total_ms:.1f} ms of host time over {stop - WARMUP} iterations (torch.profiler)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
