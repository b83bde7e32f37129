"""Process-group helpers that are safe to call whether or not
``torch.distributed`` is initialized.

Without an initialized process group every function behaves as in a world of
one process: rank 0, world size 1, gathers return a one-element list and
barriers return at once. None of these functions belongs in the per-iteration
path: each is a collective (or a no-op), called at flush, evaluation or
checkpoint time.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

__all__ = [
    "is_distributed",
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_local_size",
    "is_main_process",
    "synchronize",
    "all_gather",
    "all_gather_tensor",
    "gather",
    "reduce_dict",
    "broadcast_object",
    "shared_random_seed",
]


def is_distributed() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """The number of processes in the default group (1 when not distributed)."""
    return dist.get_world_size() if is_distributed() else 1


def get_rank() -> int:
    """This process's rank in the default group (0 when not distributed)."""
    return dist.get_rank() if is_distributed() else 0


def get_local_rank() -> int:
    """Rank of this process within its machine.

    Taken from ``LOCAL_RANK`` (set by torchrun and by :func:`treadle.engine.launch`);
    0 when not distributed. A process group started without ``LOCAL_RANK``
    is taken to run on one machine: its local rank is then its global rank.
    """
    if not is_distributed():
        return 0
    # Not 0: every process would pick the first GPU.
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def get_local_size() -> int:
    """Number of processes on this machine (``LOCAL_WORLD_SIZE``)."""
    if not is_distributed():
        return 1
    return int(os.environ.get("LOCAL_WORLD_SIZE", get_world_size()))


def is_main_process() -> bool:
    """Whether this is rank 0, the process that writes files and logs."""
    return get_rank() == 0


def synchronize() -> None:
    """Barrier across all processes; a no-op in a world of one."""
    if get_world_size() <= 1:
        return
    if dist.get_backend() == dist.Backend.NCCL and torch.cuda.is_available():
        # Naming the device avoids NCCL guessing it from the rank, which is
        # wrong when devices are remapped with CUDA_VISIBLE_DEVICES.
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_gather(data: Any, group: Optional[dist.ProcessGroup] = None) -> List[Any]:
    """Gathers a picklable object from every rank; returns the list in rank order."""
    if get_world_size() <= 1:
        return [data]
    world = dist.get_world_size(group)
    output: List[Any] = [None] * world
    dist.all_gather_object(output, data, group=group)
    return output


def all_gather_tensor(tensor: torch.Tensor) -> List[torch.Tensor]:
    """Gathers a tensor of the same shape from every rank, on its device."""
    if get_world_size() <= 1:
        return [tensor]
    output = [torch.empty_like(tensor) for _ in range(get_world_size())]
    dist.all_gather(output, tensor.contiguous())
    return output


def gather(data: Any, dst: int = 0) -> List[Any]:
    """Gathers a picklable object on rank ``dst``; other ranks get ``[]``."""
    if get_world_size() <= 1:
        return [data]
    if get_rank() == dst:
        output: List[Any] = [None] * get_world_size()
        dist.gather_object(data, output, dst=dst)
        return output
    dist.gather_object(data, None, dst=dst)
    return []


def reduce_dict(values: Dict[str, torch.Tensor], average: bool = True) -> Dict[str, torch.Tensor]:
    """All-reduces a dict of same-device scalar tensors in one collective.

    Every rank must pass the same keys. Keys are sorted so that ranks agree on
    the order whatever order the dict was built in.
    """
    if get_world_size() <= 1 or not values:
        return dict(values)
    names = sorted(values)
    stacked = torch.stack([values[k].detach().reshape(()).float() for k in names])
    dist.all_reduce(stacked)
    if average:
        stacked /= get_world_size()
    return dict(zip(names, stacked.unbind(0)))


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Returns rank ``src``'s ``obj`` on every rank."""
    if get_world_size() <= 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def shared_random_seed() -> int:
    """A random seed drawn on rank 0 and shared by all ranks."""
    import numpy as np

    return int(broadcast_object(int(np.random.randint(2**31))))
