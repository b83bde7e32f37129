"""A hook made of plain functions."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .base import HookBase, TrainerProtocol

__all__ = ["CallbackHook"]

Callback = Optional[Callable[[TrainerProtocol], Any]]


class CallbackHook(HookBase):
    """Calls the given functions with the trainer at the matching stages.

    The callbacks are kept after training, so the hook works again in a
    second ``train()``.
    """

    def __init__(
        self,
        *,
        before_train: Callback = None,
        after_train: Callback = None,
        before_epoch: Callback = None,
        before_step: Callback = None,
        after_backward: Callback = None,
        after_step: Callback = None,
        after_epoch: Callback = None,
    ) -> None:
        self._callbacks = {
            "before_train": before_train,
            "after_train": after_train,
            "before_epoch": before_epoch,
            "before_step": before_step,
            "after_backward": after_backward,
            "after_step": after_step,
            "after_epoch": after_epoch,
        }
        for stage, fn in self._callbacks.items():
            if fn is not None and not callable(fn):
                raise TypeError(f"CallbackHook: {stage} must be callable, got {type(fn).__name__}")

    def overrides(self, stage: str) -> bool:
        return self._callbacks.get(stage) is not None

    def _call(self, stage: str) -> None:
        fn = self._callbacks[stage]
        if fn is not None:
            fn(self.trainer)

    def before_train(self) -> None:
        self._call("before_train")

    def after_train(self) -> None:
        self._call("after_train")

    def before_epoch(self) -> None:
        self._call("before_epoch")

    def before_step(self) -> None:
        self._call("before_step")

    def after_backward(self) -> None:
        self._call("after_backward")

    def after_step(self) -> None:
        self._call("after_step")

    def after_epoch(self) -> None:
        self._call("after_epoch")
