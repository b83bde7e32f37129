"""The global store of everything a training run measures.

Anything (the step, the model, a hook) calls ``get_event_storage().put_scalar``;
writers read the store when they flush. Producers and writers never see each
other.

Values may be Python numbers or one-element tensors on any device. Tensors are
kept detached and unread until someone reads the store: then every pending
tensor is resolved in one batch, one device-to-host copy per device. Between
flushes, publishing a loss costs no device synchronization.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from operator import itemgetter, methodcaller
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union, cast

import torch

from .history import HistoryBuffer

__all__ = [
    "EventStorage",
    "get_event_storage",
    "has_event_storage",
    "ScalarKind",
    "NonFiniteLossError",
]

logger = logging.getLogger(__name__)

Number = Union[int, float]
ScalarValue = Union[Number, torch.Tensor]


class ScalarKind:
    """What a scalar is, said when it is put rather than guessed from its name.

    - ``LOSS``: checked for non-finite values; averaged across ranks.
    - ``TIME``: seconds; the maximum is taken across ranks (the slowest rank
      sets the pace).
    - ``METRIC``: an evaluation result.
    - ``None``: anything else (learning rate, gradient norm, ...); averaged
      across ranks.
    """

    LOSS = "loss"
    TIME = "time"
    METRIC = "metric"
    ALL = (LOSS, TIME, METRIC, None)


class NonFiniteLossError(FloatingPointError):
    """A loss published to the storage was NaN or infinite."""

    def __init__(self, iteration: int, terms: Dict[str, float]):
        self.iteration = iteration
        self.terms = dict(terms)
        shown = ", ".join(f"{k}={v:.6g}" for k, v in sorted(terms.items()))
        super().__init__(
            f"Loss became non-finite at iteration {iteration}: {shown}. "
            "The checkpoints and metrics written before it are intact."
        )


_CURRENT_STORAGE_STACK: List["EventStorage"] = []
_value = itemgetter(0)
_iteration = itemgetter(1)
# Looked up on each tensor (not bound once): what a test patches on Tensor is what runs.
_item = methodcaller("item")


def get_event_storage() -> "EventStorage":
    """The innermost open :class:`EventStorage`.

    Raises:
        RuntimeError: outside any ``with EventStorage(...)`` block (training
            opens one in ``TrainerBase.train``).
    """
    if not _CURRENT_STORAGE_STACK:
        raise RuntimeError(
            "get_event_storage() was called outside of an EventStorage context. "
            "Scalars can be published only while training runs (TrainerBase.train opens "
            "one), or inside `with EventStorage():`."
        )
    return _CURRENT_STORAGE_STACK[-1]


def has_event_storage() -> bool:
    """True inside a ``with EventStorage(...)`` block."""
    return bool(_CURRENT_STORAGE_STACK)


class EventStorage:
    """Scalars, images and histograms of one training run, by iteration.

    Use as a context manager: entering pushes it on a global stack read by
    :func:`get_event_storage`.

    Args:
        start_iter: the iteration that ``iter`` starts at.
        history_length: values kept per scalar name (older ones are dropped;
            ``global_avg`` still counts them).
        nonfinite_check: ``"flush"`` (default) checks published losses when the
            storage is read; ``"step"`` lets the trainer check after every
            iteration, at the cost of one device sync per iteration; ``"off"``
            disables the check.
        max_pending: pending tensors are resolved once this many accumulate,
            so that a run without writers does not hold an unbounded list.
        max_pending_cpu: the same bound for tensors in host memory, which are
            read without a device sync, while no device tensor is pending
            (it would be read with them). It is low because each pending CPU
            value is a small allocation that outlives its step: on a CPU run
            without writers, thousands of them interleave with the step's
            large buffers in the heap, which then grows (+114 MB after 2000
            iterations of a 64x2048 MLP with the bound at 100,000; +14 MB at 64).
    """

    def __init__(
        self,
        start_iter: int = 0,
        *,
        history_length: int = 10_000,
        nonfinite_check: str = "flush",
        max_pending: int = 100_000,
        max_pending_cpu: int = 64,
    ) -> None:
        if nonfinite_check not in ("flush", "step", "off"):
            raise ValueError(
                f"nonfinite_check must be 'flush', 'step' or 'off', got {nonfinite_check!r}"
            )
        self.iter: int = start_iter
        #: Set by the trainer when its loop has ended (``after_train``): ``iter``
        #: is then the number of iterations run, one past the last, where the
        #: run's final results are put (detectron2's convention), not an
        #: iteration that ran. See :func:`~treadle.events.printer.iterations_run`.
        self.loop_ended = False
        self.nonfinite_check = nonfinite_check
        self._history_length = history_length
        self._max_pending = max_pending
        self._max_pending_cpu = max_pending_cpu
        self._history: Dict[str, HistoryBuffer] = {}
        self._smoothing_hints: Dict[str, bool] = {}
        self._kinds: Dict[str, Optional[str]] = {}
        self._loss_names: Set[str] = set()
        self._latest: Dict[str, Tuple[float, int]] = {}
        # What was put since the last read: per name, (value, iteration) in put
        # order. Names with a tensor among their values are in _tensor_names.
        # Per name, so that a flush does per-value work only for tensors.
        self._pending: Dict[str, List[Tuple[ScalarValue, int]]] = {}
        self._tensor_names: Set[str] = set()
        self._pending_tensors = 0
        self._pending_cpu_tensors = 0
        self._cpu_check_at = max_pending_cpu
        # Series (see open_series): per name, a list its producer appends
        # (value, iteration) to directly; emptied into _pending when read.
        self._series: Dict[str, List[Tuple[ScalarValue, int]]] = {}
        self._series_lists: List[List[Tuple[ScalarValue, int]]] = []
        self._series_of_tensors: Set[str] = set()
        # The values of the last deferred flush, on their way to host memory (see flush).
        self._reading: Optional[_Reading] = None
        self._reads_record = True  # False inside as_of(): reads resolve nothing
        #: Inside :meth:`as_of`, where writers' rows of training values end (None: at every value recorded).
        self.rows_through: Optional[int] = None
        #: Inside :meth:`as_of`, where writers' evaluation results end (None: at every result recorded).
        self.results_through: Optional[int] = None
        # Counts the reads that recorded something: what the values of
        # latest_with_smoothing_hint are cached by, so that the writers of
        # one flush compute each median once between them.
        self._generation = 0
        self._smoothed_cache: Tuple[Tuple[int, int], Dict[str, Tuple[float, int]]] = ((-1, -1), {})
        self._prefix = ""
        self._images: List[Tuple[str, torch.Tensor, int]] = []
        self._histograms: List[Tuple[str, torch.Tensor, int, Any]] = []
        #: Called with [(name, value, kind)] of one flush in put order (values
        #: are floats or tensors); returns the values to record, as floats in
        #: the same order. Distributed training installs a cross-rank reduction.
        self.reducer: Optional[Callable[[List[Tuple[str, ScalarValue, Optional[str]]]], List[float]]] = None

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "EventStorage":
        _CURRENT_STORAGE_STACK.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not _CURRENT_STORAGE_STACK or _CURRENT_STORAGE_STACK[-1] is not self:
            raise RuntimeError("EventStorage contexts were exited out of order.")
        _CURRENT_STORAGE_STACK.pop()

    # ------------------------------------------------------------------ producers
    def put_scalar(
        self,
        name: str,
        value: ScalarValue,
        smoothing_hint: bool = True,
        cur_iter: Optional[int] = None,
        *,
        kind: Optional[str] = None,
    ) -> None:
        """Records ``value`` for ``name`` at ``cur_iter`` (default: ``self.iter``).

        Args:
            value: a Python number or a one-element tensor. A tensor is read
                at the next flush, not now: do not modify it in place afterwards.
            smoothing_hint: whether writers should smooth this scalar over a
                window (training losses) or write every value as it is
                (evaluation results).
            kind: one of :class:`ScalarKind`.
        """
        if self._prefix:
            name = self._prefix + name
        previous_hint = self._smoothing_hints.get(name)
        if previous_hint is None:  # first put of this name: validate once
            self._register(name, smoothing_hint, kind)
        elif previous_hint != smoothing_hint:
            raise ValueError(
                f"Scalar '{name}' was put with smoothing_hint={previous_hint} before and "
                f"smoothing_hint={smoothing_hint} now; one name must keep one hint."
            )
        point = (value, self.iter if cur_iter is None else int(cur_iter))
        if type(value) is not float:
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(
                        f"Scalar '{name}' must have one element, got a tensor of shape {tuple(value.shape)}"
                    )
                if value.requires_grad:  # keep no autograd graph alive until the flush
                    point = (value.detach(), point[1])
                self._tensor_names.add(name)
                self._pending_tensors += 1
                if value.is_cpu:
                    self._pending_cpu_tensors += 1
            else:  # ints, bools, numpy scalars and the like
                point = (float(value), point[1])
        points = self._pending.get(name)
        if points is None:
            self._pending[name] = [point]
        else:
            points.append(point)
        # Not with a cross-rank reducer: resolving is then a collective, which
        # must happen at the same point on every rank (PeriodicWriter's flush).
        if self.reducer is None and (
            self._pending_tensors >= self._max_pending
            or (self._pending_cpu_tensors >= self._cpu_check_at and self._only_host_tensors_pending())
        ):
            self.materialize()

    def _only_host_tensors_pending(self) -> bool:
        """Whether resolving now reads no device tensor (which would be a sync
        that a GPU run must only make at a flush). When it would, the next
        look is ``max_pending_cpu`` puts later, not at every put."""
        if not self.device_values_pending():
            return True
        self._cpu_check_at += self._max_pending_cpu
        return False

    def open_series(
        self, name: str, *, smoothing_hint: bool = True, kind: Optional[str] = None, tensors: bool = True
    ) -> List[Tuple[ScalarValue, int]]:
        """A list to append ``(value, iteration)`` to: ``put_scalar`` without a
        call, for a producer that puts ``name`` every iteration (the step's
        losses and ``data_time``).

        ``name`` is checked, and prefixed by the current :meth:`name_scope`,
        once, here; the producer then appends values that ``put_scalar``
        would accept unchanged: one-element tensors without autograd history
        (detach them) when ``tensors``, else Python floats. They are read with
        everything else at the next flush, in iteration order with values of
        the same name put by ``put_scalar``. The list is this storage's: open
        it again in the next ``EventStorage``. A producer that appends every
        iteration bounds the pending values by calling :meth:`bound_pending` when
        its list reaches :attr:`max_pending`. Measured with
        ``benchmarks/peers.py --interleaved`` (treadle-bare, 5 runs of 8
        rounds): the step's series cost +19.4 ± 0.1 µs per iteration over
        the hand loop, ``put_scalar`` +20.8 ± 0.2.
        """
        name = self._prefix + name
        points = self._series.get(name)
        if points is None:
            previous_hint = self._smoothing_hints.get(name)
            if previous_hint is None:
                self._register(name, smoothing_hint, kind)
            elif previous_hint != smoothing_hint or self._kinds[name] != kind:
                raise ValueError(
                    f"Scalar '{name}' was put with smoothing_hint={previous_hint}, kind={self._kinds[name]!r} "
                    f"before and is opened as a series with smoothing_hint={smoothing_hint}, kind={kind!r}; "
                    "one name must keep one hint and kind."
                )
            points = self._series[name] = []
            self._series_lists.append(points)
        if tensors:
            self._series_of_tensors.add(name)
        return points

    @property
    def max_pending(self) -> int:
        """How many values a series may hold before its producer calls :meth:`bound_pending`."""
        return self._max_pending

    @property
    def max_pending_cpu(self) -> int:
        """:attr:`max_pending` for a series of values in host memory (CPU tensors, floats)."""
        return self._max_pending_cpu

    def bound_pending(self) -> None:
        """Resolves what is pending, unless values are reduced across ranks
        (that is a collective, which every rank must run at the same point:
        the writers' flush)."""
        if self.reducer is None:
            self.materialize()

    def _register(self, name: str, smoothing_hint: bool, kind: Optional[str]) -> None:
        if kind not in ScalarKind.ALL:
            raise ValueError(f"Unknown scalar kind {kind!r} for '{name}'; use one of {ScalarKind.ALL}")
        self._smoothing_hints[name] = smoothing_hint
        self._kinds[name] = kind
        if kind == ScalarKind.LOSS:
            self._loss_names.add(name)

    def put_scalars(
        self,
        *,
        smoothing_hint: bool = True,
        cur_iter: Optional[int] = None,
        kind: Optional[str] = None,
        **scalars: ScalarValue,
    ) -> None:
        """``put_scalar`` for each keyword argument."""
        for name, value in scalars.items():
            self.put_scalar(name, value, smoothing_hint, cur_iter, kind=kind)

    def put_image(self, img_name: str, img_tensor: torch.Tensor) -> None:
        """Queues an image (CHW, float in [0, 1] or uint8) for the TensorBoard writer."""
        self._images.append((self._prefix + img_name, img_tensor.detach(), self.iter))

    def put_histogram(self, hist_name: str, hist_tensor: torch.Tensor, bins: Any = "tensorflow") -> None:
        """Queues the histogram of ``hist_tensor``'s values for the TensorBoard writer.

        The tensor is copied (on its device, without a sync) so that later
        in-place updates, e.g. of a parameter, do not change what is written.
        """
        self._histograms.append((self._prefix + hist_name, hist_tensor.detach().clone(), self.iter, bins))

    @contextmanager
    def name_scope(self, name: str) -> Iterator[None]:
        """Prefixes the names put inside the block with ``name/``."""
        old_prefix = self._prefix
        self._prefix = old_prefix + name.rstrip("/") + "/"
        try:
            yield
        finally:
            self._prefix = old_prefix

    def step(self) -> None:
        """Advances ``iter`` by one (the trainer sets ``iter`` directly)."""
        self.iter += 1

    # ------------------------------------------------------------------ flush
    def materialize(self) -> None:
        """Resolves every pending value into the histories.

        All pending tensors are read in one batch per device (one sync), passed
        through :attr:`reducer` when one is installed, then recorded in put
        order. Published losses are then checked when ``nonfinite_check`` is
        not ``"off"``.

        Raises:
            NonFiniteLossError: a loss was NaN or infinite; it names the first
                such iteration and every loss term of it. The values are
                recorded before raising, so writers can still show them.
        """
        if self._reads_record and (self._reading is not None or self._pending or any(self._series_lists)):
            self._resolve_pending()

    def flush(self, *, defer: bool = False) -> None:
        """:meth:`materialize`, also when nothing is pending.

        With a cross-rank :attr:`reducer`, every rank must resolve its values
        at the same points, including a rank that has nothing to resolve:
        ``PeriodicWriter`` calls this on every rank at each period. Plain
        reads (``latest()``, ``history()``) only resolve what is pending.

        ``defer=True`` does not wait for the device: the values on an
        accelerator start their copy to host memory (pinned, after an event
        on their stream) and are recorded at the next flush or read, when the
        copy is long complete; values in host memory are read now and
        recorded then too. What was deferred at the previous flush is
        recorded first. A reader that needs a value now (``latest()``,
        ``history()``) still gets it at once, waiting for the device then.
        With a cross-rank :attr:`reducer` the flush does not defer (the
        reduction is a collective read by the host).
        """
        if not (self._reading is not None or self._pending or self.reducer is not None or any(self._series_lists)):
            return
        if defer and self.reducer is None:
            self._finish_reading()
            self._reading = self._start_reading()
        else:
            self._resolve_pending()

    def device_values_pending(self) -> bool:
        """Whether a pending value is a tensor on an accelerator (reading it waits for the device)."""
        if self._pending_tensors != self._pending_cpu_tensors:
            return True
        series = self._series
        return any(series[name] and not cast(torch.Tensor, series[name][-1][0]).is_cpu for name in self._series_of_tensors)

    @contextmanager
    def as_of(self, iteration: int, *, every_result: bool = False) -> Iterator[None]:
        """Reads inside the block resolve nothing, and writers' rows end at
        ``iteration`` (:attr:`rows_through`, :attr:`results_through`): what a
        waiting flush at ``iteration`` wrote. A deferred :meth:`flush`'s
        writers write what the flush before it recorded, as of its iteration,
        without waiting for the copy just started; an evaluation result
        recorded since (a hook read the storage for it) waits for the rows of
        its own iteration, which then hold its training values too.
        ``every_result=True``: the training rows end at ``iteration``, and
        every evaluation result recorded is written (a stop to be resumed:
        the resumed run never writes them). Both are attributes, not
        properties: each writer reads them at every write."""
        self._reads_record, self.rows_through = False, iteration
        self.results_through = None if every_result else iteration
        try:
            yield
        finally:
            self._reads_record, self.rows_through, self.results_through = True, None, None

    def point_through(self, name: str, iteration: int, window_size: int) -> Optional[Tuple[float, int]]:
        """``name``'s point as a read at ``iteration`` saw it: its newest
        ``(value, iteration)`` up to there, the value smoothed over
        ``window_size`` iterations when put with a smoothing hint."""
        window = window_size if self._smoothing_hints[name] else None
        return self._history[name].point_through(iteration, window)

    def _take_series(self) -> None:
        """Moves what the series hold into ``_pending``."""
        for name, points in self._series.items():
            if not points:
                continue
            earlier = self._pending.get(name)
            if earlier is None:
                self._pending[name] = points[:]
            else:
                # put_scalar and the series both had values: in iteration order
                # (a stable sort keeps the put order within an iteration).
                self._pending[name] = sorted(earlier + points, key=_iteration)
            points.clear()
            if name in self._series_of_tensors:
                self._tensor_names.add(name)

    def _resolve_pending(self) -> None:
        """Records every pending value, waiting for its device where it is on one."""
        self._finish_reading()
        self._reading = self._start_reading()
        self._finish_reading()

    def _start_reading(self) -> "_Reading":
        """Takes what is pending and starts its way to floats (see :class:`_Reading`)."""
        if self._series:
            self._take_series()
        pending, self._pending = self._pending, {}
        tensor_names, self._tensor_names = self._tensor_names, set()
        pending_tensors, self._pending_tensors = self._pending_tensors, 0
        pending_cpu_tensors, self._pending_cpu_tensors = self._pending_cpu_tensors, 0
        self._cpu_check_at = self._max_pending_cpu
        try:
            if self.reducer is not None:
                self._reduce(pending)
                return _Reading(pending, [])
            return _Reading(pending, [pending[name] for name in tensor_names])
        except BaseException:
            # Nothing was recorded yet: keep the period's values for the next
            # read instead of losing them all. Values already turned into
            # floats in place stay valid pending values.
            self._pending, self._tensor_names, self._pending_tensors = pending, tensor_names, pending_tensors
            self._pending_cpu_tensors = pending_cpu_tensors
            raise

    def _finish_reading(self) -> None:
        """Records the values of the reading started by the last deferred
        :meth:`flush`, once they are in host memory (usually long since)."""
        reading, self._reading = self._reading, None
        if reading is None:
            return
        histories = self._history
        resolved = reading.finish()
        for name, points in resolved.items():
            history = histories.get(name)
            if history is None:
                history = histories[name] = HistoryBuffer(self._history_length)
            history.extend(points)
            self._latest[name] = points[-1]
        self._generation += 1
        if self.nonfinite_check != "off":
            self._check_losses(resolved)

    def _reduce(self, pending: Dict[str, List[Tuple[ScalarValue, int]]]) -> None:
        """Replaces every pending value by its reduction across ranks (in place)."""
        # Numbers go as they are: the reducer packs them into one tensor
        # rather than receiving one tensor (one copy to the device) each.
        kinds = self._kinds
        entries = [(name, v, kinds.get(name)) for name, points in pending.items() for v, _ in points]
        assert self.reducer is not None
        reduced = self.reducer(entries)
        if len(reduced) != len(entries):
            raise RuntimeError(f"The storage's reducer returned {len(reduced)} values for {len(entries)} scalars.")
        values = iter(reduced)
        for points in pending.values():
            points[:] = [(next(values), it) for _, it in points]

    def _check_losses(self, pending: Dict[str, List[Tuple[float, int]]]) -> None:
        loss_names = self._loss_names.intersection(pending)
        # All finite, the usual answer, found without a Python loop per value.
        if all(all(map(math.isfinite, map(_value, pending[name]))) for name in loss_names):
            return
        first: Optional[int] = None
        for name in loss_names:
            for value, it in pending[name]:
                if not math.isfinite(value) and (first is None or it < first):
                    first = it
        if first is None:
            return
        terms = {name: value for name in loss_names for value, it in pending[name] if it == first}
        raise NonFiniteLossError(first, terms)

    # ------------------------------------------------------------------ readers
    def history(self, name: str) -> HistoryBuffer:
        """The :class:`HistoryBuffer` of ``name``.

        Raises:
            KeyError: no scalar of that name was put; the message lists those that were.
        """
        self.materialize()
        try:
            return self._history[name]
        except KeyError:
            raise KeyError(
                f"No scalar named '{name}' in the storage. Known: {sorted(self._history)}"
            ) from None

    def histories(self) -> Dict[str, HistoryBuffer]:
        self.materialize()
        return self._history

    def recent_state(self, max_points: int = 1000) -> Dict[str, Any]:
        """The last ``max_points`` values of every scalar, with its smoothing
        hint and kind: what a checkpoint keeps so that, after a resume, a
        smoothed value (the median of the last 20 losses) is computed over the
        same window as in an uninterrupted run. Resolves pending values (a
        collective under a cross-rank reducer: every rank calls it together)."""
        histories = self.histories()
        return {
            name: {
                "points": [[float(v), int(i)] for v, i in list(buffer.values())[-max_points:]],
                "hint": self._smoothing_hints[name],
                "kind": self._kinds[name],
            }
            for name, buffer in histories.items()
        }

    def restore_recent(self, state: Dict[str, Any]) -> None:
        """Puts back what :meth:`recent_state` returned, before training
        continues (the values are history: writers do not emit them again)."""
        for name, saved in state.items():
            points = [(float(v), int(i)) for v, i in saved.get("points", [])]
            if not points:
                continue
            self._register(name, bool(saved.get("hint", True)), saved.get("kind"))
            buffer = self._history.get(name)
            if buffer is None:
                buffer = self._history[name] = HistoryBuffer(self._history_length)
            buffer.extend(points)
            self._latest[name] = points[-1]
        self._generation += 1

    def value_over(self, name: str, first: int, last: int) -> Optional[float]:
        """A training scalar's value over iterations ``first..last``: the mean
        of its values there that are not NaN, or the last of them for a
        scalar put with ``smoothing_hint=False`` (a rate is read as it is;
        a mean of eight 0.1s is 0.09999999999999999); ``None`` where it has none.

        What an epoch's row of the plain ``Trainer``'s history holds, and what
        :class:`~treadle.hooks.BestCheckpointer` and
        :class:`~treadle.hooks.EarlyStopping` watching a training scalar
        read at each check: the value that decides is the one the history shows.
        """
        found = [v for v in self.history(name).values_between(first, last) if not math.isnan(v)]
        if not found:
            return None
        return found[-1] if not self._smoothing_hints[name] else sum(found) / len(found)

    def latest(self) -> Dict[str, Tuple[float, int]]:
        """``{name: (latest value, iteration it was put at)}``."""
        self.materialize()
        return self._latest

    def count_samples(self, name: str, window_size: int = 20) -> int:
        """How many values of ``name`` were put in the last ``window_size``
        iterations (up to and including the iteration of its latest value).

        detectron2's rule, which every smoothing window of treadle follows: a
        window counts iterations, not values, so a scalar put every 5
        iterations is smoothed over the same stretch of training as one put
        every iteration (4 values, not 20, for a window of 20).
        """
        history = self.history(name)
        newest = history.latest_iteration()
        if newest is None:
            return 0
        # From the newest end: a long run's 10,000 kept values are not copied at every write.
        return history.count_after(newest - window_size)

    def smoothed(self, name: str, window_size: int = 20) -> float:
        """The median of ``name``'s values over its last ``window_size``
        iterations (see :meth:`count_samples`)."""
        return self.history(name).median(max(self.count_samples(name, window_size), 1))

    def latest_with_smoothing_hint(self, window_size: int = 20) -> Dict[str, Tuple[float, int]]:
        """Like :meth:`latest`, but scalars with a smoothing hint are the median of
        their values over the last ``window_size`` iterations."""
        return dict(self.shared_smoothed_latest(window_size))

    def shared_smoothed_latest(self, window_size: int) -> Dict[str, Tuple[float, int]]:
        """:meth:`latest_with_smoothing_hint`, computed once per read that
        recorded new values and shared, without a copy (callers must not
        modify it): the writers of one flush ask for the same medians."""
        self.materialize()
        key = (self._generation, window_size)
        cached_key, cached = self._smoothed_cache
        if cached_key == key:
            return cached
        result = {}
        histories, hints = self._history, self._smoothing_hints
        for name, (value, it) in self._latest.items():
            if hints[name]:
                history = histories[name]
                # count_samples and smoothed inline: the window counts iterations.
                value = history.median(max(history.count_after(it - window_size), 1))
            result[name] = (value, it)
        self._smoothed_cache = (key, result)
        return result

    def smoothing_hints(self) -> Dict[str, bool]:
        return self._smoothing_hints

    def kinds(self) -> Dict[str, Optional[str]]:
        """``{name: ScalarKind}`` of every scalar put so far (do not modify)."""
        return self._kinds

    def kind(self, name: str) -> Optional[str]:
        """The :class:`ScalarKind` that ``name`` was put with."""
        return self._kinds.get(name)

    @property
    def images(self) -> List[Tuple[str, torch.Tensor, int]]:
        return self._images

    @property
    def histograms(self) -> List[Tuple[str, torch.Tensor, int, Any]]:
        return self._histograms

    def clear_images(self) -> None:
        self._images = []

    def clear_histograms(self) -> None:
        self._histograms = []


# Tests turn this off to run the batched path, which accelerators take, on the CPU.
_READ_CPU_TENSORS_ONE_BY_ONE = True


class _Reading:
    """A flush's pending values on their way to floats.

    Built by a flush: every value in host memory is read at once (a CPU
    ``item`` is no sync, and cheaper than stacking a few dozen). Tensors on
    an accelerator are grouped by (device, dtype): each group is stacked on
    its device, and each device's groups leave it in one copy, started
    without waiting (to pinned memory, an event recorded after it, on CUDA).
    :meth:`finish` waits for those copies, which a deferred flush calls a
    period later, when they are long complete, and replaces every value of
    ``pending`` by a float, in place.
    """

    def __init__(self, pending: Dict[str, List[Tuple[ScalarValue, int]]], columns: List[List[Tuple[ScalarValue, int]]]):
        self.pending = pending
        on_devices: Dict[Tuple[torch.device, torch.dtype], List[Tuple[List[Tuple[ScalarValue, int]], int]]] = {}
        for points in columns:
            first = points[0][0]
            if _READ_CPU_TENSORS_ONE_BY_ONE and isinstance(first, torch.Tensor) and first.is_cpu:
                # A column of CPU tensors (one name's values live on one device):
                # read without a Python loop. A tensor elsewhere among them would
                # be read correctly too, with a sync of its own.
                try:
                    points[:] = zip(map(float, map(_item, map(_value, points))), map(_iteration, points))
                except TypeError:  # numbers among the tensors
                    points[:] = [(float(v.item()), it) if isinstance(v, torch.Tensor) else (v, it) for v, it in points]
                continue
            for i, (value, it) in enumerate(points):
                if not isinstance(value, torch.Tensor):
                    continue
                if value.is_cpu and _READ_CPU_TENSORS_ONE_BY_ONE:
                    number = value.item()
                    points[i] = (number if type(number) is float else float(number), it)
                else:
                    on_devices.setdefault((value.device, value.dtype), []).append((points, i))
        by_device: Dict[torch.device, List[List[Tuple[List[Tuple[ScalarValue, int]], int]]]] = {}
        for (device, _), members in on_devices.items():
            by_device.setdefault(device, []).append(members)
        # Per device: where its values go, the host copy, and the event after it (None: complete).
        self._copies: List[Tuple[List[Tuple[List[Tuple[ScalarValue, int]], int]], torch.Tensor, Any]] = []
        for member_groups in by_device.values():
            members = [m for group in member_groups for m in group]
            # float64: values of several dtypes share one copy without rounding.
            # put_scalar accepts any one-element shape; stack needs one: reshape
            # is a view, no kernel.
            stacked = [torch.stack([cast(torch.Tensor, points[i][0]).reshape(()) for points, i in group])
                       for group in member_groups]
            flat = stacked[0] if len(stacked) == 1 else torch.cat([t.to(torch.float64) for t in stacked])
            if flat.device.type == "cuda":
                host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                self._copies.append((members, host, torch.cuda.current_stream(flat.device).record_event()))
            else:  # the CPU, or an accelerator without pinned memory: a copy that waits
                self._copies.append((members, flat.cpu(), None))

    def finish(self) -> Dict[str, List[Tuple[float, int]]]:
        """The pending values, every one a float now (waiting for a copy still under way)."""
        for members, host, event in self._copies:
            if event is not None and not event.query():
                event.synchronize()
            for (points, i), value in zip(members, host.tolist()):
                points[i] = (float(value), points[i][1])
        self._copies = []
        return cast(Dict[str, List[Tuple[float, int]]], self.pending)
