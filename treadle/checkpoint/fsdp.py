"""Checkpoints of FSDP2 (``fully_shard``) models in the plain, unsharded format.

A model sharded with :func:`torch.distributed.fsdp.fully_shard` holds each
parameter as a ``DTensor`` of which every rank keeps one shard, and so does
its optimizer state. treadle writes such a model the way it writes any other:
one file, on the main process, holding the *full* tensors under the names of
the unwrapped model, and the optimizer state in ``torch.optim.Optimizer``'s
own format (integer parameter ids in ``param_groups`` order). So:

- a checkpoint of an FSDP run loads into a plain or DDP model (weights and
  optimizer), and resumes a run on any world size;
- a plain or DDP checkpoint loads into an FSDP model: every rank reads the
  file and keeps its own shard of each tensor (no communication).

Gathering a full tensor is a collective: the functions that gather must be
called on every rank, in the same order. ``Checkpointer.save`` does so for an
FSDP model (every rank calls it; only the main process writes). The full
tensors are moved to the CPU one at a time and kept on the main process only,
so the peak memory of a save is one full tensor per device.

Per-rank (sharded) checkpoints, as ``torch.distributed.checkpoint`` writes
them, are not what treadle saves: a single file is simpler to resume from on
another world size and to load for evaluation; its cost is that the main
process holds the whole state in CPU memory while saving.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any, Dict, Mapping

import torch
from torch import nn

from treadle.utils import comm
from treadle.utils.torch_internals import set_state_dict_metadata, state_dict_metadata

__all__ = [
    "is_fsdp_model",
    "full_model_state_dict",
    "full_optimizer_state_dict",
    "shard_model_state_dict",
    "load_full_optimizer_state_dict",
]


def is_fsdp_model(model: nn.Module) -> bool:
    """True when ``model`` was sharded by FSDP2's ``fully_shard`` (its root)."""
    # An FSDP model implies its module was imported; never import it here.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None)
    return cls is not None and isinstance(model, cls)


def _dtensor_type() -> Any:  # the class, typed loosely: isinstance() then narrows nothing
    from torch.distributed.tensor import DTensor

    return DTensor


def _gathered(value: Any, keep: bool) -> Any:
    """The full tensor of a DTensor (a collective), on the CPU where ``keep``."""
    if isinstance(value, _dtensor_type()):
        value = value.full_tensor()
    if not keep:
        return None
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def full_model_state_dict(model: nn.Module) -> Dict[str, Any]:
    """The unsharded ``state_dict`` of an FSDP model, on the CPU, on the main process.

    A collective: call it on every rank. Other ranks get ``{}``. Keys and module
    versions (``_metadata``) are those of the model's own ``state_dict``.
    """
    state = model.state_dict()
    keep = comm.is_main_process()
    out: "OrderedDict[str, Any]" = OrderedDict()
    for key, value in state.items():  # the same order on every rank
        full = _gathered(value, keep)
        if keep:
            out[key] = full
    metadata = state_dict_metadata(state)
    if keep and metadata is not None:
        set_state_dict_metadata(out, metadata)
    return out


def full_optimizer_state_dict(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded state gathered, on the main process.

    The format is the optimizer's own (integer ids in ``param_groups`` order),
    so it loads into the same optimizer over the unwrapped model. A
    collective: call it on every rank. Other ranks get ``{}``.
    """
    state = optimizer.state_dict()
    keep = comm.is_main_process()
    gathered: Dict[int, Dict[str, Any]] = {}
    # Sorted: every rank gathers the same tensors in the same order. New dicts:
    # state_dict() shares the per-parameter dicts with the live optimizer.
    for index in sorted(state["state"]):
        per_param = state["state"][index]
        gathered[index] = {key: _gathered(per_param[key], keep) for key in sorted(per_param)}
    if not keep:
        return {}
    return {"state": gathered, "param_groups": state["param_groups"]}


def _shard_like(value: Any, reference: Any) -> Any:
    """``value`` (a full tensor) as this rank's shard of a DTensor placed like ``reference``."""
    if not isinstance(reference, _dtensor_type()) or not isinstance(value, torch.Tensor):
        return value
    if isinstance(value, _dtensor_type()):
        return value
    if tuple(value.shape) != tuple(reference.shape):
        raise ValueError(
            f"cannot shard a tensor of shape {tuple(value.shape)} like a parameter of shape "
            f"{tuple(reference.shape)}"
        )
    from torch.distributed.tensor import distribute_tensor

    # src_data_rank=None: every rank holds the full tensor (each read the file)
    # and keeps its own slice; nothing is sent.
    return distribute_tensor(
        value.to(device=reference.device, dtype=reference.dtype),
        reference.device_mesh,
        reference.placements,
        src_data_rank=None,
    )


def shard_model_state_dict(model: nn.Module, state: Mapping[str, Any]) -> "OrderedDict[str, Any]":
    """``state`` (full tensors keyed like ``model.state_dict()``) with each
    tensor of a sharded entry replaced by this rank's shard, ready for
    ``model.load_state_dict``. No communication; ``_metadata`` is kept."""
    own = model.state_dict()
    out: "OrderedDict[str, Any]" = OrderedDict(
        (key, _shard_like(value, own[key]) if key in own else value) for key, value in state.items()
    )
    metadata = state_dict_metadata(state)
    if metadata is not None:
        set_state_dict_metadata(out, metadata)
    return out


def load_full_optimizer_state_dict(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Loads an unsharded optimizer state (the optimizer's own format) into an
    optimizer of an FSDP model: each state tensor shaped like its parameter
    becomes this rank's shard. No communication.

    Raises:
        ValueError: the state's parameter groups do not match the optimizer's.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_groups = state.get("param_groups", [])
    if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in optimizer.param_groups]:
        raise ValueError(
            "the optimizer state has parameter groups of sizes "
            f"{[len(g['params']) for g in saved_groups]}, but the optimizer has "
            f"{[len(g['params']) for g in optimizer.param_groups]}"
        )
    # Saved ids follow param_groups order, like Optimizer.state_dict numbers them.
    id_to_param = {
        saved_id: param
        for saved_group, group in zip(saved_groups, optimizer.param_groups)
        for saved_id, param in zip(saved_group["params"], group["params"])
    }
    if len(id_to_param) != len(params):
        raise ValueError("the optimizer state names a parameter id twice")
    sharded = {
        index: {
            # An id the optimizer does not have is left to load_state_dict's own error.
            key: value if key == "step" or index not in id_to_param else _shard_like(value, id_to_param[index])
            for key, value in per_param.items()
        }
        for index, per_param in state.get("state", {}).items()
    }
    optimizer.load_state_dict({"state": sharded, "param_groups": saved_groups})
