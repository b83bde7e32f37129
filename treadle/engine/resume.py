"""A resumed run keeps the hyperparameters its config asks for.

Loading a checkpoint restores the optimizer's param groups (learning rate,
weight decay, momentum...) and the scheduler's base rates and settings, which
silently replaces what the config says: ``--resume optimizer.lr=0.5`` would
train on with the old rate. Here the config's values are taken before the
load and put back after it, each change reported in one warning naming the
key. The position (iteration, the schedule's progress, optimizer moments) is
the checkpoint's: a resume with an unchanged config is exact.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Sequence

import torch

from treadle.hooks.lr_scheduler import LRScheduler

__all__ = ["HyperparameterSnapshot", "take_hyperparameters", "restore_hyperparameters"]

logger = logging.getLogger(__name__)

# Param-group entries that are not hyperparameters, or (lr) that the schedule
# moves and which are compared through the base rate instead.
_NOT_SETTINGS = frozenset({"params", "lr", "initial_lr", "param_names"})


@dataclasses.dataclass
class HyperparameterSnapshot:
    """The config's hyperparameters, taken before a checkpoint is loaded."""

    groups: List[Dict[str, Any]]
    base_lrs: List[float]
    scheduler: Dict[str, Any]


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False  # tensor settings (capturable lr) are the checkpoint's
    try:
        return bool(_plain(a) != _plain(b))
    except Exception:  # noqa: BLE001 - values that cannot be compared are left alone
        return False


def _scheduler_hook(hooks: Sequence[Any]) -> Optional[LRScheduler]:
    return next((h for h in hooks if isinstance(h, LRScheduler)), None)


def _current_base_lrs(optimizer: torch.optim.Optimizer, hook: Optional[LRScheduler]) -> List[float]:
    from_hook = hook.base_lrs() if hook is not None else None
    if from_hook is not None and len(from_hook) == len(optimizer.param_groups):
        return [float(v) for v in from_hook]
    return [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]


def take_hyperparameters(optimizer: torch.optim.Optimizer, hooks: Sequence[Any]) -> HyperparameterSnapshot:
    """What the config set up, before a checkpoint replaces it."""
    hook = _scheduler_hook(hooks)
    return HyperparameterSnapshot(
        groups=[{k: _plain(v) for k, v in g.items() if k not in _NOT_SETTINGS} for g in optimizer.param_groups],
        base_lrs=_current_base_lrs(optimizer, hook),
        scheduler=dict(hook.settings()) if hook is not None else {},
    )


def _name(prefix: str, key: str, groups: List[int], total: int) -> str:
    where = "" if len(groups) == total else f" (param group{'s' if len(groups) > 1 else ''} {', '.join(map(str, groups))})"
    return f"{prefix}.{key}{where}"


def restore_hyperparameters(
    snapshot: HyperparameterSnapshot,
    optimizer: torch.optim.Optimizer,
    hooks: Sequence[Any],
    *,
    optimizer_key: str = "optimizer",
    scheduler_key: str = "lr_multiplier",
) -> List[str]:
    """Puts the snapshot's values back where a loaded checkpoint differs; returns
    the names changed (``optimizer.lr``...), each also logged as a warning.

    The learning rate is compared by its base rate (the rate the schedule
    multiplies): a changed base rate rescales the current, scheduled rate by
    the same factor, so the schedule goes on from where it was.
    """
    if len(snapshot.groups) != len(optimizer.param_groups):
        return []  # the loader reported the mismatch of groups already
    hook = _scheduler_hook(hooks)
    changed: Dict[str, List[int]] = {}
    values: Dict[str, Any] = {}
    loaded_base = _current_base_lrs(optimizer, hook)
    new_base = list(loaded_base)
    for i, (wanted, group) in enumerate(zip(snapshot.groups, optimizer.param_groups)):
        for key, value in wanted.items():
            if key in group and _differs(group[key], value):
                changed.setdefault(key, []).append(i)
                values[key] = (group[key], value)
                group[key] = type(group[key])(value) if isinstance(group[key], tuple) else value
        if _differs(loaded_base[i], snapshot.base_lrs[i]):
            changed.setdefault("lr", []).append(i)
            values["lr"] = (loaded_base[i], snapshot.base_lrs[i])
            old, new = loaded_base[i], snapshot.base_lrs[i]
            group["lr"] = group["lr"] * (new / old) if old else new
            if "initial_lr" in group:
                group["initial_lr"] = new
            new_base[i] = new
    if "lr" in changed and hook is not None:
        hook.set_base_lrs(new_base)
    names = []
    for key, groups in changed.items():
        name = _name(optimizer_key, key, groups, len(optimizer.param_groups))
        old, new = values[key]
        logger.warning(
            "Resuming with %s=%s from the config; the checkpoint has %s. The config's value is used.", name, new, old
        )
        names.append(name)
    if hook is not None and snapshot.scheduler:
        loaded = hook.settings()
        restore = {k: v for k, v in snapshot.scheduler.items() if k in loaded and _differs(loaded[k], v)}
        if restore:
            hook.set_settings(restore)
            for key, value in restore.items():
                name = f"{scheduler_key}.{key}"
                logger.warning(
                    "Resuming with %s=%s from the config; the checkpoint has %s. The config's value is used.",
                    name, value, loaded[key],
                )
                names.append(name)
    return names
