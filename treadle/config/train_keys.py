"""The table of ``train`` keys: each key's name, default, rule and meaning, said once.

Three readers share it:

- the shipped ``configs/common/train.py`` builds its ``train`` dict with
  :func:`train_defaults` (and lists the table in its docstring);
- validation (:func:`treadle.config.validation.check_run_config`) checks each
  value with the key's rule (:mod:`treadle.config.rules`);
- code that reads a config gets a key the config lacks as the table's default,
  through :func:`train_setting` (one key) or :func:`train_section` (a sub-node
  as a dict), never through a literal of its own.

``python -m treadle.config.train_keys`` prints the table as the shipped
config's docstring shows it. Importing this module imports neither torch nor
OmegaConf.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from .errors import ConfigError
from .rules import (
    Rule,
    anything,
    boolean,
    choice,
    compile_backend,
    device,
    integer,
    non_negative_number,
    num_threads,
    path,
    positive_number,
    seed,
    shown,
    text,
)

__all__ = [
    "TrainKey",
    "KEYS",
    "SECTIONS",
    "PRECISIONS",
    "STEP_KINDS",
    "FSDP_OPTIONS",
    "train_defaults",
    "train_rules",
    "train_default",
    "train_setting",
    "train_section",
    "check_options",
    "wrapper_options",
    "describe",
]

#: ``train.step.precision``: full precision, bfloat16 autocast, float16 autocast with a GradScaler.
PRECISIONS = ("fp32", "bf16", "fp16")
#: ``train.step.kind``: the eager step, or the step compiled with ``torch.compile``.
STEP_KINDS = ("eager", "compiled")
_COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_MODES = (None, "max", "min")
#: The keys of ``train.ddp`` that only FSDP takes; the others (but ``kind``) only DDP takes.
FSDP_OPTIONS = ("reshard_after_forward", "param_dtype", "reduce_dtype", "sync_module_states")


@dataclass(frozen=True)
class TrainKey:
    """One key of ``train``: its dotted name below ``train``, its default,
    the rule its value must follow, and one line on what it does."""

    name: str
    default: Any
    rule: Rule
    doc: str


_K = TrainKey
_NAME = text(empty=False, none=True)

#: Every key of ``train``, in the order of the shipped config. Defaults are
#: immutable values (strings, numbers, booleans, None).
KEYS: Tuple[TrainKey, ...] = (
    _K("output_dir", "./output", path(empty=False),
       "The run's folder: checkpoints, metrics.json, log.txt, config.yaml."),
    _K("init_checkpoint", "", path(none=True),
       "Weights loaded at the start when not resuming (e.g. a pre-trained backbone); '' for none."),
    _K("max_iter", 1000, integer(1), "Iterations to train (one iteration = one optimizer update)."),
    _K("device", "auto", device, "'auto' picks cuda, then mps, then cpu; or 'cpu', 'cuda', 'cuda:N', 'mps'."),
    _K("num_threads", "auto", num_threads,
       "CPU threads of torch's operations: 'auto' trains on the CPU with one (more wait for each other beside "
       "other work), on a GPU with torch's count; None: torch's count; an integer: that many. "
       "OMP_NUM_THREADS, when set, wins. See docs/performance.md."),
    _K("seed", 0, seed,
       "Python, numpy and torch are seeded with seed + rank; a negative seed (or None) picks one and logs it."),
    _K("log_period", 20, integer(1), "Iterations between writes to metrics.json, TensorBoard and the console."),
    _K("eval_period", 200, integer(0), "Iterations between evaluations; 0 evaluates only after training."),
    _K("checkpointer.period", 200, integer(0),
       "Iterations between periodic checkpoints; 0: none (model_final is still written)."),
    _K("checkpointer.max_to_keep", 3, integer(1, none=True),
       "Periodic checkpoints kept (the oldest are deleted); None keeps every one."),
    _K("checkpointer.async_save", False, boolean,
       "Write periodic checkpoints in a background thread from a copy in host memory (training stalls only "
       "for the copy); a failed background save stops training at the next iteration."),
    _K("checkpointer.format", None, choice((None, "file", "dcp")),
       "'file' (one weights-only .pth file) or 'dcp' (a torch.distributed.checkpoint directory of per-rank "
       "shards, loadable on another world size); None: 'dcp' under FSDP, else 'file'."),
    _K("checkpointer.export_safetensors", False, boolean, "Also write model_final.safetensors."),
    _K("writers.mlflow.tracking_uri", None, _NAME, "The MLflow server (or file store) to log to."),
    _K("writers.mlflow.experiment_name", None, _NAME, "The MLflow experiment."),
    _K("writers.mlflow.run_name", None, _NAME, "The MLflow run's name."),
    _K("writers.mlflow.tags", None, anything, "A dict of tags of the MLflow run."),
    _K("writers.mlflow.log_model", False, boolean, "Upload model_final.pth as an artifact at the end."),
    _K("writers.wandb.project", None, _NAME, "The W&B project."),
    _K("writers.wandb.name", None, _NAME, "The W&B run's name."),
    _K("writers.wandb.mode", "online", choice(("online", "offline", "disabled")), "'online', 'offline' or 'disabled'."),
    _K("writers.wandb.entity", None, _NAME, "The W&B team or user."),
    _K("writers.wandb.tags", None, anything, "A list of tags of the W&B run."),
    _K("step.kind", "eager", choice(STEP_KINDS), "'eager', or 'compiled' (through torch.compile)."),
    _K("step.precision", "fp32", choice(PRECISIONS),
       "'fp32', 'bf16' (autocast, CPU or GPU) or 'fp16' (autocast on CUDA, with a GradScaler)."),
    _K("step.grad_accum_steps", 1, integer(1), "Micro-batches whose gradients make one optimizer update."),
    _K("step.clip_grad_norm", None, positive_number(none=True), "Clip the gradients' total norm to this; None: no clipping."),
    _K("step.clip_grad_value", None, positive_number(none=True),
       "Clamp each gradient element to [-value, value]; None: no clipping. Not with clip_grad_norm."),
    _K("step.loss_fn", None, anything,
       "loss = loss_fn(model(inputs), targets) on (inputs, targets) batches, "
       "loss_fn(model(**rest), batch['labels']) on dict batches (the model gets the batch without its "
       "'labels'); None: the model returns its loss."),
    _K("step.compile.mode", None, choice(_COMPILE_MODES),
       "torch.compile's mode; 'reduce-overhead' uses CUDA graphs on GPU."),
    _K("step.compile.backend", "inductor", compile_backend, "torch.compile's backend."),
    _K("step.compile.fullgraph", False, boolean, "Fail on a graph break instead of splitting the graph."),
    _K("step.compile.dynamic", None, choice((None, True, False)),
       "Compile for dynamic shapes (True), static ones (False) or decide on a recompile (None)."),
    _K("ddp.kind", "ddp", choice(("ddp", "fsdp")),
       "'ddp' (DistributedDataParallel) or 'fsdp' (FSDP2 sharding)."),
    _K("ddp.broadcast_buffers", False, boolean, "DDP: broadcast rank 0's buffers before each forward."),
    _K("ddp.find_unused_parameters", False, boolean, "DDP: allow parameters that get no gradient in a step."),
    _K("ddp.fp16_compression", False, boolean, "DDP: all-reduce gradients in fp16 (half the traffic)."),
    _K("ddp.gradient_as_bucket_view", False, boolean, "DDP: gradients are views into the all-reduce buckets (less memory)."),
    _K("ddp.static_graph", False, boolean, "DDP: the set of used parameters never changes between steps."),
    _K("ddp.bucket_cap_mb", None, positive_number(none=True), "DDP: the all-reduce bucket size in MiB; None: torch's."),
    _K("ddp.reshard_after_forward", True, boolean,
       "FSDP: free the gathered parameters after forward (less memory, one more all-gather in backward)."),
    _K("ddp.param_dtype", None, choice((None, *PRECISIONS)), "FSDP: the dtype of the gathered parameters; None: theirs."),
    _K("ddp.reduce_dtype", None, choice((None, *PRECISIONS)), "FSDP: the dtype of the gradient reduction; None: theirs."),
    _K("ddp.sync_module_states", True, boolean, "FSDP: broadcast rank 0's initial weights first, as DDP does."),
    _K("ema.enabled", False, boolean, "Keep an exponential moving average of the weights; evaluate with it."),
    _K("ema.decay", 0.999, positive_number(below_one=True), "The old average's weight per update."),
    _K("best_checkpointer.metric", None, _NAME,
       "Save model_best when this evaluation metric improves; None: off."),
    _K("best_checkpointer.mode", None, choice(_MODES),
       "'max' or 'min'; None follows the metric: 'min' for losses, errors, cer, wer, perplexity, else 'max'."),
    _K("early_stopping.metric", None, _NAME,
       "Stop when this evaluation metric has not improved for `patience` evaluations; None: off."),
    _K("early_stopping.patience", 5, integer(1), "Evaluations without improvement before stopping."),
    _K("early_stopping.min_delta", 0.0, non_negative_number, "The smallest change that counts as an improvement."),
    _K("early_stopping.mode", None, choice(_MODES), "'max' or 'min'; None follows the metric, as best_checkpointer.mode."),
    _K("handle_preemption", True, boolean, "On SIGTERM/SIGUSR1: checkpoint at the next step and exit with status 75."),
    # 300 s: longer than a rank waits for another in a healthy run (rank 0
    # writing a checkpoint, an uneven evaluation, a slow start), far shorter
    # than torch's 30 minutes, so that a group that lost a rank is restarted
    # by torchrun within minutes instead of hanging.
    _K("dist_timeout", 300, positive_number(unit="seconds"),
       "Seconds a process waits for the others: joining the process group and in each collective; past it, "
       "it exits (one line) so that torchrun can restart the group. See docs/distributed.md."),
    _K("nonfinite_check", "flush", choice(("flush", "step", "off")),
       "When to look for NaN losses: 'flush' (no extra sync), 'step' (every iteration) or 'off'."),
    _K("cudnn_benchmark", False, boolean,
       "torch.backends.cudnn.benchmark on CUDA: faster convolutions for fixed input sizes, not bit-reproducible."),
)

#: One line on each sub-node of ``train``.
SECTIONS: Dict[str, str] = {
    "checkpointer": "Periodic checkpoints and model_final; see docs/checkpoints.md.",
    "writers": 'Experiment trackers, optional extras (pip install "treadle[mlflow]" or "treadle[wandb]"); '
    "see docs/writers.md.",
    "writers.mlflow": "MLflow, on when tracking_uri or experiment_name is set.",
    "writers.wandb": "Weights & Biases, on when project is set.",
    "step": "The step object that runs each iteration; a LazyCall of a StepBase class instead is a research loop.",
    "step.compile": "torch.compile's options, for kind='compiled'.",
    "ddp": "How the model is wrapped when more than one process trains; the options of the other kind stay at "
    "their defaults. See docs/distributed.md.",
    "ema": "Exponential moving average of the weights (the EMA hook).",
    "best_checkpointer": "model_best, saved when an evaluation metric improves.",
    "early_stopping": "Stopping when an evaluation metric stops improving.",
}

_BY_NAME: Dict[str, TrainKey] = {key.name: key for key in KEYS}
_MISSING = object()


def _tree(leaf: Any) -> Dict[str, Any]:
    """The table as nested dicts, ``leaf(key)`` at each leaf."""
    tree: Dict[str, Any] = {}
    for key in KEYS:
        *parents, last = key.name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf(key)
    return tree


_TREE = _tree(lambda key: key)


def train_defaults() -> Dict[str, Any]:
    """A new nested dict of every key's default: the shipped ``train``."""
    return _tree(lambda key: key.default)


