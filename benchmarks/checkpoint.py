"""What a checkpoint costs the training loop: synchronous versus asynchronous
saves, one file versus a sharded DCP directory, one process versus two.

For each model size (an MLP of ~25M and ~300M parameters with AdamW state,
so the checkpoint is about 12 bytes per parameter), each format
(``--formats file dcp``) and each number of processes (``--processes 1 2``;
two are gloo processes on this machine, the model sharded by FSDP2's
``fully_shard``):

- **sync save**: ``Checkpointer.save`` end to end, as the loop sees it
  (state collected, safety check, the write with checksums, fsync, rename or
  publication, pointer): the time the loop is stopped, and the write
  throughput (MiB of checkpoint per second of save, all ranks together).
- **async save, stall**: ``Checkpointer.save(asynchronous=True)``, the time
  until it returns (the state copied to host memory); the write goes on in a
  background thread. Then ``wait()`` for it, untimed against the stall. The
  first asynchronous save allocates the host copy (``first stall``); later
  ones copy into it (``stall``, the steady state of a run). With two
  processes, the slowest rank's time.
- **stall ratio**: steady async stall / sync save. The issue's target is at
  most 10% at 300M parameters.
- **extra host memory**: the peak growth of a process's resident set
  (Linux ``/proc``) during the first asynchronous save (the largest rank's):
  the one copy of the rank's own state that the checkpointer then keeps for
  the next saves.

With two processes and the ``file`` format every rank's shards are gathered
onto rank 0, which writes one file (today's default without FSDP); ``dcp``
writes one file per rank, in parallel, and no rank holds the full state.

Run: ``python benchmarks/checkpoint.py`` (``--sizes 25 300`` in millions of
parameters, ``--repeats``, ``--formats``, ``--processes``; ``--dir`` for the
disk to write to, default a temporary directory; ``--device cuda`` for a
model and optimizer state on the GPU, whose asynchronous save copies them to
pinned host memory, one process). Figures are medians; the
machine's load shows in them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from treadle.checkpoint import Checkpointer


def build(params_millions: float, shard: bool = False, device: str = "cpu"):
    """An MLP of about ``params_millions`` million parameters on ``device``
    (each layer and the whole sharded by FSDP2 with ``shard``), and AdamW
    with its state filled."""
    width = 2048
    layers = max(1, round(params_millions * 1e6 / (width * width + width)))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    if shard:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
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


def _size_on_disk(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    return os.path.getsize(path)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def measure(model: nn.Module, optimizer: torch.optim.Optimizer, fmt: str, repeats: int, directory: str) -> Dict[str, float]:
    """This process's figures for one format (every rank calls it, in step)."""
    checkpointer = Checkpointer(model, directory, format=fmt, optimizer=optimizer)
    main = not dist.is_initialized() or dist.get_rank() == 0

    def timed(name: str, asynchronous: bool) -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the GPU's pending work is not the save's
        _barrier()  # every rank starts together: the time is the loop's, not a wait for a late rank
        start = time.perf_counter()
        checkpointer.save(name, asynchronous=asynchronous)
        elapsed = time.perf_counter() - start
        checkpointer.wait()
        _barrier()
        return elapsed

    sync_times: List[float] = []
    size = 0
    for i in range(repeats):
        sync_times.append(timed(f"sync_{i}", False))
        path = checkpointer.filename_for(f"sync_{i}")
        if main:
            size = _size_on_disk(os.path.join(directory, path))
            _remove(os.path.join(directory, path))
    base = rss_bytes()
    with PeakRss() as peak:
        first_stall = timed("async_first", True)
    extra = peak.peak - base
    stalls = [timed(f"async_{i}", True) for i in range(repeats)]
    _barrier()
    if main:
        for name in os.listdir(directory):
            if name.startswith(("async_", "last_checkpoint")):
                _remove(os.path.join(directory, name))
    _barrier()
    return {
        "size_mib": size / 2**20,
        "sync_s": statistics.median(sync_times),
        "first_stall_s": first_stall,
        "stall_s": statistics.median(stalls),
        "extra_mib": extra / 2**20,
    }


