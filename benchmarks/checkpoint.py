"""What a checkpoint costs the training loop: synchronous versus asynchronous saves.

For each model size (an MLP of ~25M and ~300M parameters with AdamW state,
so the checkpoint is about 12 bytes per parameter), one process:

- **sync save**: ``Checkpointer.save`` end to end (state gathered, safety
  check, ``torch.save`` with checksums to a temporary file, fsync, rename,
  pointer): the time the loop is stopped, and the write throughput (MiB/s of
  checkpoint file per second of save).
- **async save, stall**: ``Checkpointer.save(asynchronous=True)``, the time
  until it returns (the state copied to host memory); the write goes on in a
  background thread. Then ``wait()`` for it, untimed against the stall. The
  first asynchronous save allocates the host copy (``first stall``); later
  ones copy into it (``stall``, the steady state of a run).
- **stall ratio**: steady async stall / sync save. The issue's target is at
  most 10% at 300M parameters.
- **extra host memory**: the peak growth of the process's resident set
  (Linux ``/proc``) during the first asynchronous save: the one copy of the
  state that the checkpointer then keeps for the next saves.

Run: ``python benchmarks/checkpoint.py`` (``--sizes 25 300`` in millions of
parameters, ``--repeats``; ``--dir`` for the disk to write to, default a
temporary directory). Figures are medians; the machine's load shows in them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from typing import Dict, List

import torch
from torch import nn

from treadle.checkpoint import Checkpointer


def build(params_millions: float):
    """An MLP of about ``params_millions`` million parameters, and AdamW with its state filled."""
    width = 2048
    layers = max(1, round(params_millions * 1e6 / (width * width + width)))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return model, optimizer


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples the resident set every millisecond in a thread, keeping the peak."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(params_millions: float, repeats: int, directory: str) -> Dict[str, float]:
    model, optimizer = build(params_millions)
    n_params = sum(p.numel() for p in model.parameters())
    checkpointer = Checkpointer(model, directory, optimizer=optimizer)
    sync_times: List[float] = []
    stalls: List[float] = []
    size = 0
    for i in range(repeats):
        start = time.perf_counter()
        path = checkpointer.save(f"sync_{i}")
        sync_times.append(time.perf_counter() - start)
        size = os.path.getsize(path)
        os.remove(path)

    def async_save(name: str) -> float:
        start = time.perf_counter()
        path = checkpointer.save(name, asynchronous=True)
        stall = time.perf_counter() - start
        checkpointer.wait()
        os.remove(path)
        return stall

    base = rss_bytes()
    with PeakRss() as peak:
        first_stall = async_save("async_first")
    extra = peak.peak - base
    for i in range(repeats):
        stalls.append(async_save(f"async_{i}"))
    sync = statistics.median(sync_times)
    stall = statistics.median(stalls)
    return {
        "params": n_params,
        "size_mib": size / 2**20,
        "sync_s": sync,
        "mib_per_s": size / 2**20 / sync,
        "first_stall_s": first_stall,
        "stall_s": stall,
        "ratio": stall / sync,
        "extra_mib": extra / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[25, 300], help="millions of parameters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for size in args.sizes:
            rows.append(measure(size, args.repeats, directory))
    print("checkpoint save, one process (medians of %d)" % args.repeats)
    print(
        f"{'params':>8} {'file MiB':>9} {'sync save s':>12} {'MiB/s':>8} {'first stall s':>14} "
        f"{'stall s':>8} {'stall/sync':>11} {'extra host MiB':>15}"
    )
    for r in rows:
        print(
            f"{r['params'] / 1e6:7.1f}M {r['size_mib']:9.0f} {r['sync_s']:12.3f} {r['mib_per_s']:8.0f} "
            f"{r['first_stall_s']:14.3f} {r['stall_s']:8.3f} {r['ratio']:10.1%} {r['extra_mib']:15.0f}"
        )


if __name__ == "__main__":
    main()
