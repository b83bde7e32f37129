"""A plain torch job for torchrun restart trials: no treadle in its training.

    torchrun --standalone --nproc-per-node 2 --max-restarts 3 \
        tests/dist_scripts/plain_allreduce.py OUT_DIR [--steps N] [--kill-at K] [--setup torch|treadle]
        [--timeout S] [--rank1-delay S]

Each process joins the group (``--setup torch``: ``init_process_group("gloo",
init_method="env://")`` as the PyTorch tutorials do; ``--setup treadle``:
:func:`treadle.engine.launch.join_env_process_group`), then all-reduces a
counter ``--steps`` times. In the first attempt (``TORCHELASTIC_RESTART_COUNT``
0), rank 1 kills itself with SIGKILL at step ``--kill-at`` (as ``kill -9``
from outside would), so that torchrun restarts the group. Rank 0 writes
``OUT_DIR/result.txt`` with the final sum and the attempt that finished.
``--rank1-delay``: rank 1 sleeps that long before it joins (a test kills
torchrun meanwhile, leaving rank 0 waiting in the set-up).
"""

import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--setup", choices=("torch", "treadle"), default="torch")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds, the group's timeout")
    parser.add_argument("--rank1-delay", type=float, default=0.0, help="seconds rank 1 sleeps before joining")
    args = parser.parse_args()
    timeout = datetime.timedelta(seconds=args.timeout)
    if os.environ.get("RANK") == "1":
        time.sleep(args.rank1_delay)
    if args.setup == "torch":
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    else:
        from treadle.engine.launch import join_env_process_group

        join_env_process_group(timeout)
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    total = torch.zeros(1)
    for step in range(args.steps):
        if attempt == 0 and rank == 1 and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        value = torch.ones(1)
        dist.all_reduce(value)
        total += value
        time.sleep(0.002)
    if rank == 0:
        with open(os.path.join(args.out_dir, "result.txt"), "w") as f:
            f.write(f"{int(total.item())} {attempt}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
