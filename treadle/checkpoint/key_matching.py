"""Matching a checkpoint's weights to a model by name, across wrappers.

A model's parameter names change when it is wrapped: DDP and DataParallel add
``module.``, ``torch.compile`` adds ``_orig_mod.`` (at the top, or inside when
a submodule was compiled). Weights saved from one form must load into any
other, so both sides are compared by *canonical* names: every ``_orig_mod``
segment removed, then a leading ``module.`` removed while every key has it.

What cannot be loaded is skipped, never silently: a shape mismatch, a
missing or an unexpected key each appear in the returned :class:`LoadReport`
and in a logged table.
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

import torch
from tabulate import tabulate
from torch import nn

from treadle.utils.torch_internals import compiled_module, set_state_dict_metadata, state_dict_metadata

from .fsdp import full_model_state_dict, is_fsdp_model, shard_model_state_dict
from .serialization import CheckpointError

__all__ = [
    "align_by_suffix",
    "LoadReport",
    "ShapeMismatch",
    "unwrap_model",
    "model_state_for_saving",
    "canonical_keys",
    "extract_model_state",
    "load_model_state",
]

logger = logging.getLogger(__name__)

_COMPILE_SEGMENT = "_orig_mod"
_DDP_PREFIX = "module."


def _is_fsdp(model: nn.Module) -> bool:
    # An FSDP model implies its module was imported; never import it here.
    fsdp = sys.modules.get("torch.distributed.fsdp")
    wrapper = getattr(fsdp, "FullyShardedDataParallel", None)
    return wrapper is not None and isinstance(model, wrapper)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module a user wrote: strips DDP/DataParallel ``.module`` and
    ``torch.compile``'s ``_orig_mod``, in any nesting.

    Raises:
        NotImplementedError: the model is wrapped in FSDP1's
            ``FullyShardedDataParallel`` (FSDP2 models are not wrappers: they
            are returned as they are).
    """
    while True:
        if _is_fsdp(model):
            raise NotImplementedError(
                "treadle checkpoints do not support the FullyShardedDataParallel (FSDP1) wrapper; shard "
                "with FSDP2 instead (torch.distributed.fsdp.fully_shard, or "
                "treadle.engine.data_parallel.create_fsdp_model), whose models checkpoints save and load."
            )
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
            continue
        inner = compiled_module(model)
        if inner is not None:
            model = inner
            continue
        return model


def _drop_compile_segments(name: str) -> str:
    return ".".join(p for p in name.split(".") if p != _COMPILE_SEGMENT)


def _module_of(key: str) -> str:
    return key.rpartition(".")[0]


def model_state_for_saving(model: nn.Module) -> Dict[str, Any]:
    """The state dict of the unwrapped model, with the ``_orig_mod`` segments of
    compiled submodules removed, so that a saved file loads into the plain model
    with ``load_state_dict`` alone. Module versions (``_metadata``) are kept.

    For an FSDP2 (``fully_shard``) model: the full, unsharded state on the CPU
    of the main process (``{}`` elsewhere); a collective, to call on every rank.
    """
    target = unwrap_model(model)
    if is_fsdp_model(target):
        # Sharded: gathered on every rank, kept on the main process (see fsdp.py).
        return full_model_state_dict(target)
    state = target.state_dict()
    if not any(_COMPILE_SEGMENT in k.split(".") for k in state):
        return state
    out: "OrderedDict[str, Any]" = OrderedDict((_drop_compile_segments(k), v) for k, v in state.items())
    metadata = state_dict_metadata(state)
    if metadata is not None:
        set_state_dict_metadata(out, OrderedDict((_drop_compile_segments(k), v) for k, v in metadata.items()))
    return out


def canonical_keys(keys: Iterable[str]) -> Dict[str, str]:
    """``{canonical name: original name}`` for state-dict keys.

    Removes every ``_orig_mod`` segment (a name torch.compile reserves), then a
    leading ``module.`` while *every* key has it (a submodule that happens to
    be called ``module``, next to others, keeps its name).

    Raises:
        ValueError: two keys become the same name.
    """
    keys = list(keys)
    names = [_drop_compile_segments(k) for k in keys]
    while names and all(n.startswith(_DDP_PREFIX) for n in names):
        names = [n[len(_DDP_PREFIX):] for n in names]
    out: Dict[str, str] = {}
    for name, key in zip(names, keys):
        if name in out:
            raise ValueError(
                f"State-dict keys '{out[name]}' and '{key}' are the same parameter '{name}' once "
                f"wrapper prefixes (module., _orig_mod.) are removed; the state dict is ambiguous."
            )
        out[name] = key
    return out


def _apply_prefix_map(names: Iterable[str], prefix_map: Mapping[str, str]) -> Dict[str, str]:
    """``{renamed: name}``: the longest matching old prefix of each name is replaced."""
    ordered = sorted(prefix_map.items(), key=lambda kv: -len(kv[0]))
    out: Dict[str, str] = {}
    for name in names:
        new = name
        for old, repl in ordered:
            if name.startswith(old):
                new = repl + name[len(old):]
                break
        if new in out:
            raise ValueError(f"prefix_map renames both '{out[new]}' and '{name}' to '{new}'.")
        out[new] = name
    return out


