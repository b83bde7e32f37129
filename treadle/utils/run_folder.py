"""One owner per run folder, and a used folder never silently overwritten.

A training job writes into its ``output_dir``: checkpoints, ``last_checkpoint``,
``metrics.json``, TensorBoard events, ``config.yaml``, ``log.txt``. Two rules
keep what is already there safe:

- **One owner.** A running job holds an OS file lock on
  ``{output_dir}/.treadle.lock`` (``flock``: the kernel releases it when the
  process dies, ``kill -9`` included). A second job on the same folder is
  refused at once, in one line naming the holder's PID and host. A lock file
  left by a dead process is taken over with a warning.
- **No silent overwrite.** A fresh start (not a resume) in a folder that holds
  another run's checkpoints or metrics is refused, unless the caller asks to
  move the earlier run aside, which renames the folder to
  ``{output_dir}.old-{YYYYmmdd-HHMMSS}`` (nothing is deleted).

:class:`RunFolder` implements both; ``DefaultTrainer`` and ``Trainer`` claim
their folder when training starts. ``tools/train_net.py`` also checks both
rules without writing (:meth:`RunFolder.check`) before it prints or builds
anything, so that a refused job says so first. See ``docs/checkpoints.md``.
"""

from __future__ import annotations

import datetime
import errno
import fnmatch
import json
import logging
import os
import socket
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import comm
from .atomic import is_local_path
from .file_io import PathManager

__all__ = [
    "RunFolder",
    "check_output_dir",
    "claim_on_main_process",
    "check_on_main_process",
    "RunFolderError",
    "RunFolderBusyError",
    "RunFolderUsedError",
    "LOCK_FILE",
    "RUN_FILE_PATTERNS",
]

logger = logging.getLogger(__name__)

#: The file that marks a run folder as claimed by a running job.
LOCK_FILE = ".treadle.lock"

#: Names (glob patterns) in an output directory that show a run has trained
#: there: what a fresh start would overwrite, truncate or mix with its own.
#: ``config.yaml`` and ``log.txt`` alone are not a run: a job that failed
#: before its first step leaves them, and nothing of value.
RUN_FILE_PATTERNS = (
    "last_checkpoint",
    "*.pth",
    "*.dcp",
    "*.safetensors",
    "metrics.json",
    "metrics.csv",
    "events.out.tfevents.*",
)

try:  # POSIX; elsewhere the folder is not locked (noted once)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked; the message is one line naming it."""


class RunFolderBusyError(RunFolderError):
    """Another live job holds the folder's lock."""


class RunFolderUsedError(RunFolderError):
    """A fresh start was asked for in a folder holding an earlier run."""


def _holder_text(info: Dict[str, object]) -> str:
    pid, host, started = info.get("pid"), info.get("host"), info.get("started")
    if pid is None:
        return "another process"
    text = f"PID {pid} on host {host or '?'}"
    return f"{text} (since {started})" if started else text


def _read_info(fd: int) -> Dict[str, object]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096).decode("utf-8", "replace").strip()
        info = json.loads(raw) if raw else {}
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


