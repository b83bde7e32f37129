"""The one ``PathManager`` through which treadle reads and writes files.

iopath lets users register handlers (``manifold://``, ``s3://``, ...) on this
object and have every checkpoint, metric and config file go through them.
"""

import errno

from iopath.common.file_io import PathManager as _PathManagerClass

__all__ = ["PathManager", "ensure_writable_dir", "describe_os_error"]

#: iopath's path manager: ``PathManager.open(path)`` reads and writes local and remote paths.
PathManager = _PathManagerClass()


def ensure_writable_dir(path: str) -> None:
    """Creates ``path`` if needed and checks that a file can be written in it.

    Raises:
        PermissionError: naming the directory and the reason, so that a job
            fails at start rather than at its first checkpoint.
    """
    import os

    try:
        PathManager.mkdirs(path)
        probe = os.path.join(path, f".treadle-write-test-{os.getpid()}")
        with PathManager.open(probe, "w") as f:
            f.write("")
        PathManager.rm(probe)
    except OSError as e:
        raise PermissionError(f"The output directory {path!r} cannot be written: {e.strerror or e}") from None


def describe_os_error(error: OSError) -> str:
    """One line: ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(error.errno) if error.errno is not None else None
    if error.strerror:
        return f"{error.strerror} ({name})" if name else error.strerror
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
