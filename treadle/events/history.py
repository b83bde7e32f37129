"""A bounded history of one scalar, with O(1) appends."""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from typing import Deque, Iterator, List, Tuple

from fvcore.common.history_buffer import HistoryBuffer as _FvcoreHistoryBuffer

__all__ = ["HistoryBuffer"]


class HistoryBuffer(_FvcoreHistoryBuffer):
    """fvcore's ``HistoryBuffer`` on a ``deque``.

    fvcore keeps ``(value, iteration)`` pairs in a list and drops the oldest
    with ``list.pop(0)``, which is O(n) per update once the buffer is full: a
    long run pays for it at every iteration. Here eviction is O(1) and the
    window statistics read only the window. ``global_avg`` still covers every
    value ever added, evicted ones included.
    """

    def __init__(self, max_length: int = 10_000) -> None:
        super().__init__(max_length)
        self._data: Deque[Tuple[float, int]] = deque(maxlen=max_length)  # type: ignore[assignment]
        self._median_key: Tuple[int, int] = (-1, -1)
        self._median = 0.0

    def update(self, value: float, iteration: int | None = None) -> None:
        if iteration is None:
            iteration = self._count
        self._data.append((value, iteration))
        self._count += 1
        self._global_avg += (value - self._global_avg) / self._count

    def _window(self, window_size: int) -> List[float]:
        return [v for v, _ in itertools.islice(reversed(self._data), window_size)]

    # statistics, not numpy: on windows of tens of values numpy's call
    # overhead is ten times the work, and writers call this at every flush.
    def median(self, window_size: int) -> float:
        # Every writer asks for the same median at a flush: computed once.
        key = (self._count, window_size)
        if self._median_key != key:
            self._median_key = key
            self._median = float(statistics.median(self._window(window_size)))
        return self._median

    def avg(self, window_size: int) -> float:
        return float(statistics.fmean(self._window(window_size)))

    def values(self) -> List[Tuple[float, int]]:
        return list(self._data)

    def values_after(self, iteration: int) -> List[Tuple[float, int]]:
        """The ``(value, iteration)`` pairs recorded after ``iteration``, oldest first.

        Reads from the newest end and stops at the first older entry, so a
        writer that asks for what is new since its last write pays only for that.
        """
        newer: List[Tuple[float, int]] = []
        for value, it in reversed(self._data):
            if it <= iteration:
                break
            newer.append((value, it))
        newer.reverse()
        return newer

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Tuple[float, int]]:
        return iter(self._data)