def train_rules() -> Dict[str, Any]:
    """Every key's rule, as nested dicts (a dict is a sub-node)."""
    return _tree(lambda key: key.rule)


def train_default(key: str) -> Any:
    """The default of ``train.<key>`` (``key`` dotted below ``train``: ``"checkpointer.period"``)."""
    return _entry(key).default


def check_options(setting: str, options: Mapping[str, Any], section: str, *, more: Mapping[str, Rule] = {}) -> None:
    """Checks options of ``train.<section>`` given under another name (the
    plain ``Trainer``'s ``ddp={...}``, ``compile={...}``), before anything is
    built: each key is one of the section's (or of ``more``), each value
    follows its rule.

    Raises:
        ConfigError: one line naming ``setting``, the option and what it takes.
    """
    rules = {name.split(".")[-1]: key.rule for name, key in _BY_NAME.items() if name.rpartition(".")[0] == section}
    rules.update(more)
    for name, value in options.items():
        rule = rules.get(name)
        if rule is None:
            raise ConfigError(f"{setting} has no option {name!r}; its options are {', '.join(sorted(rules))}")
        rule(f"{setting}[{name!r}]", value)


def _entry(key: str) -> TrainKey:
    try:
        return _BY_NAME[key]
    except KeyError:
        raise KeyError(f"train.{key} is not a key of the table in treadle/config/train_keys.py") from None


