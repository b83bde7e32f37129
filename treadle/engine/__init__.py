"""The training loop, step objects and entry points."""

from treadle.hooks.base import HookBase

from .steps import PRECISIONS, CompiledStep, EagerStep, StepBase
from .train_loop import HookOrderError, TrainerBase

__all__ = [
    "HookBase",
    "TrainerBase",
    "HookOrderError",
    "StepBase",
    "EagerStep",
    "CompiledStep",
    "PRECISIONS",
]
