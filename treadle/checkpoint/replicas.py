"""Whether every rank holds the same weights of each module a checkpoint saves.

With several processes only the main process writes a checkpoint: a module
whose weights differ across ranks (a second model that was never wrapped
in DDP, each rank seeded ``seed + rank``) would be saved as rank 0's, and
the run would go on training a different module on each rank. The
:class:`~treadle.checkpoint.Checkpointer` checks once, at its first save
on several processes (every rank saves together), with one gather of two
float64 numbers per module.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from treadle.utils import comm

from .key_matching import unwrap_model
from .serialization import CheckpointError

__all__ = ["ReplicasDifferError", "check_replicas_agree", "weights_fingerprint"]


class ReplicasDifferError(CheckpointError):
    """A module to be checkpointed has other weights on other ranks, so the
    checkpoint would keep rank 0's; refused before the file is written."""


def _sharded_tensor_type() -> Optional[type]:
    # A DTensor exists only once its module was imported: never import it here.
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def weights_fingerprint(module: nn.Module) -> Optional[Tuple[float, float]]:
    """The float64 sum and sum of squares of ``module``'s parameters that are
    whole on this rank (FSDP's shards, which differ by design, and meta
    tensors left out); ``None`` when it has none. Reads the device once per
    device the parameters are on."""
    sharded = _sharded_tensor_type()
    per_device: Dict[torch.device, List[torch.Tensor]] = {}
    for p in unwrap_model(module).parameters():
        if (sharded is not None and isinstance(p, sharded)) or p.device.type == "meta":
            continue
        value = p.detach()
        value = torch.view_as_real(value) if value.is_complex() else value
        value = value.to(torch.float64)
        per_device.setdefault(p.device, []).append(torch.stack([value.sum(), value.square().sum()]))
    if not per_device:
        return None
    total = torch.stack([torch.stack(sums).sum(0).cpu() for sums in per_device.values()]).sum(0)
    first, second = total.tolist()
    return first, second


def check_replicas_agree(modules: Mapping[str, nn.Module]) -> None:
    """Refuses, on every rank, a module whose weights differ across ranks.

    A collective: every rank calls it with the same names. Nothing to do on
    one process.

    Raises:
        ReplicasDifferError: naming the first such module and how to wrap it.
    """
    if comm.get_world_size() <= 1:
        return
    mine = {name: weights_fingerprint(module) for name, module in modules.items()}
    ranks = comm.all_gather(mine)
    for name in modules:
        reference = ranks[0].get(name)
        for rank, theirs in enumerate(ranks[1:], start=1):
            if not _same_fingerprint(reference, theirs.get(name)):
                raise ReplicasDifferError(
                    f"The weights of '{name}' differ between rank 0 and rank {rank} at the first checkpoint, which "
                    f"would keep rank 0's: wrap it for data-parallel training as the model is "
                    f"(self.wrap_model(cfg, {name}) in a DefaultTrainer, treadle.engine.create_ddp_model({name}) "
                    "elsewhere), so that every rank starts from rank 0's weights and averages its gradients."
                )


def _same_fingerprint(a: Optional[Tuple[float, float]], b: Optional[Tuple[float, float]]) -> bool:
    if a is None or b is None:
        return a is b
    # The same tensors summed in the same order give the same numbers; a
    # relative tolerance still lets devices of two kinds round alike.
    return all(abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1.0) for x, y in zip(a, b))
