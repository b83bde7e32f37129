"""Wrapping a model for data-parallel training: DDP or FSDP2.

Called once, when a trainer is built (``DefaultTrainer.wrap_model``, the
plain ``Trainer``'s ``ddp=`` setting) or by a user's own script
(detectron2's ``create_ddp_model(model, **cfg.train.ddp)``). On one process
the model comes back unchanged, after its options were checked, so that a
setting means the same run on any world size. Starting and joining the
processes is ``launch.py``'s.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from treadle.config.train_keys import wrapper_options
from treadle.utils import comm

__all__ = ["create_ddp_model", "create_fsdp_model", "wrap_model", "check_optimizer_holds"]


def create_ddp_model(model: nn.Module, *, fp16_compression: bool = False, kind: str = "ddp", **kwargs: Any) -> nn.Module:
    """Wraps ``model`` in ``DistributedDataParallel`` when the world size is above one.

    Args:
        fp16_compression: all-reduce gradients in fp16 (halves the traffic).
        kind: ``"ddp"``, so that ``create_ddp_model(model, **cfg.train.ddp)``
            (detectron2's call) takes a treadle config's ``train.ddp``
            (whose FSDP options must then be at their defaults);
            ``"fsdp"`` is :func:`create_fsdp_model`'s.
        kwargs: passed to ``DistributedDataParallel`` (e.g. ``find_unused_parameters``).
    """
    if kind != "ddp":
        raise ValueError(f"create_ddp_model wraps in DDP (kind='ddp'); for kind={kind!r} use create_fsdp_model")
    kwargs = wrapper_options("ddp", kwargs)
    if comm.get_world_size() == 1:
        return model
    if torch.cuda.is_available() and next(model.parameters()).is_cuda:
        kwargs.setdefault("device_ids", [comm.get_local_rank()])
    if "broadcast_buffers" in kwargs and "forward_sync_buffers" in inspect.signature(
        nn.parallel.DistributedDataParallel.__init__
    ).parameters:
        # torch >= 2.13 renamed it (and warns on every rank). The new name also
        # syncs buffers once at wrapping, from rank 0, which every rank's
        # freshly initialized buffers (BatchNorm's zeros and ones) already equal.
        kwargs["forward_sync_buffers"] = kwargs.pop("broadcast_buffers")
    ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
    if fp16_compression:
        from torch.distributed.algorithms.ddp_comm_hooks import default as comm_hooks

        ddp.register_comm_hook(state=None, hook=comm_hooks.fp16_compress_hook)
    return ddp


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _fsdp_units(model: nn.Module) -> List[nn.Module]:
    """The submodules sharded as their own FSDP groups: each child with
    parameters, looking inside ``ModuleList``/``ModuleDict`` (which have no
    ``forward`` for FSDP's hooks to run in), but not children that share a
    parameter with another unit (tied weights): those stay with the root."""
    units: List[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                visit(child)
            elif next(child.parameters(), None) is not None:
                units.append(child)

    visit(model)
    owners: Dict[int, int] = {}
    for unit in units:
        for p in unit.parameters():
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [u for u in units if all(owners[id(p)] == 1 for p in u.parameters())]


def _fsdp_dtype(name: str, value: Union[None, str, torch.dtype]) -> Optional[torch.dtype]:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in _DTYPES:
        raise ValueError(f"{name} must be one of {sorted(_DTYPES)} or None, got {value!r}")
    return _DTYPES[value]


def create_fsdp_model(
    model: nn.Module,
    *,
    reshard_after_forward: bool = True,
    param_dtype: Union[None, str, torch.dtype] = None,
    reduce_dtype: Union[None, str, torch.dtype] = None,
    sync_module_states: bool = True,
) -> nn.Module:
    """Shards ``model`` with FSDP2 (``torch.distributed.fsdp.fully_shard``)
    when the world size is above one; returns it unchanged otherwise.

    Each child module with parameters (the blocks inside a ``ModuleList``)
    becomes its own FSDP group, then the root takes the remaining parameters.
    ``fully_shard`` changes the model in place (its class and parameters,
    which become ``DTensor`` shards); build the optimizer after this call.
    Works with gloo on CPU and NCCL on GPU. Checkpoints of the model are saved
    unsharded (see :mod:`treadle.checkpoint.fsdp`).

    Args:
        reshard_after_forward: free the gathered parameters after forward
            (less memory, one more all-gather in backward).
        param_dtype, reduce_dtype: mixed precision of the gathered parameters
            and of the gradient reduction: ``"bf16"``, ``"fp16"``, ``"fp32"`` or None.
        sync_module_states: first broadcast rank 0's parameters and buffers,
            so that every rank starts from the same weights whatever its seed
            (DDP does the same when it wraps a model).
    """
    # Checked first: a bad option fails on one process as on many.
    dtypes = {"param_dtype": _fsdp_dtype("param_dtype", param_dtype), "reduce_dtype": _fsdp_dtype("reduce_dtype", reduce_dtype)}
    if comm.get_world_size() == 1:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = MixedPrecisionPolicy(param_dtype=dtypes["param_dtype"], reduce_dtype=dtypes["reduce_dtype"])
    if sync_module_states:
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, src=0)
    for unit in _fsdp_units(model):
        fully_shard(unit, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    return model


def wrap_model(model: nn.Module, kind: str = "ddp", *, setting: str = "the model wrapper", **options: Any) -> nn.Module:
    """Wraps ``model`` for data-parallel training when the world size is above
    one: ``kind="ddp"`` in ``DistributedDataParallel`` (:func:`create_ddp_model`),
    ``"fsdp"`` sharded with FSDP2 (:func:`create_fsdp_model`), with ``options``
    as ``train.ddp`` names them. An unknown kind (named as ``setting`` in the
    error), or an option of the other kind set away from its default, is an
    error on one process as on many (a setting means the same run on any
    world size)."""
    if kind not in ("ddp", "fsdp"):
        raise ValueError(f"{setting} must be 'ddp' or 'fsdp', got {kind!r}")
    options = wrapper_options(kind, options)
    if kind == "fsdp":
        return create_fsdp_model(model, **options)  # checks its options; unchanged on one process
    return create_ddp_model(model, **options) if comm.get_world_size() > 1 else model


def check_optimizer_holds(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """FSDP2 replaces the model's parameters by shards: an optimizer built
    before would step tensors the model no longer uses."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not all(id(p) in held for p in model.parameters() if p.requires_grad):
        raise ValueError(
            "with ddp='fsdp' the model's parameters are replaced by shards, so this optimizer (built before) "
            "does not hold them: give the optimizer by name (optimizer='adamw', lr=...)"
        )
