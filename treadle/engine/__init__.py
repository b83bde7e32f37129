"""The training loop, step objects and entry points."""

from treadle.hooks.base import HookBase

from .steps import PRECISIONS, CompiledStep, EagerStep, StepBase
from .build import build_optimizer, build_step, get_param_groups, resolve_scheduler
from .train_loop import HookOrderError, TrainerBase
from .simple_trainer import AMPTrainer, SimpleTrainer
from .trainer import Trainer, TrainingHistory

__all__ = [
    "HookBase",
    "TrainerBase",
    "SimpleTrainer",
    "AMPTrainer",
    "HookOrderError",
    "StepBase",
    "EagerStep",
    "CompiledStep",
    "PRECISIONS",
    "Trainer",
    "TrainingHistory",
    "build_optimizer",
    "build_step",
    "get_param_groups",
    "resolve_scheduler",
]
