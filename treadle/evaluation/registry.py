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
from typing import Any, Callable, Dict, List, Mapping, Optional, Pattern, Sequence, Set, Tuple, TypeVar, Union

from .evaluator import DatasetEvaluator, DatasetEvaluators

__all__ = [
    "register_metric",
    "unregister_metric",
    "available_metrics",
    "build_evaluator",
    "metric_mode",
    "known_metric_mode",
    "MetricSpec",
]

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


def lookup_metric(metric: str) -> _Entry:
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
# Parts of names that say a metric is better when higher (checked after the
# ones above): what a contradicting best_mode is warned about.
_HIGHER_IS_BETTER_PARTS = ("acc", "f1", "auc", "precision", "recall", "bleu", "rouge", "iou")


def metric_mode(name: str) -> str:
    """``"min"`` or ``"max"``: the direction in which metric ``name`` improves.

    In order: the direction a registered metric declared
    (``register_metric(..., higher_is_better=...)``); then the name's last
    part (``"val/loss"`` -> ``"loss"``, prefixes ``eval/`` and ``train/``
    dropped): ``loss``, ``mse``, ``mae``, ``rmse``, ``cer``, ``wer``,
    ``perplexity`` and any name containing ``loss``, ``error``, ``err`` or
    ``distance`` are ``"min"``; every other name is ``"max"``.
    """
    return known_metric_mode(name) or "max"


def known_metric_mode(name: str) -> Optional[str]:
    """The direction of :func:`metric_mode` where something tells it: a
    registered metric's declaration, a lower-is-better name, or a name
    containing ``acc``, ``f1``, ``auc``, ``precision``, ``recall``, ``bleu``,
    ``rouge`` or ``iou`` (``"max"``); ``None`` for any other name."""
    last = name.split("/")[-1]
    try:
        entry = lookup_metric(last)
    except KeyError:
        entry = None
    if entry is not None and entry.higher_is_better is not None:
        return "max" if entry.higher_is_better else "min"
    lowered = last.lower()
    if lowered in _LOWER_IS_BETTER_NAMES or any(part in lowered for part in _LOWER_IS_BETTER_PARTS):
        return "min"
    if any(part in lowered for part in _HIGHER_IS_BETTER_PARTS):
        return "max"
    return None


MetricSpec = Any
"""One item of ``build_evaluator``'s ``metrics``: a name (``"accuracy"``), a
name with its own options (``("cer", {"decode": fn})``), a torchmetrics
``Metric`` or ``MetricCollection`` (optionally named: ``("auroc", metric)``),
or a :class:`DatasetEvaluator`."""


def _split_spec(spec: Any) -> Tuple[str, Any, Dict[str, Any]]:
    """``(kind, payload, options)``: kind "name" (payload the name), "object"
    (payload an evaluator)."""
    from .torchmetrics_evaluator import TorchMetricsEvaluator, is_torchmetrics_metric

    if isinstance(spec, str):
        return "name", spec, {}
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str):
        name, second = spec
        if isinstance(second, Mapping):
            return "name", name, dict(second)
        if is_torchmetrics_metric(second):
            return "object", TorchMetricsEvaluator(second, name), {}
    if is_torchmetrics_metric(spec):
        return "object", TorchMetricsEvaluator(spec), {}
    if isinstance(spec, DatasetEvaluator) or all(callable(getattr(spec, m, None)) for m in ("reset", "process", "evaluate")):
        return "object", spec, {}
    raise TypeError(
        f"metrics entries are names ('accuracy'), (name, options) pairs (('cer', {{'decode': fn}})), torchmetrics "
        f"metrics or DatasetEvaluators; got {spec!r}"
    )


def _frozen(options: Dict[str, Any]) -> Tuple[Tuple[str, int], ...]:
    # Options are compared by identity: a decoder function, a loss module.
    return tuple(sorted((k, id(v)) for k, v in options.items()))


def _as_spec_list(metrics: Any) -> List[Any]:
    """``metrics`` as a list of entries: a list is several, anything else one
    (a tuple ``(name, options)`` or ``(name, metric)`` included; a tuple of names is several)."""
    if isinstance(metrics, list):
        return list(metrics)
    if isinstance(metrics, tuple) and not (len(metrics) == 2 and isinstance(metrics[0], str) and not isinstance(metrics[1], str)):
        return list(metrics)
    return [metrics]