def _combine(per_rank: List[Dict[str, float]], n_params: int, fmt: str, processes: int) -> Dict[str, float]:
    """The loop waits for its slowest rank; memory is per process."""
    row = {key: max(r[key] for r in per_rank) for key in ("sync_s", "first_stall_s", "stall_s", "extra_mib")}
    row.update(params=n_params, format=fmt, processes=processes, size_mib=per_rank[0]["size_mib"])
    row["mib_per_s"] = row["size_mib"] / row["sync_s"]
    row["ratio"] = row["stall_s"] / row["sync_s"]
    return row


def _worker(rank: int, world: int, port: int, sizes: List[float], formats: List[str], repeats: int,
            directory: str, results: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = []
        for size in sizes:
            torch.manual_seed(0)
            model, optimizer = build(size, shard=True)
            n_params = sum(p.numel() for p in model.parameters())
            for fmt in formats:
                mine = measure(model, optimizer, fmt, repeats, directory)
                gathered: List[Dict[str, float]] = [{} for _ in range(world)]
                dist.all_gather_object(gathered, mine)
                rows.append(_combine(gathered, n_params, fmt, world))
            del model, optimizer
        if rank == 0:
            with open(results, "w") as f:
                json.dump(rows, f)
    finally:
        dist.destroy_process_group()


def run_processes(world: int, sizes: List[float], formats: List[str], repeats: int, directory: str) -> List[Dict[str, float]]:
    from treadle.engine.launch import find_free_port

    results = os.path.join(directory, "results.json")
    mp.spawn(_worker, args=(world, find_free_port(), sizes, formats, repeats, directory, results), nprocs=world)
    with open(results) as f:
        rows = json.load(f)
    os.remove(results)
    return rows


def run_one_process(sizes: List[float], formats: List[str], repeats: int, directory: str,
                    device: str = "cpu") -> List[Dict[str, float]]:
    rows = []
    for size in sizes:
        model, optimizer = build(size, device=device)
        n_params = sum(p.numel() for p in model.parameters())
        for fmt in formats:
            rows.append(_combine([measure(model, optimizer, fmt, repeats, directory)], n_params, fmt, 1))
        del model, optimizer
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[25, 300], help="millions of parameters")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=["file", "dcp"], choices=["file", "dcp"])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the model and optimizer state live (cuda: one process only)")
    args = parser.parse_args()
    if args.device == "cuda" and (not torch.cuda.is_available() or args.processes != [1]):
        parser.error("--device cuda needs a CUDA device and --processes 1")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for processes in args.processes:
            if processes == 1:
                torch.set_num_threads(max(1, os.cpu_count() or 1))
                rows += run_one_process(args.sizes, args.formats, args.repeats, directory, args.device)
            else:
                rows += run_processes(processes, args.sizes, args.formats, args.repeats, directory)
    print("checkpoint save of a model on %s (medians of %d; with several processes, the slowest rank)"
          % (args.device, args.repeats))
    print(
        f"{'params':>8} {'procs':>5} {'format':>6} {'MiB':>6} {'sync save s':>12} {'MiB/s':>7} "
        f"{'first stall s':>14} {'stall s':>8} {'stall/sync':>11} {'extra host MiB/proc':>20}"
    )
    for r in rows:
        print(
            f"{r['params'] / 1e6:7.1f}M {r['processes']:5d} {r['format']:>6} {r['size_mib']:6.0f} {r['sync_s']:12.3f} "
            f"{r['mib_per_s']:7.0f} {r['first_stall_s']:14.3f} {r['stall_s']:8.3f} {r['ratio']:10.1%} "
            f"{r['extra_mib']:20.0f}"
        )


if __name__ == "__main__":
    main()