def _child(node: Any, part: str, path: str) -> Any:
    """``node[part]``, or ``_MISSING`` when ``node`` (None: a node left to its defaults) lacks it."""
    if node is None:
        return _MISSING
    if not isinstance(node, Mapping):
        raise ConfigError(f"{path} must be a config node with keys, got {shown(node)}")
    # Not `part in node`: a DictConfig says False for a key whose value is ???,
    # which must fail when read rather than be taken for the default.
    return node[part] if part in node.keys() else _MISSING


def _walk(cfg: Any, key: str) -> Any:
    """The value of ``train.<key>`` in ``cfg``, or ``_MISSING``."""
    node = _child(cfg, "train", "config")
    path = "train"
    for part in key.split("."):
        if node is _MISSING:
            return _MISSING
        node = _child(node, part, path)
        path = f"{path}.{part}"
    return node


def train_setting(cfg: Any, key: str) -> Any:
    """``cfg.train.<key>``, or the table's default when the config lacks it.

    ``cfg`` is a whole config (a ``DictConfig`` or a dict with a ``train``
    node); ``key`` is dotted below ``train`` (``"checkpointer.period"``) and
    must be in the table. A sub-node that is missing or None counts as
    lacking all its keys; a value that is None is a value.
    """
    entry = _entry(key)
    value = _walk(cfg, key)
    if isinstance(value, os.PathLike):  # a path key's pathlib.Path is read as its string
        return os.fspath(value)
    return entry.default if value is _MISSING else value


