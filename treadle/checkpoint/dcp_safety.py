"""Reading torch.distributed.checkpoint (DCP) directories without running code from them.

DCP's own reader unpickles the ``.metadata`` file with ``pickle.load`` and
its non-tensor items with ``torch.load(weights_only=False)``: a crafted
checkpoint directory runs code when loaded. treadle's rule is that loading a
checkpoint never does, so DCP directories are read through
:class:`SafeFileSystemReader` (its metadata unpickled with an allow-list of
DCP's own metadata classes) and :class:`WeightsOnlyLoadPlanner` (items
loaded with ``weights_only=True``). Both raise
:class:`~treadle.checkpoint.UnsafeCheckpointError` naming what was refused.

This is the reading half of sharded checkpoints; see ``docs/checkpoints.md``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Dict

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from .serialization import UnsafeCheckpointError

__all__ = ["SafeFileSystemReader", "WeightsOnlyLoadPlanner", "load_dcp_metadata", "load_dcp"]

# The globals a DCP metadata file refers to (torch 2.6 to 2.14): DCP's
# metadata records, its storage index, and what describes a tensor. Paths
# are pickled under pathlib's module, which Python 3.13 calls pathlib._local.
_ALLOWED = {
    ("collections", "OrderedDict"),
    *((module, name) for module in ("pathlib", "pathlib._local")
      for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, source: str) -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"DCP metadata '{self._source}' refers to {module}.{name}, which is not part of a checkpoint's "
            "metadata; it was not loaded (unpickling it could run code)."
        )


def load_dcp_metadata(stream: Any, source: str) -> Metadata:
    """Unpickles a DCP ``.metadata`` stream, allowing only DCP's metadata classes.

    Raises:
        UnsafeCheckpointError: the stream refers to any other global.
    """
    metadata = _MetadataUnpickler(stream, source).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"DCP metadata '{source}' holds a {type(metadata).__name__}, not DCP Metadata.")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader, with the metadata read by :func:`load_dcp_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_dcp_metadata(stream, str(path))
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor items loaded with
    ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"DCP item '{read_item.dest_index.fqn}' needs unsafe unpickling; it was not loaded: "
                f"{str(e).splitlines()[0]}"
            ) from None
        # What DefaultLoadPlanner.load_bytes does with its (unsafe) load.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load_dcp(state_dict: Dict[str, Any], directory: str) -> None:
    """``dcp.load`` of ``directory`` into ``state_dict`` (in place), through the
    safe reader and planner; a refusal is raised as itself, not inside DCP's
    ``CheckpointException``.

    Raises:
        UnsafeCheckpointError: the metadata or an item would run code.
    """
    reader = SafeFileSystemReader(directory)
    # Read first, here: inside dcp.load a refusal would reach the caller as a
    # message inside an AssertionError inside a CheckpointException.
    reader.read_metadata()
    try:
        dcp.load(
            state_dict,
            storage_reader=reader,
            planner=WeightsOnlyLoadPlanner(),
            no_dist=not (torch.distributed.is_available() and torch.distributed.is_initialized()),
        )
    except CheckpointException as e:
        for failure in e.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure  # DCP's (exception, traceback)
            if isinstance(inner, UnsafeCheckpointError):
                raise inner from None
        raise
