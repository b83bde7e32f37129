"""A terminal progress bar."""

from __future__ import annotations

import sys
from typing import Any, Optional

from tqdm.auto import tqdm

from treadle.events import ScalarKind

from .base import HookBase

__all__ = ["ProgressBar"]


class ProgressBar(HookBase):
    """A tqdm bar over the iterations, with the smoothed losses and the ETA.

    The bar advances every iteration (pure Python, in ``before_step``); the
    loss readout is refreshed every ``period`` iterations (its declared
    :meth:`after_step_period`, and the last iteration), when the storage is read anyway
    by the writers, so the bar adds no device sync. Register it after the
    :class:`PeriodicWriter` with the same period.

    Args:
        period: iterations between loss refreshes.
        window_size: smoothing window of the losses shown.
        file: the stream; defaults to stderr.
        disable: ``None`` shows the bar only when ``file`` is a terminal.
    """

    def __init__(self, period: int = 20, window_size: int = 20, *, file: Any = None, disable: Optional[bool] = None) -> None:
        self._period = period
        self._window = window_size
        self._file = file or sys.stderr
        self._disable = disable if disable is not None else not getattr(self._file, "isatty", lambda: False)()
        self._bar: Optional[tqdm] = None

    def before_train(self) -> None:
        if self._disable:
            return
        t = self.trainer
        self._bar = tqdm(
            total=t.max_iter, initial=t.start_iter, file=self._file, dynamic_ncols=True, unit="it", desc="train"
        )

    def _advance_to(self, done: int) -> None:
        assert self._bar is not None
        self._bar.update(done - self._bar.n)

    def before_step(self) -> None:
        """Advances the bar over the iterations done (pure Python, every iteration)."""
        if self._bar is not None:
            self._advance_to(self.trainer.iter)

    def after_step_period(self) -> Optional[int]:
        """``period``: the trainer calls :meth:`after_step` every ``period``
        iterations and after the last one."""
        return self._period

    def after_step(self) -> None:
        """Refreshes the losses shown (at its period, when the storage is read anyway)."""
        if self._bar is None:
            return
        self._advance_to(self.trainer.iter + 1)
        storage = self.trainer.storage
        shown = {
            name: f"{value:.4g}"
            for name, (value, _) in storage.latest_with_smoothing_hint(self._window).items()
            if storage.kind(name) == ScalarKind.LOSS
        }
        self._bar.set_postfix(shown, refresh=False)

    def after_train(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
