"""The training loop, step objects and entry points.

``DefaultTrainer``, ``default_argument_parser`` and ``default_setup`` (the
config-driven entry points) are imported when first used: a script that
builds ``TrainerBase`` or ``Trainer`` in Python does not import OmegaConf.
The plain ``Trainer`` lives in :mod:`treadle.trainer`, above the engine, and
is imported from there when first read: the engine's own modules never
import it, nor the layer of other trainers' names under it
(:mod:`treadle.compat`).
"""

from typing import TYPE_CHECKING

from treadle import hooks
from treadle.events import get_default_writers as default_writers
from treadle.hooks.base import HookBase
from treadle.utils.lazy_exports import lazy_exports
from treadle.utils.moved_modules import keep_old_paths

from .steps import PRECISIONS, CompiledStep, EagerStep, StepBase
from .update import Update
from treadle.solver import build_optimizer, get_param_groups

from .build import build_step, resolve_scheduler
from .train_loop import HookOrderError, TrainerBase
from .simple_trainer import AMPTrainer, SimpleTrainer
from .history import TrainingHistory
from .launch import GROUP_LOST_EXIT_CODE, launch
from .data_parallel import create_ddp_model

if TYPE_CHECKING:
    from .defaults import DefaultTrainer, default_argument_parser, default_setup

_LAZY = {"DefaultTrainer": "defaults", "default_argument_parser": "defaults", "default_setup": "defaults",
         "Trainer": "treadle.trainer.trainer"}

__all__ = [
    "hooks",
    "HookBase",
    "DefaultTrainer",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "launch",
    "create_ddp_model",
    "GROUP_LOST_EXIT_CODE",
    "TrainerBase",
    "SimpleTrainer",
    "AMPTrainer",
    "HookOrderError",
    "StepBase",
    "EagerStep",
    "CompiledStep",
    "Update",
    "PRECISIONS",
    "Trainer",
    "TrainingHistory",
    "build_optimizer",
    "build_step",
    "get_param_groups",
    "resolve_scheduler",
]


lazy_exports(__name__, _LAZY)
# Where the plain Trainer's modules and the other trainers' names lived before
# they left the engine: user code importing them there keeps working, warned
# that the old paths go in 0.10 (0.8 and 0.9 keep them).
keep_old_paths({
    "treadle.engine.trainer": "treadle.trainer.trainer",
    "treadle.engine.trainer_settings": "treadle.trainer.settings",
    "treadle.engine.trainer_data": "treadle.trainer.data",
    "treadle.engine.trainer_eval": "treadle.trainer.evaluation",
    "treadle.engine.seed_names": "treadle.compat.names",
    "treadle.engine.seed_overrides": "treadle.compat.overrides",
}, gone={"treadle.engine.seed_pages": "the pages generator is the documentation tool tools/seed_pages.py"},
    removed_in="0.10")
