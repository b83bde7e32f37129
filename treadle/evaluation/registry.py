"""Metrics by name: ``build_evaluator(["accuracy", "f1"], num_classes=10)``.

A metric name maps to a factory that builds the evaluator computing it.
Names served by the same factory are grouped, so ``["accuracy", "f1",
"top5_accuracy"]`` builds one evaluator that computes all three in one pass.

A name may contain placeholders such as ``{k}`` that match a positive integer
(``"top{k}_accuracy"`` matches ``"top5_accuracy"``); the factory receives the
full name and parses it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Pattern, Sequence, TypeVar, Union

from .evaluator import DatasetEvaluator, DatasetEvaluators, metric_names

__all__ = ["register_metric", "unregister_metric", "available_metrics", "build_evaluator", "metric_mode"]

F = TypeVar("F", bound=Callable[..., DatasetEvaluator])

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"(?:[A-Za-z0-9_.@-]|\{[A-Za-z_][A-Za-z0-9_]*\})+")


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    factory: Callable[..., DatasetEvaluator]
    pattern: Optional[Pattern[str]]
    takes_metrics: bool
    options: frozenset
    required: frozenset
    any_option: bool
    higher_is_better: Optional[bool] = None


_REGISTRY: Dict[str, _Entry] = {}


def _make_entry(name: str, factory: Callable[..., DatasetEvaluator], higher_is_better: Optional[bool] = None) -> _Entry:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"invalid metric name {name!r}: use letters, digits, '_', '.', '-', '@' "
            "and {placeholders} that match a positive integer"
        )
    if not callable(factory):
        raise TypeError(f"the factory for metric {name!r} must be callable, got {factory!r}")
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError) as e:
        raise TypeError(f"cannot read the signature of the factory for metric {name!r}: {e}") from None
    options, required, any_option, takes_metrics = set(), set(), False, False
    for p in params.values():
        if p.kind is p.VAR_KEYWORD:
            any_option = True
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.kind is p.POSITIONAL_ONLY:
            if p.default is p.empty:
                raise TypeError(
                    f"the factory for metric {name!r} has a required positional-only parameter "
                    f"{p.name!r}; build_evaluator passes only metrics= and options by keyword"
                )
        elif p.name == "metrics":
            takes_metrics = True
        else:
            options.add(p.name)
            if p.default is p.empty:
                required.add(p.name)
    pattern = None
    if _PLACEHOLDER.search(name):
        regex = "".join(
            "([1-9][0-9]*)" if i % 2 else re.escape(part)
            for i, part in enumerate(_PLACEHOLDER.split(name))
        )
        pattern = re.compile(regex)
    return _Entry(
        name, factory, pattern, takes_metrics, frozenset(options), frozenset(required), any_option, higher_is_better
    )


def register_metric(
    name: Union[str, Sequence[str]],
    factory: Optional[F] = None,
    *,
    override: bool = False,
    higher_is_better: Optional[bool] = None,
) -> Any:
    """Registers ``factory`` as the builder of the metric(s) ``name``.

    ``factory(metrics=[...], **options)`` returns a :class:`DatasetEvaluator`:
    it receives the requested names it serves (in the user's order) if it has
    a ``metrics`` parameter, and the options of :func:`build_evaluator` that its
    signature names. Without ``factory``, returns a decorator::

        @register_metric("balanced_accuracy")
        class BalancedAccuracy(StatisticsEvaluator): ...

    A name already registered is an error unless ``override=True``.

    ``higher_is_better`` declares the metric's direction, which a best
    checkpointer or early stopping follows when no mode is given; without it
    the direction comes from the name (see :func:`metric_mode`).
    """
    names = [name] if isinstance(name, str) else list(name)
    if not names:
        raise ValueError("register_metric needs at least one name")

    def register(fn: F) -> F:
        entries = [_make_entry(n, fn, higher_is_better) for n in names]
        for n in names:
            if n in _REGISTRY and not override:
                raise ValueError(
                    f"metric {n!r} is already registered (to {_describe(_REGISTRY[n].factory)}); "
                    "pass override=True to replace it"
                )
        for entry in entries:
            _REGISTRY[entry.name] = entry
        return fn

    if factory is None:
        return register
    return register(factory)


def unregister_metric(name: str) -> None:
    """Removes a registered metric name; unknown names are an error listing the valid ones."""
    if name not in _REGISTRY:
        raise KeyError(f"metric {name!r} is not registered; registered: {available_metrics()}")
    del _REGISTRY[name]


def available_metrics() -> List[str]:
    """All registered metric names (placeholders shown as ``{k}``), sorted."""
    return sorted(_REGISTRY)


def _describe(factory: Callable[..., Any]) -> str:
    return getattr(factory, "__qualname__", None) or repr(factory)


def _lookup(metric: str) -> _Entry:
    if metric in _REGISTRY:
        return _REGISTRY[metric]
    for entry in _REGISTRY.values():
        if entry.pattern is not None and entry.pattern.fullmatch(metric):
            return entry
    raise KeyError(f"unknown metric {metric!r}; valid metrics: {', '.join(available_metrics())}")


# Names (or parts of names) of metrics that are better when lower. Anything
# else is taken as better when higher (accuracy, f1, auc, bleu, ...).
_LOWER_IS_BETTER_NAMES = frozenset({"loss", "mse", "mae", "rmse", "cer", "wer", "perplexity", "ppl", "nll"})
_LOWER_IS_BETTER_PARTS = ("loss", "error", "err", "distance")


def metric_mode(name: str) -> str:
    """``"min"`` or ``"max"``: the direction in which metric ``name`` improves.

    In order: the direction a registered metric declared
    (``register_metric(..., higher_is_better=...)``); then the name's last
    part (``"val/loss"`` -> ``"loss"``, prefixes ``eval/`` and ``train/``
    dropped): ``loss``, ``mse``, ``mae``, ``rmse``, ``cer``, ``wer``,
    ``perplexity`` and any name containing ``loss``, ``error``, ``err`` or
    ``distance`` are ``"min"``; every other name is ``"max"``.
    """
    last = name.split("/")[-1]
    try:
        entry = _lookup(last)
    except KeyError:
        entry = None
    if entry is not None and entry.higher_is_better is not None:
        return "max" if entry.higher_is_better else "min"
    lowered = last.lower()
    if lowered in _LOWER_IS_BETTER_NAMES or any(part in lowered for part in _LOWER_IS_BETTER_PARTS):
        return "min"
    return "max"


def build_evaluator(metrics: Union[str, Sequence[str]], **options: Any) -> DatasetEvaluator:
    """Builds the evaluator(s) computing ``metrics``, in one pass over the data.

    ``options`` go to the factories whose signature names them (for example
    ``num_classes`` to classification, ``loss_fn`` to ``loss``,
    ``ignore_index`` to classification and perplexity). An option that no
    selected factory accepts is an error, as is an unknown or repeated metric
    name. Returns one evaluator, or a :class:`DatasetEvaluators` when the
    metrics need several; results are keyed by the metric names.
    """
    names = metric_names(metrics)
    if not names:
        raise ValueError(
            f"build_evaluator needs at least one metric; valid metrics: {', '.join(available_metrics())}"
        )
    groups: Dict[int, List[str]] = {}
    entries: Dict[int, _Entry] = {}
    seen = set()
    for metric in names:
        if not isinstance(metric, str):
            raise TypeError(f"metric names must be strings, got {metric!r}")
        if metric in seen:
            raise ValueError(f"metric {metric!r} is listed twice")
        seen.add(metric)
        entry = _lookup(metric)
        key = id(entry.factory)
        entries.setdefault(key, entry)
        groups.setdefault(key, []).append(metric)

    used = set()
    for key, entry in entries.items():
        if entry.any_option:
            used.update(options)
        used.update(entry.options & set(options))
    unused = sorted(set(options) - used)
    if unused:
        accepted = sorted(set().union(*(e.options for e in entries.values())))
        raise TypeError(
            f"build_evaluator: option(s) {unused} are not used by the evaluators of metrics "
            f"{names}; they accept {accepted}"
        )

    evaluators: List[DatasetEvaluator] = []
    for key, entry in entries.items():
        missing = sorted(entry.required - set(options))
        if missing:
            raise TypeError(
                f"build_evaluator: metric(s) {groups[key]} need option(s) {missing} "
                f"(for {_describe(entry.factory)})"
            )
        if entry.any_option:
            kwargs = dict(options)
        else:
            kwargs = {k: v for k, v in options.items() if k in entry.options}
        if entry.takes_metrics:
            kwargs["metrics"] = list(groups[key])
        evaluator = entry.factory(**kwargs)
        # Results are keyed by the names asked for: known before any evaluation.
        evaluator.result_names = tuple(groups[key])
        evaluators.append(evaluator)
    return evaluators[0] if len(evaluators) == 1 else DatasetEvaluators(evaluators)
