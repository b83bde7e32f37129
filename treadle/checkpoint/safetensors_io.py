"""Weights in the safetensors format: reading ``.safetensors`` files and
Hugging Face model folders, and exporting a model's weights.

A safetensors file holds named tensors and nothing that could run code, so it
is as safe to read as a weights-only checkpoint. What is read:

- a ``.safetensors`` file;
- a Hugging Face model folder: ``model.safetensors``, or shards listed by
  ``model.safetensors.index.json`` (its ``weight_map`` names the file of each
  tensor), as ``save_pretrained`` writes them.

The library (``safetensors``, a dependency of treadle) is imported when a
file is read or written, not with treadle.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional

import torch

from treadle.utils.atomic import atomic_write

from .serialization import CheckpointError, first_line

__all__ = ["is_safetensors_source", "load_safetensors_weights", "save_safetensors_weights"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def is_safetensors_source(path: str) -> bool:
    """Whether ``path`` is a ``.safetensors`` file or a folder holding
    ``model.safetensors`` or ``model.safetensors.index.json``."""
    if path.endswith(".safetensors"):
        return True
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, SINGLE_FILE)) or os.path.isfile(os.path.join(path, INDEX_FILE))
    )


def _read_file(path: str) -> Dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"Weights file '{path}' does not exist.") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"Weights file '{path}' is truncated or not a safetensors file: {first_line(e)}") from None


def load_safetensors_weights(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or a Hugging Face model folder
    (every shard of its index), on the CPU.

    Raises:
        CheckpointError: a file is missing, truncated or not safetensors, or
            the index is unreadable; one line naming it.
    """
    if not os.path.isdir(path):
        return _read_file(path)
    index_path = os.path.join(path, INDEX_FILE)
    if not os.path.isfile(index_path):
        return _read_file(os.path.join(path, SINGLE_FILE))
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"Index '{index_path}' is unreadable: {first_line(e)}") from None
    state: Dict[str, torch.Tensor] = {}
    for shard in shards:
        if os.path.basename(shard) != shard:
            raise CheckpointError(f"Index '{index_path}' names '{shard}', which is not a file of the folder.")
        state.update(_read_file(os.path.join(path, shard)))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise CheckpointError(
            f"Index '{index_path}' lists {len(missing)} tensor(s) its shards do not hold, e.g. '{missing[0]}'."
        )
    return state


def save_safetensors_weights(state: Mapping[str, Any], path: str, metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes the tensors of ``state`` (a model's state dict) to ``path``,
    atomically. Tensors that share memory (tied weights) are written as
    copies, since the format has no sharing; non-tensor entries are skipped.

    Raises:
        CheckpointError: the file cannot be written.
    """
    from safetensors.torch import save

    tensors = {
        key: value.detach().to("cpu").contiguous() for key, value in state.items() if isinstance(value, torch.Tensor)
    }
    # A copy per shared storage: safetensors refuses tensors that alias.
    data = save(_unshared(tensors), metadata={"format": "pt", **(metadata or {})})
    try:
        atomic_write(path, lambda f: f.write(data))
    except OSError as e:
        raise CheckpointError(f"Cannot write '{path}': {e.strerror or e}.") from None


def _unshared(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    by_storage: Dict[int, str] = {}
    out: Dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in by_storage and tensor.numel() > 0:
            tensor = tensor.clone()
        else:
            by_storage[ptr] = key
        out[key] = tensor
    return out