class RunFolder:
    """The output directory of one job: its lock and its earlier contents.

    ::

        folder = RunFolder("output/run1")
        folder.claim(resume=False, move_aside=False)   # lock, then refuse a used folder
        ...                                             # train
        folder.release()

    ``claim`` creates the directory if needed. Non-local paths (``s3://``...)
    cannot be locked or renamed: they are checked for earlier runs only, with
    a note that no lock is held.
    """

    #: How messages name the ways out, for the command line (the default).
    COMMAND_LINE = {"resume": "add --resume", "move_aside": "add --move-aside", "output_dir": "train.output_dir"}
    #: ... and for the plain ``Trainer``.
    TRAINER_API = {
        "resume": "call train(resume=True)",
        "move_aside": "call train(move_aside=True)",
        "output_dir": "output_dir",
    }

    def __init__(self, path: str, *, names: Optional[Dict[str, str]] = None, subdirs: Sequence[str] = ()) -> None:
        if not path:
            raise ValueError("RunFolder needs a path")
        self.path = path
        self._names = dict(self.COMMAND_LINE, **(names or {}))
        #: Folders inside it where the run also writes (Hezar's checkpoints/ and logs/).
        self.subdirs = [d for d in subdirs if d]
        self._fd: Optional[int] = None
        self.moved_to: Optional[str] = None

    # ------------------------------------------------------------------ lock
    @property
    def lock_path(self) -> str:
        return os.path.join(self.path, LOCK_FILE)

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the folder's lock, creating the folder if needed.

        Raises:
            RunFolderBusyError: another live process holds it.
            RunFolderError: the folder or its lock file cannot be created.
        """
        if self._fd is not None:
            return
        if fcntl is None or not is_local_path(self.path):
            logger.warning(
                "'%s' cannot be locked here (%s): nothing stops a second job from writing into it.",
                self.path,
                "no fcntl on this platform" if fcntl is None else "not a local path",
            )
            return
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise RunFolderError(f"Cannot create the output directory '{self.path}': {e.strerror or e}") from None
        while True:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise RunFolderError(f"Cannot create the lock file '{self.lock_path}': {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_info(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunFolderError(f"Cannot lock '{self.lock_path}': {e.strerror or e}") from None
                raise self._busy_error(holder) from None
            # The file may have been removed (a release) between our open and
            # our lock: then we hold a lock on a name nobody sees. Start over.
            if self._same_file(fd):
                break
            os.close(fd)
        previous = _read_info(fd)
        if previous:
            logger.warning(
                "Taking over the lock of '%s' left by %s, which is no longer running (it did not end cleanly).",
                self.path,
                _holder_text(previous),
            )
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
        except OSError as e:
            try:
                os.unlink(self.lock_path)  # empty or partial: no use to anyone
            except OSError:
                pass
            os.close(fd)
            raise RunFolderError(f"Cannot write the lock file '{self.lock_path}': {e.strerror or e}") from None
        self._fd = fd

    def _busy_error(self, holder: Dict[str, object]) -> RunFolderBusyError:
        return RunFolderBusyError(
            f"The output directory '{self.path}' is in use by another job: {_holder_text(holder)}. "
            f"Wait for it to end, or choose another {self._names['output_dir']}."
        )

    def _same_file(self, fd: int) -> bool:
        try:
            on_disk = os.stat(self.lock_path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)

    def release(self) -> None:
        """Removes the lock file and releases the lock; a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Removed while still locked, so a waiting job that opened the old
            # file notices (its inode is gone from the name) and starts over.
            os.unlink(self.lock_path)
        except OSError:
            pass
        os.close(fd)

    def __enter__(self) -> "RunFolder":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ------------------------------------------------------------------ contents
    def earlier_run_files(self) -> List[str]:
        """Names in the folder (and its :attr:`subdirs`) that show a run trained
        there (see :data:`RUN_FILE_PATTERNS`), in the order of those patterns
        (checkpoints first), sorted within each."""
        found: List[str] = []
        for sub in ["", *self.subdirs]:
            directory = os.path.join(self.path, sub) if sub else self.path
            try:
                if not PathManager.isdir(directory):
                    continue
                names = PathManager.ls(directory)
            except OSError:
                continue
            found += [
                os.path.join(sub, n) if sub else n for n in names if any(fnmatch.fnmatch(n, p) for p in RUN_FILE_PATTERNS)
            ]

        def rank(name: str) -> Tuple[int, str]:
            base = os.path.basename(name)
            return next(i for i, p in enumerate(RUN_FILE_PATTERNS) if fnmatch.fnmatch(base, p)), name

        return sorted(found, key=rank)

    def claim(self, *, resume: bool, move_aside: bool = False) -> None:
        """Locks the folder for this job and checks that it may write there.

        A resume continues the run in the folder. A fresh start in a folder
        holding an earlier run is refused, or, with ``move_aside``, the earlier
        run's folder is renamed first (see :meth:`move_aside`).

        Raises:
            RunFolderBusyError: another job holds the folder.
            RunFolderUsedError: a fresh start in a used folder, without ``move_aside``.
            RunFolderError: the folder cannot be created, locked or moved.
        """
        # Refused before the lock is taken: a refused start changes nothing in
        # the folder, the lock a killed job left there included.
        if self._fd is None:
            self.check(resume=resume, move_aside=move_aside)
        self.acquire()
        try:
            if resume:
                return
            found = self.earlier_run_files()
            if not found:
                return
            if move_aside:
                self.move_aside()
                return
            raise self._used_error(found)
        except BaseException:
            self.release()
            raise

    def check(self, *, resume: bool, move_aside: bool = False) -> None:
        """What :meth:`claim` would refuse, found without writing anything:
        no folder, lock file or rename is made, and no lock is kept.

        A job calls it before it prints or builds anything, so that a folder
        it may not use is its first and only message; it claims the folder
        later, when training starts (another job may take it in between: the
        claim decides).

        Raises:
            RunFolderBusyError: another live job holds the folder.
            RunFolderUsedError: a fresh start in a used folder, without ``move_aside``.
        """
        holder = self._live_holder()
        if holder is not None:
            raise self._busy_error(holder)
        if resume or move_aside:
            return
        found = self.earlier_run_files()
        if found:
            raise self._used_error(found)

    def _live_holder(self) -> Optional[Dict[str, object]]:
        """The lock file's record when a live process holds its lock, else None."""
        if fcntl is None or not is_local_path(self.path):
            return None
        try:
            # Read-only: a probe must not create the lock file (nor the folder).
            fd = os.open(self.lock_path, os.O_RDONLY)
        except OSError:
            return None  # no lock file (or none we can open): nobody holds it
        try:
            try:
                # Shared, so that two probes never refuse each other.
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return _read_info(fd)
                return None  # a file system without locks: the claim says so
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def _used_error(self, found: Sequence[str]) -> RunFolderUsedError:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        return RunFolderUsedError(
            f"The output directory '{self.path}' holds an earlier run ({shown}); a fresh start would "
            f"overwrite it. {self._names['resume'][:1].upper()}{self._names['resume'][1:]} to continue it, choose another "
            f"{self._names['output_dir']}, or {self._names['move_aside']} to rename the earlier run's "
            "folder and start fresh."
        )

    def move_aside(self) -> str:
        """Renames the folder to ``{path}.old-{YYYYmmdd-HHMMSS}``, creates it
        anew and moves the lock into it; returns the new name of the old folder.

        Raises:
            RunFolderError: the rename failed (a mount point, no permission in
                the parent directory, a non-local path). Nothing was moved.
        """
        if not is_local_path(self.path):
            raise RunFolderError(
                f"Cannot move '{self.path}' aside: it is not a local path. Choose another {self._names['output_dir']}."
            )
        path = os.path.normpath(os.path.abspath(self.path))
        cwd = os.path.normpath(os.getcwd())
        if cwd == path or cwd.startswith(path + os.sep):
            # Relative paths of the job (its own output_dir) would follow the
            # renamed folder: the new run would write into the old one.
            raise RunFolderError(
                f"Cannot move '{self.path}' aside: it holds the current directory. Run the job from elsewhere, "
                f"or choose another {self._names['output_dir']}."
            )
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        target, n = f"{path}.old-{stamp}", 1
        while os.path.exists(target):
            n += 1
            target = f"{path}.old-{stamp}-{n}"
        old_fd, self._fd = self._fd, None
        try:
            os.rename(path, target)
        except OSError as e:
            self._fd = old_fd
            raise RunFolderError(
                f"Cannot move the earlier run in '{self.path}' aside to '{target}': {e.strerror or e}. "
                f"Move it yourself, or choose another {self._names['output_dir']}."
            ) from None
        try:
            self.acquire()  # a fresh folder, and its own lock
        finally:
            if old_fd is not None:
                # The old lock file went with the old folder: it is no part of that run.
                try:
                    os.unlink(os.path.join(target, LOCK_FILE))
                except OSError:
                    pass
                os.close(old_fd)
        self.moved_to = target
        logger.warning("Moved the earlier run in '%s' to '%s'; starting fresh.", self.path, target)
        return target


