"""Writing one checkpoint file: atomically, with checksums, and a failure said in one line.

The ``"file"`` format of :class:`~treadle.checkpoint.Checkpointer`. A write
goes to a temporary file renamed into place (see
:func:`~treadle.utils.atomic.atomic_write`), so a crash leaves the previous
file. A failed write (a full disk, an unwritable directory) is one
:class:`~treadle.checkpoint.CheckpointError` line naming the file and the
OS error, e.g. ``No space left on device (ENOSPC)``.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Optional

from treadle.utils.atomic import atomic_write, is_local_path
from treadle.utils.file_io import describe_os_error

from .serialization import CheckpointError, first_line, save_with_checksums

__all__ = ["write_checkpoint_file", "make_dir", "describe_os_error"]

# What torch's zip writer says when a write fails (messages of torch 2.x's
# inline_container.cc): it raises RuntimeError, not OSError.
_TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed", "file write failed", "inline_container.cc", "iostream error")


def write_checkpoint_file(path: str, data: Dict[str, Any], path_manager: Any) -> None:
    """Writes ``data`` to ``path`` atomically with :func:`save_with_checksums`.

    Raises:
        CheckpointError: the write failed (also when torch's zip writer
            reports it as a RuntimeError); the temporary file is removed and
            the previous file, if any, is untouched.
    """
    try:
        atomic_write(path, lambda f: save_with_checksums(data, f), path_manager)
    except (OSError, RuntimeError) as e:
        if not isinstance(e, OSError) and not _is_torch_write_failure(e):
            raise  # a RuntimeError of torch.save that is not about writing (a device error)
        directory = os.path.dirname(path) or "."
        # torch's zip writer turns a failed write (a full disk) into a
        # RuntimeError whose context holds the OSError, when there is one.
        os_error = _os_error_in(e)
        reason = describe_os_error(os_error) if os_error else _torch_write_failure(e, directory, path_manager)
        raise CheckpointError(
            f"Cannot write checkpoint '{path}' in directory '{directory}': {reason}. "
            f"The previous checkpoints and last_checkpoint are untouched."
        ) from e


def make_dir(directory: str, path_manager: Any) -> None:
    """Creates ``directory`` (and its parents) if needed.

    Raises:
        CheckpointError: it cannot be created, naming it and the OS error.
    """
    try:
        path_manager.mkdirs(directory)
    except OSError as e:
        raise CheckpointError(f"Cannot create the checkpoint directory '{directory}': {describe_os_error(e)}.") from e


def _os_error_in(error: BaseException) -> Optional[OSError]:
    """``error`` if it is an OSError, else the first one in its cause/context chain."""
    seen = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _is_torch_write_failure(error: BaseException) -> bool:
    text = str(error)
    return any(marker in text for marker in _TORCH_WRITE_FAILURES)


def _torch_write_failure(error: BaseException, directory: str, path_manager: Any) -> str:
    """What a failed ``torch.save`` without an OS error to show says, and the free space left."""
    said = f"torch.save failed ({first_line(error)})"
    if is_local_path(directory, path_manager):
        try:
            free = shutil.disk_usage(path_manager.get_local_path(directory)).free
        except OSError:
            return said
        # A full disk is the usual cause; the free space says whether it is this one.
        said += f"; {free / 2**20:.1f} MiB free on its filesystem"
    return said