class ShapeMismatch(NamedTuple):
    """A key present on both sides whose tensors have different shapes (it is skipped)."""

    key: str
    checkpoint_shape: Tuple[int, ...]
    model_shape: Tuple[int, ...]


@dataclass
class LoadReport:
    """What loading a state dict into a model did, by canonical key name.

    Attributes:
        loaded: keys copied into the model.
        missing: model keys the checkpoint has no value for (they keep their
            current values).
        unexpected: checkpoint keys the model has no parameter or buffer for.
        shape_mismatched: keys on both sides with different shapes (skipped).
        source: the file (or "a state dict") the weights came from.
        shapes: ``{key: (checkpoint shape, model shape)}`` as text for the
            table; "-" where a side has no such key, "" for non-tensor values.
    """

    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    shape_mismatched: List[ShapeMismatch] = field(default_factory=list)
    source: str = "a state dict"
    shapes: Dict[str, Tuple[str, str]] = field(default_factory=dict, repr=False)

    @property
    def complete(self) -> bool:
        """True when every key on both sides matched."""
        return not (self.missing or self.unexpected or self.shape_mismatched)

    def summary(self, limit: int = 3) -> str:
        """One line: what did not match, a few keys of each kind named."""

        def some(items: List[str]) -> str:
            return ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")

        parts = []
        if self.shape_mismatched:
            shown = [f"{m.key}: checkpoint {tuple(m.checkpoint_shape)}, model {tuple(m.model_shape)}" for m in self.shape_mismatched]
            parts.append(f"{len(self.shape_mismatched)} of different shapes ({some(shown)})")
        if self.missing:
            parts.append(f"{len(self.missing)} missing from the weights ({some(self.missing)})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} not in the model ({some(self.unexpected)})")
        return "; ".join(parts) or "all keys match"

    def table(self, *, include_loaded: bool = True) -> str:
        """A tabulate table: status, key, checkpoint shape, model shape.

        Loaded keys are grouped by their module (``backbone.conv1.{bias, weight}``)
        to keep the table short.
        """
        rows: List[Tuple[str, str, str, str]] = []
        if include_loaded:
            rows += [("loaded", k, "", "") for k in _group_by_module(self.loaded)]
        rows += [("shape mismatch", m.key, str(tuple(m.checkpoint_shape)), str(tuple(m.model_shape)))
                 for m in self.shape_mismatched]
        rows += [("missing", k, "-", self.shapes.get(k, ("-", ""))[1]) for k in self.missing]
        rows += [("unexpected", k, self.shapes.get(k, ("", "-"))[0], "-") for k in self.unexpected]
        return tabulate(rows, headers=["status", "key", "checkpoint shape", "model shape"], tablefmt="pipe")


def _group_by_module(keys: List[str]) -> List[str]:
    groups: "OrderedDict[str, List[str]]" = OrderedDict()
    for k in keys:
        parent, _, leaf = k.rpartition(".")
        groups.setdefault(parent, []).append(leaf)
    out = []
    for parent, leaves in groups.items():
        dot = "." if parent else ""
        out.append(f"{parent}{dot}{leaves[0]}" if len(leaves) == 1 else f"{parent}{dot}{{{', '.join(sorted(leaves))}}}")
    return out


