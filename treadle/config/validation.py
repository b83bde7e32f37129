"""Checking a runnable config before anything is built or written.

``tools/train_net.py`` calls :func:`check_run_config` in the launching
process, before any worker starts and before a byte goes to
``train.output_dir``. Every problem found here is a
:class:`~treadle.config.ConfigError` whose one-line message names the key,
the bad value and, where there are few, the valid choices.

What is checked: the top-level keys a runnable config needs, and that no
other top-level node goes unread (:mod:`treadle.config.top_nodes`, LiBai's
``graph.enabled`` included); that every value
can be read (no unresolvable ``${...}`` interpolation, no ``???``); every key
of ``train`` by its rule in the table of keys (:mod:`treadle.config.train_keys`);
the device, the precision, the world size and the batch size against it; the
metric names of a ``build_evaluator`` node and the metrics that the best
checkpointer and early stopping watch; a ``loss_fn`` for an evaluation of
``loss`` where the step is a class of the user's that takes none. What needs the built objects (the
evaluator's result names of a custom evaluator, a model that cannot be built)
is checked by ``DefaultTrainer`` when it builds them, still before writing.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from typing import Any, Dict, Iterable, List, Optional

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError, first_line
from .locate import locate, target_name
from .nodes import child_node, is_missing, is_none, raw_value
from .rules import integer, is_int, is_number, shown
from .top_nodes import check_top_level_nodes
from .train_keys import STEP_KINDS, train_rules, train_setting

__all__ = [
    "check_run_config",
    "check_world_size",
    "check_watched_metric",
    "warn_contradicting_mode",
    "TRAIN_KEYS",
    "STEP_KINDS",
]

logger = logging.getLogger(__name__)

_MISSING = object()

#: The rule of every key of ``train``, from the table in
#: :mod:`treadle.config.train_keys`; a dict is a sub-node. Keys not listed are
#: allowed (a subclass may read them), with a warning that suggests the
#: closest listed key.
TRAIN_KEYS: Dict[str, Any] = train_rules()

# Optimizer arguments that torch requires to be >= 0, checked by name in any
# ``optimizer`` node (torch's own message names neither the key nor the node).
_NON_NEGATIVE_OPTIMIZER_KEYS = ("lr", "weight_decay", "momentum", "eps", "dampening")


# ---------------------------------------------------------------------- walking
def _read(node: Any, key: Any, path: str) -> Any:
    """``node[key]`` with interpolations resolved, or a ConfigError naming ``path``."""
    try:
        return node[key]
    except OmegaConfBaseException as e:
        found = child_node(node, key) if isinstance(node, (DictConfig, ListConfig)) else None
        raw = raw_value(found) if found is not None else None
        if isinstance(raw, str) and raw == "???":
            raise ConfigError(f"{path} has no value (it is '???'); set it, e.g. {path}=VALUE") from None
        written = f" = {raw!r}" if isinstance(raw, str) else ""
        raise ConfigError(f"{path}{written} cannot be resolved: {first_line(e)}") from None


def _check_readable(node: Any, path: str = "") -> None:
    """Reads every value of ``node`` once, so that a broken interpolation or a
    ``???`` anywhere is reported with its key before anything is built."""
    if isinstance(node, DictConfig):
        if is_none(node) or is_missing(node):
            return
        for key in node.keys():
            child_path = f"{path}.{key!s}" if path else str(key)
            _check_readable(_read(node, key, child_path), child_path)
    elif isinstance(node, ListConfig):
        if is_none(node) or is_missing(node):
            return
        for i in range(len(node)):
            _check_readable(_read(node, i, f"{path}.{i}"), f"{path}.{i}")


def _check_schema(node: Any, schema: Dict[str, Any], path: str) -> None:
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path} must be a config node with keys, got {shown(node)}")
    if path == "train.step" and "_target_" in node:
        return  # a user's step class: its arguments are its own
    for key in node.keys():
        key_path = f"{path}.{key!s}"
        rule = schema.get(str(key), _MISSING)
        value = node[key]
        if rule is _MISSING:
            close = difflib.get_close_matches(str(key), list(schema), n=1, cutoff=0.75)
            hint = f"; did you mean '{path}.{close[0]}'?" if close else ""
            # train_net checks a job before it starts its processes and again
            # in each; its console shows a warning of those checks once.
            logger.warning("%s is not a key that DefaultTrainer reads%s", key_path, hint)
            continue
        if isinstance(rule, dict):
            if value is None:
                continue  # a missing or null sub-node means its defaults
            _check_schema(value, rule, key_path)
        else:
            rule(key_path, value)


def check_world_size(num_gpus: int, num_machines: int = 1, machine_rank: int = 0) -> int:
    """The world size of ``--num-gpus``/``--num-machines``, checked against this machine.

    Raises:
        ConfigError: a count below 1, a machine rank out of range, or more
            processes per machine than GPUs when CUDA is used.
    """
    if not is_int(num_gpus) or num_gpus < 1:
        raise ConfigError(f"--num-gpus must be an integer >= 1, got {num_gpus}")
    if not is_int(num_machines) or num_machines < 1:
        raise ConfigError(f"--num-machines must be an integer >= 1, got {num_machines}")
    if not 0 <= machine_rank < num_machines:
        raise ConfigError(f"--machine-rank must be in [0, {num_machines}), got {machine_rank}")
    if torch.cuda.is_available() and num_gpus > torch.cuda.device_count():
        raise ConfigError(
            f"--num-gpus {num_gpus} asks for {num_gpus} processes, one per GPU, but this machine has "
            f"{torch.cuda.device_count()} GPU(s)"
        )
    return num_gpus * num_machines


def _node_target(node: Any) -> Optional[str]:
    if isinstance(node, DictConfig) and "_target_" in node:
        return target_name(node._target_)
    return None


def _evaluator_metric_names(cfg: DictConfig) -> Optional[List[str]]:
    """The result names of a ``dataloader.evaluator`` built by ``build_evaluator``,
    its metric names checked; None when they cannot all be known from the config
    (a torchmetrics object or an evaluator among them)."""
    node = cfg.dataloader.get("evaluator") if isinstance(cfg.dataloader, DictConfig) else None
    if node is None or _node_target(node) not in (
        "treadle.evaluation.build_evaluator", "treadle.evaluation.registry.build_evaluator"
    ):
        return None
    metrics = node.get("metrics")
    items = [metrics] if isinstance(metrics, str) else list(metrics or [])
    from treadle.evaluation import available_metrics
    from treadle.evaluation.registry import lookup_metric

    names: List[str] = []
    complete = True
    for item in items:
        if isinstance(item, (ListConfig, list, tuple)) and len(item) == 2 and isinstance(item[0], str):
            name = item[0]  # (name, options) or (name, metric)
        elif isinstance(item, str):
            name = item
        else:
            complete = False  # an object: its names are known once built
            continue
        names.append(name)
        if isinstance(item, str) or isinstance(item[1], (DictConfig, dict)) and "_target_" not in item[1]:
            try:
                lookup_metric(name)
            except KeyError:
                close = difflib.get_close_matches(name, available_metrics(), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(
                    f"dataloader.evaluator.metrics: unknown metric {name!r}; {hint}valid metrics: "
                    f"{', '.join(available_metrics())}"
                ) from None
    return names if complete else None


def check_watched_metric(key: str, metric: str, known: Optional[Iterable[str]]) -> None:
    """Raises a ConfigError when ``metric`` (watched by ``key``) is not among the
    evaluation's result names ``known`` (``None``: unknown, not checked).

    A name may address a nested result (``"val/accuracy"`` for
    ``{"val": {"accuracy": ...}}``)."""
    if known is None:
        return
    names = sorted(known)
    if metric in names or metric.split("/")[0] in names:
        return
    close = difflib.get_close_matches(metric, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{key}={metric!r} is not a result of the evaluation; {hint}it computes: {', '.join(names)}")


def warn_contradicting_mode(mode_key: str, mode: Optional[str], metric_key: str, metric: str,
                            known_mode: Optional[str]) -> None:
    """Warns, in one line naming both settings, when ``mode`` (given by
    ``mode_key``) goes against the direction ``known_mode`` in which
    ``metric`` improves (``None``: not known, nothing said).

    A warning, not an error: a user may mean it (a metric named like
    ``accuracy`` that is lower-is-better), but usually the best checkpoint
    would keep the worst evaluation and early stopping would stop on progress."""
    if mode is None or known_mode is None or mode == known_mode:
        return
    better = "higher" if known_mode == "max" else "lower"
    logger.warning(
        "%s=%r contradicts %s=%r, which is better when %s: the best checkpoint and early stopping will "
        "favour its %s values",
        mode_key, mode, metric_key, metric, better, "lowest" if known_mode == "max" else "highest",
    )


def check_run_config(cfg: DictConfig, *, world_size: int = 1, eval_only: bool = False) -> None:
    """Checks a runnable config before anything is built or written.

    Raises:
        ConfigError: naming the first problem found (see the module docstring).
    """
    _check_sections(cfg, eval_only)
    _check_schema(cfg.train, TRAIN_KEYS, "train")
    check_top_level_nodes(cfg)
    _check_train_settings(cfg, world_size)
    if not eval_only:
        _check_train_loader(cfg.dataloader.train, world_size)
        _check_optimizer(cfg.optimizer)
        _check_tracker_libraries(cfg)
    _check_evaluation(cfg, eval_only)


def _check_sections(cfg: DictConfig, eval_only: bool) -> None:
    """The top-level sections a run needs are there, are config nodes and can
    be read; the loaders the run uses are given."""
    required = ("model", "dataloader", "train") if eval_only else ("model", "optimizer", "dataloader", "train")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ConfigError(
            f"The config has no {', '.join(repr(m) for m in missing)}: a runnable config defines model, "
            "optimizer, lr_multiplier, dataloader (train, test, evaluator) and train"
        )
    for key in required:
        node = child_node(cfg, key)
        if not isinstance(node, DictConfig) or is_none(node):
            got = shown(raw_value(node)) if node is not None else "nothing"
            raise ConfigError(f"{key} must be a config node (a LazyCall or a dict), got {got}")
    # train first: other sections interpolate its values (``${train.max_iter}``),
    # and the error should name the key whose own value is broken.
    _check_readable(cfg.train, "train")
    _check_readable(cfg)
    if not isinstance(cfg.dataloader, DictConfig):
        raise ConfigError(f"dataloader must be a config node (train, test, evaluator), got {shown(cfg.dataloader)}")
    if not eval_only and cfg.dataloader.get("train") is None:
        raise ConfigError("The config has no dataloader.train: training needs a train loader")
    if eval_only and cfg.dataloader.get("test") is None:
        raise ConfigError("--eval-only needs dataloader.test, and the config has none")


def _check_train_settings(cfg: DictConfig, world_size: int) -> None:
    """The values of ``train`` that go together, or with the world size and
    the machine: nodes that must not be None, the seed, fp16, clipping."""
    train = cfg.train
    for key in ("step", "checkpointer"):
        if key in train and train[key] is None:
            hint = " (train.checkpointer.period=0 turns periodic checkpoints off)" if key == "checkpointer" else ""
            raise ConfigError(f"train.{key} must be a config node, got None{hint}")
    seed = train_setting(cfg, "seed")
    if is_int(seed) and seed >= 0 and seed + world_size > 2**32:
        raise ConfigError(
            f"train.seed={seed} is too large: each process seeds with train.seed + rank, which must be below 2**32"
        )
    step = train.get("step")
    own_step = isinstance(step, DictConfig) and "_target_" in step  # its arguments are its own
    if not own_step and train_setting(cfg, "step.precision") == "fp16":
        device = train_setting(cfg, "device")
        if not torch.cuda.is_available() or (isinstance(device, str) and device.startswith(("cpu", "mps"))):
            raise ConfigError(
                "train.step.precision='fp16' needs a CUDA device (it trains with a GradScaler); "
                "use 'bf16' on this machine"
            )
    clip_norm, clip_value = train_setting(cfg, "step.clip_grad_norm"), train_setting(cfg, "step.clip_grad_value")
    if not own_step and clip_norm is not None and clip_value is not None:
        raise ConfigError(
            f"train.step.clip_grad_norm={clip_norm!r} and train.step.clip_grad_value={clip_value!r}: clip by norm "
            "or by value, not both (set the other to None)"
        )


def _check_evaluation(cfg: DictConfig, eval_only: bool) -> None:
    """The test loader, and the metrics that the best checkpointer and early
    stopping watch: something is evaluated, and computes them."""
    known = _evaluator_metric_names(cfg)
    has_test = cfg.dataloader.get("test") is not None
    if has_test:
        _check_loader_is_a_call("dataloader.test", cfg.dataloader.test)
        if known is not None and "loss" in known:
            _check_evaluation_loss(cfg)
    for section in ("best_checkpointer", "early_stopping"):
        metric = train_setting(cfg, f"{section}.metric")
        if metric and not has_test and not eval_only:
            raise ConfigError(
                f"train.{section}.metric={metric!r} watches an evaluation, and dataloader.test is None: nothing "
                f"is evaluated. Give a test loader, or set train.{section}.metric=None"
            )
        if metric and has_test:
            check_watched_metric(f"train.{section}.metric", metric, known)
        if metric:
            from treadle.evaluation import known_metric_mode

            warn_contradicting_mode(f"train.{section}.mode", train_setting(cfg, f"{section}.mode"),
                                    f"train.{section}.metric", metric, known_metric_mode(metric))


def _takes_loss_fn(target: Any) -> bool:
    """Whether a step class follows the loss contract: it takes a ``loss_fn``
    (or passes keywords on, as an ``EagerStep`` subclass does). Unknown (a
    target that cannot be imported or inspected, reported when it is built): True."""
    try:
        parameters = inspect.signature(locate(target_name(target))).parameters.values()
    except (ConfigError, TypeError, ValueError):
        return True
    return any(p.name == "loss_fn" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _check_evaluation_loss(cfg: DictConfig) -> None:
    """An evaluation that computes ``loss`` has a loss to compute it with.

    A research step whose class takes no ``loss_fn`` computes its loss its
    own way, which the evaluation cannot call; without a ``loss_fn`` of the
    evaluator's, the evaluation would feed the model the whole batch and read
    its outputs as the loss, and fail at the first evaluation. (A step with a
    ``loss_fn`` parameter and none given follows the contract: the model
    computes its own loss, in training and in evaluation alike.)"""
    step, evaluator = cfg.train.get("step"), cfg.dataloader.evaluator
    if not (isinstance(step, DictConfig) and "_target_" in step) or step.get("loss_fn") is not None:
        return
    if evaluator.get("loss_fn") is not None or evaluator.get("compute_loss") is not None:
        return
    if not _takes_loss_fn(step._target_):
        name = target_name(step._target_).rsplit(".", 1)[-1]
        raise ConfigError(
            f"dataloader.evaluator computes 'loss' and has no loss_fn, and train.step ({name}) computes its loss "
            "its own way: set dataloader.evaluator.loss_fn (e.g. L(torch.nn.CrossEntropyLoss)())"
        )


def enabled_trackers(cfg: Any) -> List[str]:
    """The trackers a config's ``train.writers`` turns on: ``"mlflow"`` when
    its ``tracking_uri`` or ``experiment_name`` is set, ``"wandb"`` when its
    ``project`` is set."""
    out = []
    mlflow = ("writers.mlflow.tracking_uri", "writers.mlflow.experiment_name")
    if any(train_setting(cfg, key) is not None for key in mlflow):
        out.append("mlflow")
    if train_setting(cfg, "writers.wandb.project") is not None:
        out.append("wandb")
    return out


def _check_tracker_libraries(cfg: Any) -> None:
    import importlib.util

    for name in enabled_trackers(cfg):
        if importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"train.writers.{name} is set, but the '{name}' package is not installed: "
                f'pip install "treadle[{name}]"'
            )


def _check_loader_is_a_call(key: str, node: Any) -> None:
    # DefaultTrainer instantiates the node: a dict without _target_ comes back
    # a dict, which training would iterate as a loader (its keys as batches)
    # and fail on at iteration 0, after the run folder is written.
    if isinstance(node, DictConfig) and "_target_" not in node:
        keys = ", ".join(str(k) for k in node.keys()) or "none"
        raise ConfigError(
            f"{key} is a plain dict (keys: {keys}), not a loader: make it a LazyCall, e.g. "
            f"L(build_{'train' if key.endswith('train') else 'test'}_loader)(dataset=..., ...)"
        )


def _check_train_loader(node: Any, world_size: int) -> None:
    _check_loader_is_a_call("dataloader.train", node)
    if not isinstance(node, DictConfig):
        return
    batch = node.get("total_batch_size", _MISSING)
    if batch is not _MISSING:
        if not is_int(batch) or batch < 1:
            raise ConfigError(f"dataloader.train.total_batch_size must be an integer >= 1, got {shown(batch)}")
        if batch % world_size:
            raise ConfigError(
                f"dataloader.train.total_batch_size={batch} is not divisible by the world size {world_size} "
                "(it is the batch over all processes)"
            )
    workers = node.get("num_workers", _MISSING)
    if workers is not _MISSING:
        integer(0)("dataloader.train.num_workers", workers)


def _check_optimizer(node: Any) -> None:
    if not isinstance(node, DictConfig):
        return
    for key in _NON_NEGATIVE_OPTIMIZER_KEYS:
        if key in node:
            value = node[key]
            if value is not None and not (is_number(value) and value >= 0):
                raise ConfigError(f"optimizer.{key} must be a number >= 0, got {shown(value)}")