def build_evaluator(metrics: Union[MetricSpec, Sequence[MetricSpec]], **options: Any) -> DatasetEvaluator:
    """Builds the evaluator(s) computing ``metrics``, in one pass over the data.

    ``metrics`` is one item or a list of them (see :data:`MetricSpec`):
    registered names, names with their own options, torchmetrics metrics,
    evaluators. ``options`` go to the factories of the named metrics whose
    signature names them (for example ``num_classes`` to classification,
    ``loss_fn`` to ``loss``, ``ignore_index`` to classification and
    perplexity); a metric's own options (``("cer", {"decode": fn})``) add to
    and override them for that metric. An option that no selected factory
    accepts is an error, as is an unknown or repeated metric name, and two
    entries producing the same result name. Returns one evaluator, or a
    :class:`DatasetEvaluators` when the metrics need several; results are
    keyed by the metric names.
    """
    specs = _as_spec_list(metrics)
    if not specs:
        raise ValueError(
            f"build_evaluator needs at least one metric; valid metrics: {', '.join(available_metrics())}"
        )
    groups, objects = _group_metrics(specs)
    _check_options_used(groups, options)
    evaluators = [_build_group(entry, own, names, options) for entry, own, names in groups.values()]
    evaluators.extend(objects)
    _check_distinct_results(evaluators)
    return evaluators[0] if len(evaluators) == 1 else DatasetEvaluators(evaluators)


# Metric names served by one factory with the same own options (compared by identity).
_GroupKey = Tuple[int, Tuple[Tuple[str, int], ...]]
_Groups = Dict[_GroupKey, Tuple[_Entry, Dict[str, Any], List[str]]]


def _group_metrics(specs: List[Any]) -> Tuple[_Groups, List[DatasetEvaluator]]:
    """The named metrics of ``specs`` by evaluator to build, as ``{key: (entry,
    own options, names)}``, and the evaluators given as objects. Refuses a
    name listed twice, and an own option the metric's factory does not take."""
    # One evaluator per (factory, own options): names served by one factory
    # with the same options share a pass.
    groups: _Groups = {}
    objects: List[DatasetEvaluator] = []
    seen = set()
    for spec in specs:
        kind, payload, own = _split_spec(spec)
        if kind == "object":
            objects.append(payload)
            continue
        metric = payload
        if metric in seen:
            raise ValueError(f"metric {metric!r} is listed twice")
        seen.add(metric)
        entry = lookup_metric(metric)
        unknown = sorted(k for k in own if k not in entry.options and k != "metrics") if not entry.any_option else []
        if unknown:
            raise TypeError(
                f"build_evaluator: metric {metric!r} got option(s) {unknown}; {_describe(entry.factory)} "
                f"accepts {sorted(entry.options)}"
            )
        groups.setdefault((id(entry.factory), _frozen(own)), (entry, own, []))[2].append(metric)
    return groups, objects


def _check_options_used(groups: _Groups, options: Dict[str, Any]) -> None:
    """Refuses a shared option that no factory of the named metrics takes."""
    named = [entry for entry, _, _ in groups.values()]
    used: Set[str] = set()
    for entry in named:
        if entry.any_option:
            used.update(options)
        used.update(entry.options & set(options))
    unused = sorted(set(options) - used)
    if unused:
        accepted = sorted(set().union(*(e.options for e in named))) if named else []
        metrics = sorted(name for _, _, names in groups.values() for name in names)
        raise TypeError(
            f"build_evaluator: option(s) {unused} are not used by the evaluators of metrics "
            f"{metrics}; they accept {accepted}"
        )


def _build_group(entry: _Entry, own: Dict[str, Any], names: List[str], options: Dict[str, Any]) -> DatasetEvaluator:
    """The evaluator computing ``names`` (served by ``entry``'s factory), built
    with the options its factory takes, the metric's own overriding shared ones."""
    merged = {**options, **own}
    missing = sorted(entry.required - set(merged))
    if missing:
        raise TypeError(
            f"build_evaluator: metric(s) {names} need option(s) {missing} "
            f"(for {_describe(entry.factory)})"
        )
    if entry.any_option:
        kwargs = dict(merged)
    else:
        kwargs = {k: v for k, v in merged.items() if k in entry.options}
    if entry.takes_metrics:
        kwargs["metrics"] = list(names)
    evaluator = entry.factory(**kwargs)
    # Results are keyed by the names asked for: known before any evaluation.
    evaluator.result_names = tuple(names)
    return evaluator


def _check_distinct_results(evaluators: List[DatasetEvaluator]) -> None:
    """Refuses two evaluators that would put a result under the same name."""
    produced: Dict[str, int] = {}
    for e in evaluators:
        for name in getattr(e, "result_names", None) or ():
            produced[name] = produced.get(name, 0) + 1
    twice = sorted(n for n, count in produced.items() if count > 1)
    if twice:
        raise ValueError(f"build_evaluator: metric(s) {twice} would be computed twice; give each a distinct name")