def _shape_text(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else ""


def extract_model_state(checkpoint: Mapping[str, Any], source: str) -> Tuple[Mapping[str, Any], Optional[str]]:
    """The model weights in a loaded file, and the key they were under.

    Accepts a treadle/detectron2 checkpoint (``"model"``), a Lightning one
    (``"state_dict"``) or a bare ``model.state_dict()`` (key ``None``).

    Raises:
        CheckpointError: none of these shapes, naming ``source`` and its keys.
    """
    for container in ("model", "state_dict"):
        if isinstance(checkpoint.get(container), Mapping):
            return checkpoint[container], container
    if checkpoint and all(
        isinstance(k, str) and (isinstance(v, torch.Tensor) or k.endswith("_extra_state"))
        for k, v in checkpoint.items()
    ):
        return checkpoint, None
    shown = ", ".join(repr(k) for k in list(checkpoint)[:10]) or "none"
    raise CheckpointError(
        f"Checkpoint '{source}' holds no model weights: no 'model' or 'state_dict' entry and it is not "
        f"a state dict of tensors (top-level keys: {shown})."
    )


def align_by_suffix(model_keys: Iterable[str], state_dict: Mapping[str, Any]) -> Dict[str, Any]:
    """``state_dict`` with each key renamed to the model key it is the longest
    dotted suffix of (detectron2's matching heuristics): weights saved from a
    part of a model (a backbone's ``layer1.weight``) find their place in the
    whole one (``backbone.layer1.weight``).

    A checkpoint key that is the best match of several model keys is loaded
    into none of them, with a warning: guessing would load a tensor twice.
    Keys that match no model key keep their names (reported as unexpected).
    """
    model_keys = list(canonical_keys(model_keys))
    ckpt_names = canonical_keys(state_dict.keys())
    chosen: Dict[str, List[str]] = {}
    for model_key in model_keys:
        best = None
        for name in ckpt_names:
            if (model_key == name or model_key.endswith("." + name)) and (best is None or len(name) > len(best)):
                best = name
        if best is not None:
            chosen.setdefault(best, []).append(model_key)
    out: Dict[str, Any] = {}
    for name, ckpt_key in ckpt_names.items():
        targets = chosen.get(name, [])
        if len(targets) > 1:
            logger.warning("Checkpoint key %s matches several model keys (%s); it is not loaded.", name, ", ".join(targets))
            continue
        out[targets[0] if targets else name] = state_dict[ckpt_key]
    return out


def load_model_state(
    model: nn.Module,
    state_dict: Mapping[str, Any],
    *,
    prefix_map: Optional[Mapping[str, str]] = None,
    source: str = "a state dict",
    strict: bool = False,
) -> LoadReport:
    """Copies the matching entries of ``state_dict`` into ``model`` (unwrapped).

    With ``strict``, a missing, unexpected or shape-mismatched key raises a
    :class:`CheckpointError` summarizing them, before anything is loaded: for
    a resume, where the checkpoint must be of this very model.

    Keys are compared by canonical name (see :func:`canonical_keys`), after
    ``prefix_map`` (``{old prefix: new prefix}``, applied to canonical
    checkpoint names, longest prefix first; ``{"": "backbone."}`` loads a bare
    backbone into ``model.backbone``). Tensors whose shapes differ are skipped.
    Nothing is logged here; see :func:`~treadle.checkpoint.init_weights_from` and the
    :class:`~treadle.checkpoint.Checkpointer`.
    """
    bad = [k for k in state_dict if not isinstance(k, str)]
    if bad:
        raise CheckpointError(f"The model weights in {source} have non-string keys, e.g. {bad[0]!r}.")
    target = unwrap_model(model)
    own = target.state_dict()
    own_names = canonical_keys(own.keys())
    ckpt_names = canonical_keys(state_dict.keys())
    if prefix_map:
        renamed = _apply_prefix_map(ckpt_names.keys(), prefix_map)
        ckpt_names = {new: ckpt_names[old] for new, old in renamed.items()}

    report = LoadReport(source=source)
    to_load: Dict[str, Any] = {}
    pairs: Dict[str, str] = {}  # model key -> checkpoint key, for module versions
    for name, ckpt_key in ckpt_names.items():
        if name not in own_names:
            report.unexpected.append(name)
            report.shapes[name] = (_shape_text(state_dict[ckpt_key]), "-")
            continue
        own_key = own_names[name]
        value, current = state_dict[ckpt_key], own[own_key]
        if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor) and value.shape != current.shape:
            report.shape_mismatched.append(ShapeMismatch(name, tuple(value.shape), tuple(current.shape)))
            continue
        to_load[own_key] = value
        pairs[own_key] = ckpt_key
        report.loaded.append(name)
    report.missing = [name for name in own_names if name not in ckpt_names]
    for name in report.missing:
        report.shapes[name] = ("-", _shape_text(own[own_names[name]]))
    if strict and not report.complete:
        raise CheckpointError(f"The model does not match the weights in {source}: {report.summary()}.")

    to_load = _with_metadata(to_load, own, state_dict, pairs)
    if is_fsdp_model(target):
        # Each rank keeps its shard of the full tensors it read (see fsdp.py).
        to_load = shard_model_state_dict(target, to_load)
    result = target.load_state_dict(to_load, strict=False)
    # Modules with their own _load_from_state_dict may still refuse a key.
    refused = set(result.unexpected_keys)
    if refused:
        back = {v: k for k, v in own_names.items()}
        names = {back.get(k, k) for k in refused}
        report.loaded = [k for k in report.loaded if k not in names]
        report.unexpected += sorted(names)
    return report


def _with_metadata(
    to_load: Dict[str, Any], own: Mapping[str, Any], state_dict: Mapping[str, Any], pairs: Dict[str, str]
) -> "OrderedDict[str, Any]":
    """``to_load`` with the ``_metadata`` (module versions) ``load_state_dict`` reads.

    Without it every module would be treated as saved by its oldest version
    and might apply a legacy conversion. Each module takes its version from
    the checkpoint (under the checkpoint's name for it), else from the model.
    """
    out: "OrderedDict[str, Any]" = OrderedDict(to_load)
    own_meta = state_dict_metadata(own)
    if own_meta is None:
        return out
    ckpt_meta = state_dict_metadata(state_dict) or {}
    metadata = OrderedDict(own_meta)
    for own_key, ckpt_key in pairs.items():
        own_module, ckpt_module = _module_of(own_key), _module_of(ckpt_key)
        if ckpt_module in ckpt_meta:
            metadata[own_module] = ckpt_meta[ckpt_module]
    set_state_dict_metadata(out, metadata)
    return out
