"""The training loop, step objects and entry points.

``DefaultTrainer``, ``default_argument_parser`` and ``default_setup`` (the
config-driven entry points) are imported when first used: a script that
builds ``TrainerBase`` in Python does not import OmegaConf.
The plain ``Trainer`` lives in :mod:`treadle.trainer`, above the engine: the
engine's own modules never import it, nor the layer of other trainers' names
under it (:mod:`treadle.compat`). ``treadle.engine.Trainer`` and the modules
that lived here before (``treadle.engine.trainer``...) still import, with a
``DeprecationWarning``, until the version their rows of
:mod:`treadle.utils.deprecations` name.
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

# Trainer: deprecated (treadle.utils.deprecations), imported when read.
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
    "TrainingHistory",
    "build_optimizer",
    "build_step",
    "get_param_groups",
    "resolve_scheduler",
]


lazy_exports(__name__, _LAZY)
keep_old_paths(__name__)
