"""A bounded history of one scalar, with O(1) appends."""

from __future__ import annotations

import itertools
import math
from collections import deque
from operator import itemgetter
from typing import Deque, Iterator, List, Optional, Sequence, Tuple, cast

from fvcore.common.history_buffer import HistoryBuffer as _FvcoreHistoryBuffer

__all__ = ["HistoryBuffer"]

_value = itemgetter(0)
_iteration = itemgetter(1)


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

    def extend(self, points: Sequence[Tuple[float, int]]) -> None:
        """``update(value, iteration)`` for each pair, in order, in one call."""
        if not points:
            return
        self._data.extend(points)
        added = len(points)
        self._count += added
        # The running mean over every value ever added, moved by the batch's sum.
        self._global_avg += (sum(map(_value, points)) - added * self._global_avg) / self._count

    # Windows are built with map/islice and sorted in C: writers call these at
    # every flush, where numpy's call overhead would be ten times the work.
    def _window(self, window_size: int) -> List[float]:
        return list(map(_value, itertools.islice(reversed(self._data), window_size)))

    def median(self, window_size: int) -> float:
        """The median of the last ``window_size`` values; NaN if one of them is NaN (as numpy's)."""
        # Every writer asks for the same median at a flush: computed once.
        key = (self._count, window_size)
        if self._median_key != key:
            self._median_key = key
            self._median = _median(self._window(window_size))
        return self._median

    def point_through(self, iteration: int, window_size: Optional[int] = None) -> Optional[Tuple[float, int]]:
        """The newest ``(value, iteration)`` at or before ``iteration``, the
        value being the median over the ``window_size`` iterations that end
        there when a window is given (the iterations the storage's smoothing
        counts): what a read at ``iteration`` saw. ``None`` when there is none."""
        newest: Optional[int] = None
        window: List[float] = []
        for value, it in reversed(self._data):
            if it > iteration:
                continue
            if newest is None:
                newest = it
                if window_size is None:
                    return value, it
            elif it <= newest - cast(int, window_size):
                break
            window.append(value)
        return None if newest is None else (_median(window), newest)

    def avg(self, window_size: int) -> float:
        window = self._window(window_size)
        return sum(window) / len(window) if window else math.nan

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

    def values_between(self, first: int, last: int) -> List[float]:
        """The values recorded at iterations ``first..last``, oldest first,
        read from the newest end (an epoch's, the newest, without a copy of the history)."""
        found: List[float] = []
        for value, it in reversed(self._data):
            if it < first:
                break
            if it <= last:
                found.append(value)
        found.reverse()
        return found

    def count_after(self, iteration: int) -> int:
        """How many of the kept values were recorded after ``iteration``,
        counted from the newest end (no copy of the history)."""
        data = self._data
        if data:
            # One value per iteration, the usual case, checked in C rather
            # than walked: the last k values are after it, the one before is not.
            k = data[-1][1] - iteration
            n = len(data)
            if (
                0 < k <= n
                and (k == n or data[-k - 1][1] <= iteration)
                and min(map(_iteration, itertools.islice(reversed(data), k))) > iteration
            ):
                return k
        count = 0
        for _, it in reversed(self._data):
            if it <= iteration:
                break
            count += 1
        return count

    def latest_iteration(self) -> Optional[int]:
        """The iteration of the newest value, or ``None`` when empty."""
        return self._data[-1][1] if self._data else None

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Tuple[float, int]]:
        return iter(self._data)


def _median(values: List[float]) -> float:
    """The median of ``values``; NaN when one of them is NaN (as numpy's), or when there are none."""
    window = sorted(values)
    n = len(window)
    if n == 0 or any(map(math.isnan, window)):  # sorting does not order NaN
        return math.nan
    mid = n // 2
    return float(window[mid] if n % 2 else (window[mid - 1] + window[mid]) / 2)
