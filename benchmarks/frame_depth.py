"""What the depth a training loop is called from costs it, on CPython 3.11+.

CPython keeps the frames of Python functions on a stack of 16 KiB chunks
per thread and unmaps a chunk as soon as the frame at its start returns
(3.11, 3.12, 3.13.0; later 3.13 and 3.14 keep one back, python/cpython#142183). A loop
called from just below a chunk boundary then maps, faults in and unmaps a
chunk at every step. This trains ``benchmarks/peers.py``'s workload (a
0.3-0.5 ms step) with ``hand`` (a hand-written loop) and with treadle's
loops, each called from ``--depths`` call depths (a small recursive
function adds one frame per level, 0 to --max-depth), and prints per
system the median time per iteration over the depths, the worst depth with
its time and minor page faults per iteration, and how many depths faulted
at least once per iteration. treadle's loops run with room on the frame
stack (``treadle.utils.frame_stack``) and should show no such depth.

Run: ``python benchmarks/frame_depth.py`` (``--iters``, ``--width``,
``--max-depth``, ``--step``, ``--systems``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import RUNNERS, Workload, _quiet_console, _settle_garbage_collector  # noqa: E402


def _at_depth(depth: int, fn: Callable[[], None]) -> None:
    if depth == 0:
        fn()
    else:
        _at_depth(depth - 1, fn)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(system: str, depth: int, work: Workload, workdir: str, devnull: Any) -> Tuple[float, float]:
    """Seconds and minor page faults per iteration of one run of ``system``
    called ``depth`` frames deeper than here, build excluded."""
    folder = tempfile.mkdtemp(dir=workdir)
    _, train = RUNNERS[system](work, folder)
    _settle_garbage_collector()
    with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        faults, start = _faults(), time.perf_counter()
        _at_depth(depth, train)
        seconds, faults = time.perf_counter() - start, _faults() - faults
    return seconds / work.iters, faults / work.iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--max-depth", type=int, default=240)
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--systems", nargs="+", default=["hand", "treadle-bare", "treadle-hooks"],
                        choices=["hand", "hand-recorded", "treadle-bare", "treadle-hooks", "treadle-trainer"])
    args = parser.parse_args()
    if args.iters < 10 or args.step < 1 or args.max_depth < 0:
        parser.error("--iters must be at least 10, --step at least 1 and --max-depth at least 0")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), args.max_depth + 1000))
    devnull = _quiet_console()
    work = Workload(args.width, args.iters)
    depths = list(range(0, args.max_depth + 1, args.step))
    results: Dict[str, List[Tuple[int, float, float]]] = {s: [] for s in args.systems}
    with tempfile.TemporaryDirectory() as workdir:
        measure("hand", 0, work, workdir, devnull)  # warms the allocator and the kernels
        # Depth by depth, the systems in turn: a drift of the machine hits all alike.
        for depth in depths:
            for system in args.systems:
                seconds, faults = measure(system, depth, work, workdir, devnull)
                results[system].append((depth, seconds, faults))
    print(f"per-iteration time and minor page faults by the depth train() is called from, width {args.width}, "
          f"{args.iters} iterations, depths 0-{args.max_depth} step {args.step}, one thread, "
          f"{platform.python_implementation()} {platform.python_version()}")
    print(f"{'system':<16} {'median us/it':>12} {'worst depth':>11} {'us/it there':>11} {'faults/it there':>15} "
          f"{'depths faulting':>15}")
    for system, rows in results.items():
        median = statistics.median(seconds for _, seconds, _ in rows)
        depth, seconds, faults = max(rows, key=lambda row: (row[2], row[1]))
        faulting = sum(1 for _, _, f in rows if f >= 1)
        print(f"{system:<16} {median * 1e6:12.1f} {depth:11d} {seconds * 1e6:11.1f} {faults:15.1f} "
              f"{faulting:>8d} of {len(rows):<3d}")


if __name__ == "__main__":
    main()
