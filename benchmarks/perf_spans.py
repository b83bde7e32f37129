"""Where the microseconds of ``peers.py --interleaved`` go: perf samples of
the timed spans, by shared object and by function.

Each process is one ``peers.py --child SYSTEM --interleaved`` run under
``perf record`` (the ``cpu-clock`` software event, which a virtual machine
without hardware counters has too, on CLOCK_MONOTONIC, the clock the
benchmark stamps its spans with). Each sample is given to the loop whose
thread it was taken in, if it falls in one of that loop's timed spans (from
a batch's return to the next fetch, after the warm-up): the system's
samples less ``hand``'s, times the sampling period, over the spans, is what
the system adds per iteration in that shared object or function, beside the
timed figure. Which loop goes first alternates between processes, as in
``peers.py``. Sampling slows both loops alike (a few percent).

This separates what a system's own code costs (``libpython``, its Python)
from what moves with where each loop's memory lies (``libtorch_cpu``: the
same kernels on other buffers, and ``libc``: malloc's search of its arena),
which at a long step differs between the two loops of one process by tens
of microseconds either way.

Run: ``python benchmarks/perf_spans.py --system treadle-hooks --width 6144
--iters 900 --warmup 300 --processes 4`` (needs ``perf`` on the PATH).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import SYSTEMS, CALIBRATION, child_environment  # noqa: E402

FREQUENCY = 20_000  # samples per second: one per 50 us


def _samples(perf_data: str) -> List[Tuple[int, float, str, str]]:
    """``(thread id, time, shared object, function)`` of every sample."""
    text = subprocess.run(["perf", "script", "-i", perf_data, "-F", "tid,time,ip,sym,dso"],
                          capture_output=True, text=True, check=True).stdout
    samples = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 3:
            continue
        try:
            thread_id, when = int(parts[0]), float(parts[1].rstrip(":"))
        except ValueError:
            continue
        rest = parts[3] if len(parts) > 3 else ""
        function, _, library = rest.rpartition(" (")
        samples.append((thread_id, when, os.path.basename(library.rstrip(")")) or "?", function or rest))
    return samples


def attribute(perf_data: str, spans_file: str) -> Dict[str, Any]:
    """One process: per loop (``system``, ``hand``), samples in its timed
    spans by shared object and by function, and its number of spans."""
    with open(spans_file) as f:
        loops = json.load(f)
    by_thread = {loop["thread_id"]: loop for loop in loops}
    starts = {loop["thread_id"]: [start for start, _ in loop["spans"]] for loop in loops}
    counts = {("system" if loop["is_system"] else "hand"): {"objects": collections.Counter(),
                                                           "functions": collections.Counter(),
                                                           "spans": len(loop["spans"])} for loop in loops}
    for thread_id, when, library, function in _samples(perf_data):
        loop = by_thread.get(thread_id)
        if loop is None:
            continue
        k = bisect.bisect_right(starts[thread_id], when) - 1
        if k < 0 or when >= loop["spans"][k][1]:
            continue
        count = counts["system" if loop["is_system"] else "hand"]
        count["objects"][library] += 1
        count["functions"][(library, function)] += 1
    return counts


def added_per_iteration(counts: Dict[str, Any], key: str) -> Dict[Any, float]:
    """The system's microseconds per iteration less ``hand``'s, per ``key`` entry."""
    system, hand = counts["system"], counts["hand"]
    period_us = 1e6 / FREQUENCY
    names = set(system[key]) | set(hand[key])
    return {name: (system[key][name] / system["spans"] - hand[key][name] / hand["spans"]) * period_us
            for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", required=True, choices=SYSTEMS + CALIBRATION)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--iters", type=int, default=900)
    parser.add_argument("--width", type=int, default=6144)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--functions", type=int, default=15, help="functions to list (default 15)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf_spans.py needs perf on the PATH (apt install linux-perf)")
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.py")
    per_process = []
    with tempfile.TemporaryDirectory() as folder:
        for p in range(args.processes):
            data, spans = os.path.join(folder, f"{p}.data"), os.path.join(folder, f"{p}.json")
            command = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "cpu-clock", "-F", str(FREQUENCY),
                       "-o", data, sys.executable, script, "--child", args.system, "--interleaved",
                       "--iters", str(args.iters), "--width", str(args.width), "--warmup", str(args.warmup),
                       "--spans", spans] + (["--system-first"] if p % 2 else [])
            proc = subprocess.run(command, capture_output=True, text=True, env=child_environment())
            if proc.returncode != 0:
                raise SystemExit(f"{args.system} failed under perf:\n{proc.stderr[-3000:]}")
            timed = json.loads(proc.stdout.strip().splitlines()[-1])["added_us"]
            counts = attribute(data, spans)
            per_process.append((timed, added_per_iteration(counts, "objects"), added_per_iteration(counts, "functions")))
    print(f"{args.system} against hand, interleaved, width {args.width}, {args.iters} iterations after {args.warmup}, "
          f"perf cpu-clock at {FREQUENCY} Hz, {args.processes} processes (which loop goes first alternates)")
    print(f"{'process':<8} {'timed +us/it':>13} {'sampled +us/it':>15}  largest shared objects, +us/it")
    for p, (timed, objects, _) in enumerate(per_process):
        largest = sorted(objects.items(), key=lambda kv: -abs(kv[1]))[:4]
        print(f"{p:<8} {timed:+13.1f} {sum(objects.values()):+15.1f}  "
              + "  ".join(f"{name} {value:+.1f}" for name, value in largest))

    def mean_of(index: int) -> Dict[Any, float]:
        names = set().union(*(process[index] for process in per_process))
        return {name: statistics.fmean(process[index].get(name, 0.0) for process in per_process) for name in names}

    objects, functions = mean_of(1), mean_of(2)
    print("mean over the processes, +us per iteration, by shared object:")
    for name, value in sorted(objects.items(), key=lambda kv: -abs(kv[1]))[:8]:
        print(f"  {value:+8.1f}  {name}")
    print(f"by function (the {args.functions} largest differences):")
    for (library, function), value in sorted(functions.items(), key=lambda kv: -abs(kv[1]))[:args.functions]:
        print(f"  {value:+8.1f}  {library}  {function[:100]}")


if __name__ == "__main__":
    main()
