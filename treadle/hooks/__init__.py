"""Hooks: code that runs around each training iteration.

One module per family; :class:`HookBase` is in ``base``.
"""

from .base import HookBase
from .callback import CallbackHook
from .checkpointing import BestCheckpointer, PeriodicCheckpointer
from .early_stopping import EarlyStopping
from .ema import EMA
from .evaluation import EvalHook
from .lr_scheduler import LRMonitor, LRMultiplier, LRScheduler
from .periods import Period
from .precise_bn import PreciseBN
from .preemption import PREEMPTED_EXIT_CODE, PreemptionHandler
from .progress import ProgressBar
from .profiling import TorchMemoryStats, TorchProfiler
from .summary import RunSummary
from .timing import IterationTimer
from .writing import PeriodicWriter

__all__ = [
    "HookBase",
    "CallbackHook",
    "IterationTimer",
    "LRScheduler",
    "LRMonitor",
    "LRMultiplier",
    "PeriodicWriter",
    "ProgressBar",
    "PeriodicCheckpointer",
    "BestCheckpointer",
    "EvalHook",
    "EarlyStopping",
    "EMA",
    "PreciseBN",
    "PreemptionHandler",
    "PREEMPTED_EXIT_CODE",
    "TorchProfiler",
    "TorchMemoryStats",
    "Period",
    "RunSummary",
]