def train_section(cfg: Any, key: str) -> Dict[str, Any]:
    """The sub-node ``train.<key>`` of ``cfg`` as a dict: each key of the
    table below it by :func:`train_setting` (a nested sub-node as a dict),
    then any key the config adds that the table lacks, as the config has it."""
    branch = _TREE
    for part in key.split("."):
        branch = branch[part]
    out: Dict[str, Any] = {
        name: train_section(cfg, f"{key}.{name}") if isinstance(entry, dict) else train_setting(cfg, entry.name)
        for name, entry in branch.items()
    }
    node = _walk(cfg, key)
    if isinstance(node, Mapping):
        for name in node.keys():
            if str(name) not in out:
                out[str(name)] = node[name]
    return out


def wrapper_options(kind: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """The options of a ``train.ddp`` node (without ``kind``) that the wrapper
    ``kind`` (``"ddp"`` or ``"fsdp"``) takes, keys the table does not know
    included. The other wrapper's options are dropped when they are at their
    defaults, and refused in one line when they are not.

    Raises:
        ConfigError: an option of the other wrapper is switched on.
    """
    own = {name: value for name, value in options.items() if name != "kind"}
    other, other_kind = ("DistributedDataParallel", "ddp") if kind == "fsdp" else ("FSDP", "fsdp")
    for entry in _TREE["ddp"].values():
        name = entry.name.split(".")[-1]
        if name == "kind" or name not in own or (name in FSDP_OPTIONS) == (kind == "fsdp"):
            continue
        if own.pop(name) != entry.default:
            raise ConfigError(
                f"train.ddp.{name} is an option of {other}; it has no meaning with train.ddp.kind={kind!r}. "
                f"Set it to {entry.default} or use kind={other_kind!r}."
            )
    return own


def describe(width: int = 88) -> str:
    """The table as the docstring of ``configs/common/train.py`` lists it:
    ``train.KEY = DEFAULT`` with the key's doc below it, grouped by sub-node,
    each group under its own line."""
    lines: List[str] = []
    said = set()
    group = None
    for key in KEYS:
        parent = key.name.rpartition(".")[0]
        if parent != group:
            lines.append("")
            group = parent
        parts = key.name.split(".")
        for depth in range(1, len(parts)):
            section = ".".join(parts[:depth])
            if section not in said:
                said.add(section)
                lines += textwrap.wrap(f"train.{section}: {SECTIONS[section]}", width, subsequent_indent="  ")
        lines.append(f"train.{key.name} = {key.default!r}")
        lines += textwrap.wrap(key.doc, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines).strip("\n")


if __name__ == "__main__":
    print(describe())
