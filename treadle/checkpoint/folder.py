"""The checkpoint folder: the ``last_checkpoint`` pointer, the checkpoints in it, and pruning.

A :class:`CheckpointFolder` knows the names in a ``save_dir`` and nothing of
what the files hold: which file the pointer names, which checkpoints a
resume tries and in what order, which periodic checkpoints a ``keep last N``
deletes, and which temporary files unfinished saves left behind.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any, Iterable, List, Optional, Pattern, Sequence, Tuple

from treadle.utils.atomic import TEMP_MARKER, atomic_write, is_local_path

from .file_writer import describe_os_error, make_dir
from .serialization import CheckpointError

__all__ = [
    "CheckpointFolder",
    "POINTER_FILE",
    "RESUME_PATTERN",
    "DCP_SUFFIX",
    "partial_name",
    "is_newer",
    "folder_given_for_a_file",
]

logger = logging.getLogger(__name__)

#: The file of the checkpoint folder naming its newest checkpoint
#: (detectron2's ``last_checkpoint``): where a resume starts.
POINTER_FILE = "last_checkpoint"
#: The name of a ``"dcp"`` checkpoint (a directory) ends so.
DCP_SUFFIX = ".dcp"
RESUME_PATTERN = re.compile(r"model_(?!best\.(?:pth|dcp)$).*\.(?:pth|dcp)")
"""Files a resume falls back to when the pointed-to file is unreadable. Not
``model_best.pth``: the best checkpoint is a point in the past (and may hold
averaged weights), not where the run stopped."""

_TRAILING_NUMBER = re.compile(r"(\d+)\.(?:pth|dcp)$")
# A file name is at most 255 bytes on common filesystems; a longer pointer is junk.
_MAX_POINTER_BYTES = 1024
# What atomic.temporary_name produces: .{final name}.tmp.{pid}.{8 hex digits}
_TEMP_FILE = re.compile(r"\..+" + re.escape(TEMP_MARKER) + r"(\d+)\.[0-9a-f]{8}")
# What an unfinished DCP save leaves: .{name}.dcp.partial, or .{name}.dcp.replaced
_TEMP_DIR = re.compile(r"\..+\.dcp\.(?:partial|replaced)")


def partial_name(name: str) -> str:
    """The directory name ``{name}.dcp`` is written under until it is complete."""
    return f".{name}{DCP_SUFFIX}.partial"


class CheckpointFolder:
    """The names in one ``save_dir``, read and changed through ``path_manager``.

    Cheap to build: a :class:`~treadle.checkpoint.Checkpointer` makes one
    per use from its current ``save_dir`` and ``path_manager`` (either may
    be reassigned, as in detectron2).
    """

    def __init__(self, save_dir: str, path_manager: Any) -> None:
        self.save_dir = save_dir
        self.path_manager = path_manager

    def path(self, filename: str) -> str:
        """``filename`` inside ``save_dir``."""
        return os.path.join(self.save_dir, filename)

    def names(self) -> List[str]:
        """Every name in ``save_dir``, sorted; ``[]`` without one."""
        if not self.save_dir or not self.path_manager.isdir(self.save_dir):
            return []
        return sorted(self.path_manager.ls(self.save_dir))

    def make(self) -> None:
        """Creates ``save_dir`` if needed (:class:`CheckpointError` when it cannot be)."""
        make_dir(self.save_dir, self.path_manager)

    # ------------------------------------------------------------------ pointer
    def read_pointer(self) -> Tuple[str, str]:
        """What ``last_checkpoint`` says, as ``(file name, problem)``.

        ``(name, "")`` when it holds a plain file name (which may still name a
        missing file); ``("", why)`` when it cannot serve as a pointer:
        unreadable, empty, binary, several lines, or a path rather than a name
        in ``save_dir``; ``("", "")`` when there is no pointer. The pointer is
        written atomically, so only outside damage makes it unusable.
        """
        if not self.save_dir:
            return "", ""
        try:
            with self.path_manager.open(self.path(POINTER_FILE), "rb") as f:
                raw = f.read(_MAX_POINTER_BYTES + 1)
        except FileNotFoundError:
            return "", ""
        except OSError as e:
            return "", f"it cannot be read ({e.strerror or e})"
        try:
            name = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            name = None
        if name == "":
            return "", "it is empty"
        separators = {"/", os.sep, os.altsep} - {None}
        if (
            name is None
            or len(raw) > _MAX_POINTER_BYTES
            or not name.isprintable()
            or any(sep in name for sep in separators)
            or name.startswith(".")
        ):
            return "", f"it holds {_preview(raw)}, not the name of a file in '{self.save_dir}'"
        return name, ""

    def pointer_target(self) -> str:
        """The file name in ``last_checkpoint``, or "" when there is none or it is unusable."""
        return self.read_pointer()[0]

    def write_pointer(self, filename: str) -> None:
        """Points ``last_checkpoint`` at ``filename``, atomically.

        Raises:
            CheckpointError: it cannot be written; it still names the previous checkpoint.
        """
        pointer = self.path(POINTER_FILE)
        self.make()
        try:
            atomic_write(pointer, lambda f: f.write(filename.encode("utf-8")), self.path_manager)
        except OSError as e:
            raise CheckpointError(
                f"Cannot update '{pointer}' in directory '{self.save_dir}': {describe_os_error(e)}. "
                f"It still names the previous checkpoint."
            ) from e

    # ------------------------------------------------------------------ listing
    def checkpoint_names(self) -> List[str]:
        """Every ``.pth`` file and ``.dcp`` directory, sorted (unfinished saves excluded)."""
        return [n for n in self.names() if n.endswith((".pth", DCP_SUFFIX)) and not n.startswith(".")]

    def resume_files(self, pattern: Pattern[str] = RESUME_PATTERN) -> List[str]:
        """Names matching ``pattern`` (``model_*.pth`` and ``model_*.dcp``), newest first.

        Numbered files in the order of their numbers; a file without one
        (``model_final``) goes before the numbered files it was written after
        (by modification time), so that a finished run falls back to its
        final checkpoint rather than to its last periodic one.
        """
        names = [n for n in self.names() if pattern.fullmatch(n)]
        numbered: List[Tuple[int, str]] = []
        unnumbered: List[Tuple[float, str]] = []
        for n in names:
            m = _TRAILING_NUMBER.search(n)
            if m:
                numbered.append((int(m.group(1)), n))
            else:
                unnumbered.append((self._mtime(self.path(n)), n))
        numbered.sort(reverse=True)
        unnumbered.sort(reverse=True)
        order = [n for _, n in numbered]
        times = {n: self._mtime(self.path(n)) for n in order}
        for mtime, n in reversed(unnumbered):  # oldest first: each newer one lands before it
            index = len(order)  # no modification time (a remote store): after the numbered files
            if mtime:
                index = next((i for i, other in enumerate(order) if other in times and times[other] <= mtime), index)
            order.insert(index, n)
        return order

    def numbered_files(self, prefix: str = "model_", *, up_to: Optional[int] = None) -> List[str]:
        """Names ``{prefix}{number}.pth`` (or ``.dcp``), numbers up to ``up_to``
        when given, in the order of their numbers."""
        pattern = _numbered(prefix)
        found = sorted(
            (int(m.group(1)), n)
            for n in self.names()
            if (m := pattern.fullmatch(n)) is not None and (up_to is None or int(m.group(1)) <= up_to)
        )
        return [n for _, n in found]

    def _mtime(self, path: str) -> float:
        if not is_local_path(path, self.path_manager):
            return 0.0  # iopath has no portable mtime; the number in the name decides
        try:
            return os.path.getmtime(self.path_manager.get_local_path(path))
        except OSError:
            return 0.0

    # ------------------------------------------------------------------ pruning
    def prune(
        self,
        prefix: str,
        *,
        keep_last: int,
        protect: Sequence[str],
        only: Optional[Sequence[str]] = None,
        writing: Optional[str] = None,
    ) -> List[str]:
        """Deletes all but the newest ``keep_last`` (>= 1) checkpoints
        ``{prefix}{number}.pth`` (or ``.dcp``), and the temporary files of
        other processes' unfinished saves. See
        :meth:`~treadle.checkpoint.Checkpointer.prune` for ``protect`` and
        ``only``; ``writing`` is the path of a save of this process still in
        flight, whose unfinished directory is kept. Returns the paths deleted.
        """
        pattern = _numbered(prefix)
        kept = {self.pointer_target()} | {p + suffix for p in protect for suffix in ("", ".pth", DCP_SUFFIX)}
        names = self.names()
        eligible = set(only) if only is not None else None
        numbered = sorted(
            (int(m.group(1)), n)
            for n in names
            if (m := pattern.fullmatch(n)) is not None and (eligible is None or n in eligible)
        )
        doomed = [n for _, n in numbered[:-keep_last] if n not in kept]
        doomed += _stale_temporary_files(names)
        own_partial = partial_name(os.path.basename(writing)[: -len(DCP_SUFFIX)]) if writing else None
        deleted = []
        for n in doomed:
            path = self.path(n)
            if n == own_partial:
                continue  # this process's own save in flight
            if n.endswith((DCP_SUFFIX, ".partial", ".replaced")) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                self.path_manager.rm(path)
            deleted.append(path)
        if deleted:
            logger.info("Removed old checkpoint files: %s", ", ".join(os.path.basename(p) for p in deleted))
        return deleted


def is_newer(a: str, b: str, order: Sequence[str]) -> bool:
    """Whether checkpoint ``a`` is newer than ``b``: by the iteration numbers in
    their names when both have one, else by resume order (the pointer's file,
    then newest first)."""
    na, nb = _TRAILING_NUMBER.search(a), _TRAILING_NUMBER.search(b)
    if na and nb:
        return int(na.group(1)) > int(nb.group(1))
    return order.index(a) < order.index(b)


def folder_given_for_a_file(path: str, path_manager: Any) -> str:
    """Why the folder ``path`` (neither DCP nor safetensors), given where a
    checkpoint file is read, does not load, and the file to give instead: a
    run folder's last checkpoint where its ``last_checkpoint`` names one."""
    last = CheckpointFolder(path, path_manager).pointer_target()
    if last:
        return (
            f"'{path}' is a run folder, not a checkpoint file: give the checkpoint file inside it "
            f"('{os.path.join(path, last)}' is its last), or resume the run from its folder (resume=True with it "
            "as the output folder)"
        )
    return (
        f"'{path}' is a folder, not a checkpoint file (nor a torch.distributed.checkpoint directory with a .metadata, "
        "nor a Hugging Face model folder with model.safetensors): give a checkpoint file (.pth)"
    )


def _numbered(prefix: str) -> Pattern[str]:
    return re.compile(re.escape(prefix) + r"(\d+)\.(?:pth|dcp)")


def _stale_temporary_files(names: Iterable[str]) -> List[str]:
    """Temporary files (``.{name}.tmp.{pid}.{random}``) not written by this
    process, and the directories of unfinished DCP saves (``.{name}.dcp.partial``).

    Only the main process of one run writes into ``save_dir``, so another
    pid's temporary file is what a killed run left behind.
    """
    out = []
    for n in names:
        m = _TEMP_FILE.fullmatch(n)
        if (m is not None and int(m.group(1)) != os.getpid()) or _TEMP_DIR.fullmatch(n):
            out.append(n)
    return out


def _preview(raw: bytes, limit: int = 40) -> str:
    """A short, one-line rendering of a pointer's content for a message: the
    text without surrounding whitespace, or the bytes when it is not text."""
    try:
        content: Any = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        content = raw
    return repr(content[:limit]) + ("..." if len(content) > limit else "")