def check_output_dir(path: str, *, name: str = "") -> None:
    """Checks, without writing anything, that ``path`` can be a run's folder:
    it is a directory or can be created, and this process may write there.
    The job calls it before it writes anything, for its folder and for each
    folder inside it where it writes (``name``: the setting that names such a
    folder, ``checkpoints_dir``..., which the message then names as the culprit).

    Raises:
        PermissionError: naming the path and the reason (as writing there would).
    """
    if not path:
        raise PermissionError("The output directory is empty: set train.output_dir=PATH")
    if not is_local_path(path):
        return  # other backends say what they allow when written to
    who = f"{name} '{path}'" if name else f"The output directory '{path}'"
    instead = f"; give another {name}" if name else ""
    target = os.path.abspath(path)
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise PermissionError(f"{who} cannot be written: it is a file, not a directory{instead}")
        if not os.access(target, os.W_OK | os.X_OK):
            raise PermissionError(f"{who} cannot be written: {_why_not_writable(target)}{instead}")
        return
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise PermissionError(f"{who} cannot be written: '{parent}' is a file, not a directory{instead}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(
            f"{who} cannot be written: it cannot be created in '{parent}' ({_why_not_writable(parent)}){instead}"
        )


def _why_not_writable(directory: str) -> str:
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except (OSError, AttributeError):  # no statvfs on this platform
        pass
    return "permission denied"


def claim_on_main_process(folder: RunFolder, *, resume: bool, move_aside: bool = False) -> None:
    """:meth:`RunFolder.claim` on the main process; every rank raises its error.

    With several processes, every rank must call it at the same point (one
    broadcast): a refused claim stops every rank with the same one-line error.
    """
    _on_main_process(lambda: folder.claim(resume=resume, move_aside=move_aside))


def check_on_main_process(folder: RunFolder, *, resume: bool, move_aside: bool = False) -> None:
    """:meth:`RunFolder.check` on the main process; every rank raises its error
    (a rank called at the same point as the others, as for :func:`claim_on_main_process`)."""
    _on_main_process(lambda: folder.check(resume=resume, move_aside=move_aside))


def _on_main_process(action: Callable[[], None]) -> None:
    # One broadcast: the main process's verdict is every rank's, so that no
    # rank goes on alone (a folder on a disk the ranks do not share).
    error: Optional[BaseException] = None
    if comm.is_main_process():
        try:
            action()
        except RunFolderError as e:
            error = e
    error = comm.broadcast_object(error)
    if error is not None:
        raise error
