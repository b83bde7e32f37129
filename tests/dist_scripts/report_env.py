"""Reports what :func:`treadle.engine.launch.launch` gave each process.

    python tests/dist_scripts/report_env.py OUT_DIR [--num-gpus N]
    python -m torch.distributed.run --nproc-per-node N tests/dist_scripts/report_env.py OUT_DIR

Each process writes ``OUT_DIR/rank{R}.json``: its rank, world size, local
rank and size, backend, ``RANK`` variable, and an all_gather of the ranks
(which only a working process group returns).
"""

import argparse
import json
import os

import torch.distributed as dist

from treadle.engine.launch import launch
from treadle.utils import comm


def report(out_dir: str) -> None:
    rank = comm.get_rank()
    data = {
        "rank": rank,
        "world": comm.get_world_size(),
        "local_rank": comm.get_local_rank(),
        "local_size": comm.get_local_size(),
        "backend": dist.get_backend() if comm.is_distributed() else None,
        "env_rank": os.environ.get("RANK"),
        "gathered": comm.all_gather(rank),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(data, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--num-gpus", type=int, default=1)
    args = parser.parse_args()
    launch(report, args.num_gpus, args=(args.out_dir,))
