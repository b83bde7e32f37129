"""Writing a file so that a crash at any instant leaves either the old or the new one.

The recipe, for local files: write a uniquely named temporary file in the
destination directory, flush and fsync it, ``os.replace`` it onto the final
name (atomic within one filesystem, which is why the temporary file sits in
the same directory), then fsync the directory so the rename itself survives a
power loss. Readers therefore never see a partly written file under the final
name.

Other iopath backends (``s3://``, ``manifold://``...) offer no rename; there
the file is written directly and atomicity is whatever the backend gives.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
from typing import Any, BinaryIO, Callable

from iopath.common.file_io import NativePathHandler

from treadle.utils.file_io import PathManager
from treadle.utils.logger import log_once

__all__ = ["atomic_write", "is_local_path", "temporary_name", "TEMP_MARKER"]

logger = logging.getLogger(__name__)

TEMP_MARKER = ".tmp."
"""Part of every temporary file name: ``.{final name}.tmp.{pid}.{random}``."""


def is_local_path(path: str, path_manager: Any = PathManager) -> bool:
    """True when ``path`` is served by iopath's native (local filesystem) handler."""
    # iopath keeps handler lookup private; without it, fall back on the URI shape.
    get_handler = getattr(path_manager, "_PathManager__get_path_handler", None)
    if get_handler is None:
        return "://" not in path or path.startswith("file://")
    return isinstance(get_handler(path), NativePathHandler)


def temporary_name(final_path: str) -> str:
    """A hidden, unique sibling of ``final_path``: ``dir/.{name}.tmp.{pid}.{random}``.

    Hidden so that listings of checkpoints skip it; the pid says which process
    left it behind after a crash; the random part keeps two writers of the same
    name in one process apart.
    """
    directory, name = os.path.split(final_path)
    return os.path.join(directory, f".{name}{TEMP_MARKER}{os.getpid()}.{secrets.token_hex(4)}")


def atomic_write(path: str, write: Callable[[BinaryIO], object], path_manager: Any = PathManager) -> None:
    """Calls ``write(f)`` on a binary file that appears at ``path`` only once complete.

    For a local ``path``: if ``write``, the flush, the fsync or the rename fails
    (or the process is interrupted), the temporary file is removed, whatever was
    at ``path`` before is untouched, and the error propagates. The parent
    directory must exist.

    For a non-local ``path``: a plain write through ``PathManager``, since
    iopath has no atomic rename for those backends (callers say so to the user).
    """
    if not is_local_path(path, path_manager):
        logger.debug("'%s' is not a local path: written in place, without a rename.", path)
        with path_manager.open(path, "wb") as f:
            write(f)
        return

    final = os.path.abspath(path_manager.get_local_path(path))
    tmp = temporary_name(final)
    try:
        # "x": never write into a file someone else has open under this name.
        with PathManager.open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:  # KeyboardInterrupt/SystemExit too: never leave the temporary file
        _remove_quietly(tmp)
        raise
    fsync_directory(os.path.dirname(final))


def fsync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable.

    Filesystems that cannot fsync a directory (some network filesystems) are
    noted once; the rename has happened, only its durability on power loss is
    weaker there.
    """
    if os.name == "nt":  # directories cannot be opened on Windows; NTFS journals renames
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
        log_once(
            logger,
            logging.INFO,
            "The filesystem of '%s' cannot fsync a directory (%s); renames there are not forced to disk.",
            directory,
            e.strerror,
        )
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        if PathManager.exists(path):
            PathManager.rm(path)
    except OSError:
        logger.warning("Could not remove the temporary file '%s' after a failed write.", path)
