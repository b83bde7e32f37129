"""The value rules of the plain ``Trainer``'s settings that the table of
``train.*`` keys has no use for (a loss function, metrics, hooks, callbacks,
loggers, the model wrapper, ``compile``, the device): each refuses a value
in one line naming the setting (a :class:`~treadle.config.errors.ConfigError`,
or a ``TypeError`` for a callback that cannot be called as treadle calls it).
The table (:mod:`treadle.trainer.settings`) names them in its rows."""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any

from treadle.config.errors import ConfigError
from treadle.config.rules import is_int, shown
from treadle.config.train_keys import check_options
from treadle.hooks import HookBase

from treadle.compat.names import check_call
from treadle.compat.events import is_event_callback

__all__ = ["LOGGERS", "FILE_LOGGERS", "check_epoch_callback", "callable_or_none", "sequence", "loss_fn", "metrics", "hooks", "callbacks", "bool_or_dict", "loggers", "ddp", "compile_options", "device", "seed"]

#: What ``loggers=`` may name: files written into the logs folder, and the
#: trackers (optional extras, with their defaults: MLflow's default store,
#: W&B online; give a writer object to choose).
LOGGERS = ("json", "tensorboard", "csv", "mlflow", "wandb")
#: The loggers of LOGGERS that write files into the logs folder.
FILE_LOGGERS = ("json", "tensorboard", "csv")


def callable_or_none(key: str, value: Any) -> None:
    """A function (``compute_loss``, ``collate_fn``...) or None."""
    if value is not None and not callable(value):
        raise ConfigError(f"{key} must be a function or None, got {type(value).__name__}")


def sequence(key: str, value: Any) -> None:
    """A list or another iterable of entries, not a string or a dict."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"{key} must be a list, got {shown(value)}")


def _as_code(cls: type) -> str:
    """How a user's code names ``cls``: ``nn.CrossEntropyLoss`` for torch's modules."""
    return f"nn.{cls.__name__}" if cls.__module__.startswith("torch.nn.") else cls.__name__


def loss_fn(key: str, value: Any) -> None:
    """A loss module's class, which would be called as ``CrossEntropyLoss(outputs, targets)``
    (its constructor) and fail at the first iteration, is refused."""
    from torch import nn

    if isinstance(value, type) and issubclass(value, nn.Module):
        raise ConfigError(f"{key}={_as_code(value)} is a class: give an instance, {key}={_as_code(value)}()")


def metrics(key: str, value: Any) -> None:
    """A list; a function (the Hugging Face ``compute_metrics``) and a metric's class are pointed to what
    evaluation takes."""
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        raise ConfigError(
            f"{key}={getattr(value, '__name__', 'partial')} is a function, which treadle does not call (Hugging Face's "
            "compute_metrics(eval_pred)): give metric names (metrics=['accuracy', 'f1']), torchmetrics objects or "
            "DatasetEvaluators; a function of your own is registered as a metric (register_metric, docs/evaluation.md)"
        )
    sequence(key, value)
    for metric in value:
        if isinstance(metric, type):
            raise ConfigError(f"{key}: {metric.__name__} is a class: give an instance, {key}=[{metric.__name__}(...)]")


def hooks(key: str, value: Any) -> None:
    """Each entry a hook instance; a callback (a function, an object with
    on_* events) is pointed to ``callbacks=``."""
    sequence(key, value)
    for hook in value:
        if isinstance(hook, HookBase):
            continue
        name = getattr(hook, "__name__", type(hook).__name__)
        if isinstance(hook, type) and issubclass(hook, HookBase):
            raise ConfigError(f"{key}: {name} is a class: give an instance, {key}=[{name}(...)]")
        if callable(hook) or is_event_callback(hook):
            given = f"{name}()" if isinstance(hook, type) or is_event_callback(hook) else name
            given = "..." if given.startswith("<") else given  # a lambda
            raise ConfigError(f"{key}: {name} is a callback, not a hook (HookBase): give it as callbacks=[{given}] "
                              "(fn(trainer, epoch, metrics) at each epoch's end, or an object with "
                              "pytorch-accelerated's on_* events)")
        raise ConfigError(f"{key} must be hooks (HookBase instances), got {type(hook).__name__}: {hook!r}")


def check_epoch_callback(fn: Any, where: str = "callbacks") -> None:
    """Refuses, in one line, what :class:`~treadle.engine.history.EpochHistory` could not call as
    ``fn(trainer, epoch, metrics)`` at an epoch's end: checked when the
    trainer is built, not after its first epoch trained. ``where`` names the
    setting it was given in."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if isinstance(fn, type):
        # Called, a class would only be built with (trainer, epoch, metrics): its instance was meant.
        raise TypeError(f"{where}: {name} is a class: give an instance, {where}=[{name}()] (a callback object's "
                        "on_* events are called with the trainer)")
    if isinstance(fn, HookBase):
        raise TypeError(f"{where}: {name} is a hook (HookBase): give it as hooks=[{name}(...)]")
    if not callable(fn):
        raise TypeError(f"{where} must be functions fn(trainer, epoch, metrics) or objects with pytorch-accelerated's "
                        f"on_* events, got {fn!r}")
    check_call(f"{where}: {name}", fn, ("trainer", "epoch", "metrics"), {},
               "qurious' callback at each epoch's end; or an object with pytorch-accelerated's on_* events")


