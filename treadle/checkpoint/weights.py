"""Initializing a model from another model's weights (fine-tuning).

:func:`init_weights_from` reads weights from any source treadle knows (a
checkpoint file, a ``.safetensors`` file or Hugging Face folder, a DCP
directory, a state dict) and loads those that match by name and shape,
reporting the rest (see :mod:`treadle.checkpoint.key_matching`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Mapping, Optional, Union

from torch import nn

from treadle.utils.file_io import PathManager

from .folder import folder_given_for_a_file
from .key_matching import LoadReport, extract_model_state, load_model_state
from .safetensors_io import is_safetensors_source, load_safetensors_weights
from .serialization import CheckpointError, load_checkpoint_file
from .sharded import dcp_to_file_state, is_dcp_checkpoint, read_dcp

__all__ = ["init_weights_from", "read_weights_file"]

logger = logging.getLogger(__name__)


def read_weights_file(source: str) -> Optional[Dict[str, Any]]:
    """What a weights file holds, read without a model: a checkpoint file's
    contents (``weights_only``, checksums verified), or ``{"model": ...}`` of a
    ``.safetensors`` file or Hugging Face folder; ``None`` for a DCP
    checkpoint directory, which its reader takes shard by shard.

    Raises:
        UnsafeCheckpointError, CheckpointError: the file cannot be read safely,
            or ``source`` is another folder (a run folder: the message names
            its last checkpoint, as ``Checkpointer.load`` does).
    """
    if is_safetensors_source(source):
        return {"model": load_safetensors_weights(source)}
    if os.path.isdir(source):
        if is_dcp_checkpoint(source):
            return None
        # Not DCP's FileNotFoundError about a .metadata the user never named.
        raise CheckpointError(folder_given_for_a_file(source, PathManager))
    return load_checkpoint_file(source)


def init_weights_from(
    model: nn.Module,
    path_or_state_dict: Union[str, Mapping[str, Any]],
    *,
    prefix_map: Optional[Mapping[str, str]] = None,
) -> LoadReport:
    """Initializes ``model`` with the matching weights of another model.

    For fine-tuning: a pretrained backbone into a model with a new head. Keys
    match by canonical name (wrapper prefixes removed, then ``prefix_map``);
    shape-mismatched keys are skipped. A table of loaded, missing, unexpected
    and shape-mismatched keys is logged, and returned as a :class:`LoadReport`.

    Args:
        model: the model to initialize (may be DDP- or compile-wrapped).
        path_or_state_dict: a checkpoint file (read with ``weights_only=True``:
            a treadle checkpoint, a Lightning one or a bare state dict), a
            ``.safetensors`` file, a Hugging Face model folder
            (``model.safetensors`` or sharded with its index), a DCP
            checkpoint directory, or an in-memory mapping of either shape.
        prefix_map: ``{old prefix: new prefix}`` renames applied to the
            checkpoint's names, e.g. ``{"encoder.": "backbone."}``.

    Raises:
        UnsafeCheckpointError, CheckpointError: the file cannot be read safely.
        TypeError: ``path_or_state_dict`` is neither a path nor a mapping.
    """
    if isinstance(path_or_state_dict, Mapping):
        source = "a state dict"
        checkpoint = path_or_state_dict
    elif isinstance(path_or_state_dict, str):
        source = path_or_state_dict
        from_file = read_weights_file(source)
        checkpoint = from_file if from_file is not None else dcp_to_file_state(read_dcp(source))
    else:
        raise TypeError(
            f"init_weights_from expects a file path or a state dict, got {type(path_or_state_dict).__name__}"
        )
    state, _ = extract_model_state(checkpoint, source)
    report = load_model_state(model, state, prefix_map=prefix_map, source=source)
    logger.info(
        "Initialized %s of %s model keys from %s:\n%s",
        len(report.loaded),
        len(report.loaded) + len(report.missing) + len(report.shape_mismatched),
        source,
        report.table(),
    )
    return report
