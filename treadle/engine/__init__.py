"""The training loop, step objects and entry points."""

from treadle import hooks
from treadle.events import get_default_writers as default_writers
from treadle.hooks.base import HookBase

from .steps import PRECISIONS, CompiledStep, EagerStep, StepBase
from .build import build_optimizer, build_step, get_param_groups, resolve_scheduler
from .train_loop import HookOrderError, TrainerBase
from .simple_trainer import AMPTrainer, SimpleTrainer
from .trainer import Trainer, TrainingHistory
from .defaults import DefaultTrainer, default_argument_parser, default_setup
from .launch import create_ddp_model, launch

__all__ = [
    "hooks",
    "HookBase",
    "DefaultTrainer",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "launch",
    "create_ddp_model",
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