def callbacks(key: str, value: Any) -> None:
    """Each entry callable as the ``Trainer`` calls it (see :func:`check_epoch_callback`;
    an object's on_* events are checked with the subclass's overrides)."""
    sequence(key, value)
    for fn in value:
        if not is_event_callback(fn):
            check_epoch_callback(fn, key)


def bool_or_dict(key: str, value: Any) -> None:
    """True, False, or a dict of options."""
    if not isinstance(value, (bool, dict)):
        raise ConfigError(f"{key} must be True, False or a dict of options, got {shown(value)}")


def loggers(key: str, value: Any) -> None:
    """Names of :data:`LOGGERS`, or writer objects."""
    sequence(key, value)
    from treadle.events import EventWriter

    unknown = [name for name in value if not isinstance(name, EventWriter) and name not in LOGGERS]
    if unknown:
        raise ConfigError(f"Unknown loggers {unknown}; choose from {list(LOGGERS)}")


def ddp(key: str, value: Any) -> None:
    """The model wrapper for several processes: ``"ddp"``, ``"fsdp"`` or a dict of ``train.ddp`` options."""
    kind = value.get("kind", "ddp") if isinstance(value, Mapping) else value
    if not isinstance(value, (str, Mapping)):
        raise ConfigError(f"{key} must be 'ddp', 'fsdp' or a dict of train.ddp options, got {shown(value)}")
    if kind not in ("ddp", "fsdp"):
        raise ConfigError(f"{key}: the model wrapper must be 'ddp' or 'fsdp', got {kind!r}")
    if isinstance(value, Mapping):  # also on one process, where nothing is wrapped: said before a job uses it
        check_options(key, value, "ddp")


def compile_options(key: str, value: Any) -> None:
    """``compile``: True, False, or a dict of ``torch.compile``'s options (``train.step.compile``'s)."""
    bool_or_dict(key, value)
    if isinstance(value, dict):  # CompiledStep's: torch.compile's options
        check_options(key, value, "step.compile", more={"options": _options_dict})
        if value.get("mode") is not None and value.get("options") is not None:
            raise ConfigError(f"{key}: torch.compile takes either mode or options, not both")


def _options_dict(key: str, value: Any) -> None:
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{key} must be a dict of inductor options or None, got {shown(value)}")


def device(key: str, value: Any) -> None:
    """A device that exists here; said as every entry point says it (:func:`~treadle.utils.device.resolve_device`)."""
    from treadle.utils.device import resolve_device

    if not isinstance(value, str) and type(value).__name__ != "device":
        raise ConfigError(f"{key} must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {shown(value)}")
    try:
        resolve_device(value)
    except RuntimeError:  # torch's own "Expected one of cpu, cuda, ..."
        raise ConfigError(f"{key}={str(value)!r} is not a device; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from None


def seed(key: str, value: Any) -> None:
    """An integer, or None (not seeded)."""
    if not is_int(value):
        raise ConfigError(f"{key} must be an integer or None, got {shown(value)}")
