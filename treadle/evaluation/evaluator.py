"""The evaluator contract, and a container that runs several evaluators at once."""

from __future__ import annotations

import abc
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union, cast

from .results import Results

__all__ = ["DatasetEvaluator", "DatasetEvaluators"]


class DatasetEvaluator(abc.ABC):
    """Turns a model's outputs over a whole dataset into metrics.

    Contract, in the order :func:`~treadle.evaluation.inference_on_dataset`
    calls it:

    - ``reset()`` forgets everything seen so far (called once before a pass);
    - ``process(inputs, outputs)`` is called once per batch with the batch as the
      data loader produced it (moved to the device) and the model's outputs. It
      runs every step of an evaluation, so it must not force a host sync: keep
      running statistics as tensors and resolve them later;
    - ``evaluate()`` returns the metrics of everything processed since
      ``reset()``: a flat dict such as ``{"accuracy": 0.93}``, whose values are
      floats or nested dicts of floats. It is called on every rank; an evaluator
      that gathers results onto the main process may return ``None`` elsewhere.

    Subclasses that keep tensor statistics should derive from
    :class:`~treadle.evaluation.StatisticsEvaluator`, which does the
    cross-rank reduction.

    Attributes:
        result_names: the top-level keys ``evaluate()`` returns, when known
            before any evaluation (``build_evaluator`` sets them), else
            ``None``. Trainers check the metric a best checkpointer or early
            stopping watches against them when the run is built, not at the
            first evaluation.
    """

    result_names: Optional[Tuple[str, ...]] = None

    def reset(self) -> None:
        """Prepares for a new evaluation pass."""

    @abc.abstractmethod
    def process(self, inputs: Any, outputs: Any) -> None:
        """Accumulates one batch."""

    @abc.abstractmethod
    def evaluate(self) -> Optional[Results]:
        """Returns the metrics of everything processed since ``reset()``."""


def _describe(evaluator: Any, index: int) -> str:
    return f"{type(evaluator).__name__} (evaluator #{index})"


class DatasetEvaluators(DatasetEvaluator):
    """Runs several evaluators over the same pass and merges their results.

    Every evaluator sees every batch, in the order given. The merged result is
    one flat dict; two evaluators producing the same top-level key is an error
    naming the key and both evaluators, since silently keeping one value would
    report a metric the user did not ask for.
    """

    def __init__(self, evaluators: Iterable[DatasetEvaluator]) -> None:
        self._evaluators: List[DatasetEvaluator] = list(evaluators)
        for i, e in enumerate(self._evaluators):
            missing = [m for m in ("reset", "process", "evaluate") if not callable(getattr(e, m, None))]
            if missing:
                raise TypeError(
                    f"DatasetEvaluators: item #{i} ({type(e).__name__}) is not an evaluator: "
                    "it lacks " + ", ".join(f"{m}()" for m in missing)
                )

    @property
    def evaluators(self) -> List[DatasetEvaluator]:
        """The evaluators, in call order."""
        return list(self._evaluators)

    def __len__(self) -> int:
        return len(self._evaluators)

    @property
    def result_names(self) -> Optional[Tuple[str, ...]]:  # type: ignore[override]  # computed, where the base class has a class attribute
        """Every evaluator's result names, or None when one of them does not say."""
        names: List[str] = []
        for e in self._evaluators:
            own = getattr(e, "result_names", None)
            if own is None:
                return None
            names.extend(own)
        return tuple(names)

    def reset(self) -> None:
        for e in self._evaluators:
            e.reset()

    def process(self, inputs: Any, outputs: Any) -> None:
        for e in self._evaluators:
            e.process(inputs, outputs)

    def evaluate(self) -> Results:
        merged: Results = {}
        owner: Dict[str, int] = {}
        for i, e in enumerate(self._evaluators):
            # Every evaluator must run evaluate() on every rank, even when an
            # earlier one returned None there: each may hold a collective.
            result = e.evaluate()
            if result is None:
                continue
            if not isinstance(result, Mapping):
                raise TypeError(
                    f"{_describe(e, i)}.evaluate() returned {type(result).__name__}; "
                    "expected a dict of metrics or None"
                )
            for key, value in result.items():
                if key in merged:
                    first = owner[key]
                    raise ValueError(
                        f"DatasetEvaluators: metric {key!r} is produced by both "
                        f"{_describe(self._evaluators[first], first)} and {_describe(e, i)}"
                    )
                merged[key] = value
                owner[key] = i
        return merged

    def __repr__(self) -> str:
        inner = ", ".join(type(e).__name__ for e in self._evaluators)
        return f"DatasetEvaluators([{inner}])"


def as_evaluator(
    evaluator: Union[None, DatasetEvaluator, Iterable[DatasetEvaluator]],
) -> DatasetEvaluator:
    """``None`` -> an evaluator with no metrics; a list -> :class:`DatasetEvaluators`."""
    if evaluator is None:
        return DatasetEvaluators([])
    if isinstance(evaluator, (list, tuple)):
        return DatasetEvaluators(evaluator)
    if not all(callable(getattr(evaluator, m, None)) for m in ("reset", "process", "evaluate")):
        raise TypeError(
            f"expected a DatasetEvaluator, a list of them or None; got {type(evaluator).__name__}"
        )
    return cast(DatasetEvaluator, evaluator)  # any object with the three methods is one


def metric_names(metrics: Union[str, Sequence[str]]) -> List[str]:
    """One metric name or a sequence of them, as a list."""
    return [metrics] if isinstance(metrics, str) else list(metrics)


def checked_metric_names(owner: str, metrics: Union[str, Sequence[str]], computable: Sequence[str]) -> List[str]:
    """``metrics`` as a list, or a ``ValueError`` naming what ``owner`` cannot compute."""
    names = metric_names(metrics)
    bad = [m for m in names if m not in computable]
    if bad or not names:
        raise ValueError(f"{owner} cannot compute {bad or names}; it computes {list(computable)}")
    return names
