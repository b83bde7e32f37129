"""Evaluators built on sufficient statistics kept as device tensors.

Each built-in metric is a function of a few sums (counts, error sums, a
confusion matrix, edit distances). Summing those over batches and over ranks
and applying the function once gives exactly the single-process result, which
averaging per-batch or per-rank metrics would not.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, Mapping, Union

import torch
import torch.distributed as dist

from treadle.utils import comm

from .evaluator import DatasetEvaluator
from .results import Results

__all__ = ["StatisticsEvaluator", "all_reduce_statistics", "float_accumulator_dtype"]


def float_accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64, so that sums over a large dataset keep their precision, except
    where the device has no float64 (Apple MPS), where it is float32."""
    return torch.float32 if device.type == "mps" else torch.float64


def _communication_device(device: torch.device) -> torch.device:
    backend = dist.get_backend()
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def all_reduce_statistics(stats: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Sums named tensors over all ranks in one collective; returns them on the CPU.

    Every rank must pass the same names with the same shapes (the names may come
    in any order). The tensors travel flattened into one float64 buffer: integer
    statistics stay exact below 2**53. Without a process group nothing is
    communicated. In both cases the result reaches the host in one copy, which
    is the single device sync of an evaluation.
    """
    names = sorted(stats)
    if not names:
        return {}
    tensors = [stats[n].detach() for n in names]
    device = tensors[0].device
    if any(t.device != device for t in tensors) or device.type == "mps":
        # Mixed devices only happen on ranks that saw no data for some
        # statistics; MPS has no float64. Both are rare and end-of-pass only.
        tensors = [t.cpu() for t in tensors]
        device = torch.device("cpu")
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
    if comm.get_world_size() > 1:
        flat = flat.to(_communication_device(device))
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat = flat.cpu()
    out: Dict[str, torch.Tensor] = {}
    offset = 0
    for name, t in zip(names, tensors):
        chunk = flat[offset : offset + t.numel()].reshape(t.shape)
        offset += t.numel()
        if t.dtype.is_floating_point:
            out[name] = chunk
        else:
            out[name] = chunk.round().to(t.dtype)
    return out


def _tensors_to_floats(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"a metric must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.reshape(()).item())
    if isinstance(value, Mapping):
        return {k: _tensors_to_floats(v) for k, v in value.items()}
    return float(value)


class StatisticsEvaluator(DatasetEvaluator):
    """A :class:`DatasetEvaluator` whose state is a dict of summable tensors.

    Subclasses declare their statistics in :meth:`init_statistics` (zeros of a
    fixed shape, so that a rank that sees no batch still contributes to the
    reduction), add to them in ``process`` through :meth:`update` or
    :meth:`accumulator`, and turn the dataset-wide sums into metrics in
    :meth:`compute`. Accumulators are created on the CPU and follow the device
    of the first value added to them, so nothing leaves the device during a
    pass. ``evaluate()`` sums the statistics over ranks with one all_reduce,
    copies them to the host once and calls :meth:`compute` there, so every rank
    returns the same results, equal to those of a single process.
    """

    def __init__(self) -> None:
        self._stats: Dict[str, torch.Tensor] = {}
        self.reset()

    @abc.abstractmethod
    def init_statistics(self) -> Dict[str, torch.Tensor]:
        """Fresh statistics: name -> zero tensor (int64 for counts, float64 for sums)."""

    @abc.abstractmethod
    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        """Metrics from the dataset-wide statistics (CPU tensors); values may be
        0-dim tensors, floats or nested dicts of them."""

    def reset(self) -> None:
        self._stats = dict(self.init_statistics())

    def _get(self, name: str) -> torch.Tensor:
        try:
            return self._stats[name]
        except KeyError:
            raise KeyError(
                f"{type(self).__name__} has no statistic {name!r}; declared: {sorted(self._stats)}"
            ) from None

    def accumulator(self, name: str, device: torch.device) -> torch.Tensor:
        """The running statistic ``name`` on ``device``, for in-place updates."""
        acc = self._get(name)
        if acc.device != device:
            dtype = acc.dtype
            if dtype == torch.float64:
                dtype = float_accumulator_dtype(device)
            acc = acc.to(device=device, dtype=dtype)
            self._stats[name] = acc
        return acc

    def update(
        self,
        name: str,
        value: Union[torch.Tensor, int, float],
        device: Union[None, str, torch.device] = None,
    ) -> None:
        """Adds ``value`` to the statistic ``name`` (same shape, or a scalar).

        A tensor value brings the statistic to its device. A Python number (a
        batch size read from a shape) is added on ``device`` when given, else
        where the statistic is; adding it is a kernel argument, not a copy.
        """
        if isinstance(value, torch.Tensor):
            acc = self.accumulator(name, value.device)
            acc += value.detach().to(acc.dtype)
            return
        acc = self._get(name) if device is None else self.accumulator(name, torch.device(device))
        acc += value

    @property
    def statistics(self) -> Dict[str, torch.Tensor]:
        """The running statistics of this rank (not reduced), by name."""
        return dict(self._stats)

    def evaluate(self) -> Results:
        stats = all_reduce_statistics(self._stats)
        return _tensors_to_floats(self.compute(stats))

