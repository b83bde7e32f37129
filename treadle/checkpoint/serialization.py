"""What a checkpoint may hold, and reading one without running code from it.

Checkpoints are loaded with ``torch.load(weights_only=True)``: the unpickler
then only builds tensors, numbers, strings, containers and a few allowlisted
torch types, so a file cannot run code when it is read. Two consequences live
here:

- before a checkpoint is written, :func:`check_weights_only_loadable` walks
  the state and rejects anything that would not load back that way, naming its
  key path (saving a file that can never be resumed from is worse than failing
  at once);
- :func:`load_checkpoint_file` turns torch's loading failures into one error
  naming the file: :class:`UnsafeCheckpointError` when the file needs
  arbitrary unpickling, :class:`CheckpointError` when it is missing, truncated
  or corrupt.

And one on integrity. ``torch.save`` writes a zip archive whose records (the
pickle ``data.pkl`` and one record per tensor storage) each carry a CRC-32 of
their bytes, computed while writing; ``torch.load`` never checks them, so a
flipped bit loads silently. :func:`save_with_checksums` writes them whatever
``torch.serialization.set_crc32_options`` says, and :func:`load_checkpoint_file`
checks every record against its CRC-32 before unpickling anything: a mismatch
is a :class:`CheckpointError`, like a truncated file, so resuming falls back to
the previous checkpoint. Files that carry no checksums (torch's legacy non-zip
format, or a zip saved elsewhere with CRC-32 turned off: every CRC field 0)
still load, unverified, with a note in the log: weights from other tools must
keep working.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import pickle
import re
import struct
import warnings
import zipfile
import zlib
from typing import Any, BinaryIO, Dict, FrozenSet, Iterator, List, Tuple

import torch

from treadle.utils.file_io import PathManager
from treadle.utils.logger import strip_ansi
from treadle.utils.torch_internals import weights_only_globals

__all__ = [
    "CheckpointError",
    "ResumeRefusedError",
    "UnsafeCheckpointError",
    "check_checkpoint_file",
    "check_weights_only_loadable",
    "load_checkpoint_file",
    "save_with_checksums",
    "first_line",
]

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used: missing, unreadable, truncated or
    corrupt, or its directory cannot be written. The message names the file
    (or directory)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file needs arbitrary unpickling (it references functions or
    classes that ``torch.load(weights_only=True)`` does not allow), so it was
    refused: loading it could run code from the file."""


class ResumeRefusedError(CheckpointError):
    """A readable checkpoint that this run cannot continue as it is set up
    (another number of processes, where each rank saved state of its own);
    the message says what to do. Said as itself by a resume, never taken for
    a damaged file or another model."""


# Exact types, not isinstance: a subclass (an IntEnum, a defaultdict, a
# namedtuple) is pickled as a reference to its class, which weights_only refuses.
_SCALAR_TYPES: FrozenSet[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, bytearray}
)
_TORCH_VALUE_TYPES: FrozenSet[type] = frozenset({torch.dtype, torch.device, torch.layout, torch.qscheme})
_MAPPING_TYPES: FrozenSet[type] = frozenset({dict, collections.OrderedDict, collections.Counter})
_SEQUENCE_TYPES: FrozenSet[type] = frozenset({list, tuple, set, torch.Size})


def _allowed_tensor_types() -> FrozenSet[type]:
    """Tensor classes torch's weights-only unpickler rebuilds by default."""
    try:
        found = {v for v in weights_only_globals() if isinstance(v, type) and issubclass(v, torch.Tensor)}
    except (ImportError, AttributeError):  # private API: keep the public minimum if it moves
        found = set()
    return frozenset(found | {torch.Tensor, torch.nn.Parameter})


def _user_safe_types() -> FrozenSet[type]:
    """Classes the user allowlisted with ``torch.serialization.add_safe_globals``."""
    out = set()
    for entry in torch.serialization.get_safe_globals():
        obj = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(obj, type):
            out.add(obj)
    return frozenset(out)


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return f"{path}.{key}" if path else str(key)
    return f"{path}[{key!r}]"


def _describe(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _hint(obj: Any) -> str:
    module = type(obj).__module__ or ""
    if module.split(".")[0] == "numpy":
        return "Convert numpy values with .item() (scalars) or torch.from_numpy (arrays)."
    if callable(obj) and not isinstance(obj, torch.Tensor):
        return "Store data, not functions or objects: state_dict() must return plain values."
    return (
        "state_dict() must return tensors, numbers, strings, bools, None and lists/tuples/dicts of them; "
        "if you trust the type, allowlist it with torch.serialization.add_safe_globals."
    )


def _iter_children(obj: Any, path: str) -> Iterator[Tuple[str, Any]]:
    t = type(obj)
    if t in _MAPPING_TYPES:
        for k, v in obj.items():
            yield _child_path(path, k) + " (a key)", k
            yield _child_path(path, k), v
        # OrderedDict/Counter pickle their attributes too (a state dict's _metadata).
        for k, v in getattr(obj, "__dict__", {}).items():
            yield f"{path}.__dict__.{k}", v
    elif t in _SEQUENCE_TYPES:
        for i, v in enumerate(obj):
            yield f"{path}[{i}]", v
    elif isinstance(obj, torch.Tensor):
        # Python attributes set on a tensor are pickled with it.
        for k, v in getattr(obj, "__dict__", {}).items():
            yield f"{path}.__dict__.{k}", v


def check_weights_only_loadable(state: Any, *, what: str = "checkpoint") -> None:
    """Raises ``TypeError`` if ``state`` would not load with ``torch.load(weights_only=True)``.

    Accepted: tensors (and ``nn.Parameter``), ``None``/bool/int/float/complex/
    str/bytes, ``torch.dtype``/``device``/``layout``/``Size``, and dicts,
    ``OrderedDict``\\ s, lists, tuples and sets of these, plus instances of classes
    allowlisted with ``torch.serialization.add_safe_globals`` (trusted as they
    are). The first rejected value is named by its key path, e.g.
    ``trainer.hooks.EMA.fn``; ``what`` names the file in the message.
    """
    tensor_types = _allowed_tensor_types()
    user_types = _user_safe_types()
    # Iterative, with a memo: deep or self-referencing states must neither
    # overflow the stack nor loop (pickle memoizes shared objects too).
    seen: set = set()
    stack: List[Tuple[str, Any]] = [("", state)]
    while stack:
        path, obj = stack.pop()
        t = type(obj)
        if t in _SCALAR_TYPES or t in _TORCH_VALUE_TYPES:
            continue
        if t in user_types:
            continue
        if isinstance(obj, torch.Tensor):
            if t not in tensor_types:
                raise TypeError(_reject_message(what, path, obj))
            if obj.requires_grad and not obj.is_leaf:
                raise TypeError(
                    f"Cannot save {what}: the tensor at '{path or '<top level>'}' is part of an autograd "
                    f"graph (requires grad and is not a leaf), which torch.save refuses. "
                    f"Nothing was written. Save .detach() of it."
                )
        elif t not in _MAPPING_TYPES and t not in _SEQUENCE_TYPES:
            raise TypeError(_reject_message(what, path, obj))
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        children = list(_iter_children(obj, path))
        stack.extend(reversed(children))  # reversed: report the first bad value in iteration order


def _reject_message(what: str, path: str, obj: Any) -> str:
    shown = path or "<top level>"
    return (
        f"Cannot save {what}: the value at '{shown}' is a {_describe(obj)}, which "
        f"torch.load(weights_only=True) cannot load, so the checkpoint could not be resumed from. "
        f"Nothing was written. {_hint(obj)}"
    )


_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")


def _unsafe_globals(path: str, error: BaseException, path_manager: Any = PathManager) -> List[str]:
    """The disallowed globals a refused file references, found without running it."""
    names = _UNSAFE_GLOBAL.findall(strip_ansi(str(error)))
    try:
        # Static disassembly of the pickle: lists every offending global, not
        # only the first one the unpickler met. Zip-format files only.
        with path_manager.open(path, "rb") as f:
            names += torch.serialization.get_unsafe_globals_in_checkpoint(f)
    except Exception:  # legacy or damaged file: keep what the error message said
        pass
    return sorted(set(names))


def _weights_only_detail(error: BaseException) -> str:
    text = strip_ansi(str(error))
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    return " ".join(text.strip().split("\n\n")[0].split()) or type(error).__name__


def save_with_checksums(obj: Any, f: BinaryIO) -> None:
    """``torch.save(obj, f)`` with a CRC-32 on every record of the archive.

    torch computes the checksums while it writes (no extra pass over the
    data) unless ``torch.serialization.set_crc32_options(False)`` turned them
    off for the process; then they are turned on for this call and the
    user's setting is restored afterwards, also when saving fails. The option
    is process-wide: a ``torch.save`` in another thread during this call
    writes checksums too.
    """
    get_option = getattr(torch.serialization, "get_crc32_options", None)
    if get_option is None or get_option():  # torch versions without the option always write them
        torch.save(obj, f)
        return
    torch.serialization.set_crc32_options(True)
    try:
        torch.save(obj, f)
    finally:
        torch.serialization.set_crc32_options(False)


# A zip local file header: signature, 22 bytes of versions, flags, method,
# times, CRC and sizes (the central directory's copies are the ones used),
# then the lengths of the name and of the extra field that precede the data.
_LOCAL_HEADER = struct.Struct("<4s22xHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"
# Read and checksummed 1 MiB at a time: the chunk is still in the CPU cache
# when zlib.crc32 reads it, and calls are few enough that their overhead vanishes.
_CHUNK = 1 << 20


def _verify_checksums(f: BinaryIO, path: str) -> bool:
    """Checks every record of the archive in ``f`` against the CRC-32 its central directory holds.

    Returns ``True`` when every record matched, ``False`` when there is
    nothing to check: ``f`` is not a zip archive (torch's legacy format, or
    a file too damaged to have a central directory, which ``torch.load`` then
    rejects), or every non-empty record has a CRC-32 of 0, which is what
    ``torch.save`` writes with CRC-32 turned off.

    Raises:
        CheckpointError: a record's bytes do not match its checksum, or lie
            outside the file.
        zipfile.BadZipFile: the central directory is damaged.
    """
    if not zipfile.is_zipfile(f):
        return False
    file_size = f.seek(0, io.SEEK_END)
    f.seek(0)
    with zipfile.ZipFile(f) as archive:  # given a file object, ZipFile leaves it open
        records = archive.infolist()
        if not any(r.CRC for r in records if r.file_size):
            return False
        for record in records:
            if record.compress_type == zipfile.ZIP_STORED:  # torch stores every record
                matches = _stored_crc32(f, record, file_size, path) == record.CRC
            else:
                matches = _inflates_cleanly(archive, record)
            if not matches:
                raise CheckpointError(
                    f"Checkpoint file '{path}' is corrupt: the checksum (CRC-32) of its record "
                    f"'{record.filename}' does not match its content; a bit changed on disk or in a copy "
                    f"after it was written."
                )
    return True


def _stored_crc32(f: BinaryIO, record: zipfile.ZipInfo, file_size: int, path: str) -> int:
    """The CRC-32 of an uncompressed record's bytes, read in chunks into one buffer."""
    f.seek(record.header_offset)
    header = f.read(_LOCAL_HEADER.size)
    signature, name_length, extra_length = (
        _LOCAL_HEADER.unpack(header) if len(header) == _LOCAL_HEADER.size else (b"", 0, 0)
    )
    start = record.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if signature != _LOCAL_SIGNATURE or start + record.compress_size > file_size:
        raise CheckpointError(
            f"Checkpoint file '{path}' is corrupt: its record '{record.filename}' is not where the "
            f"archive's directory says it is."
        )
    f.seek(start)
    view = memoryview(bytearray(min(record.compress_size, _CHUNK)))
    crc, left = 0, record.compress_size
    while left > 0:
        n = _read_into(f, view[: min(left, _CHUNK)])
        if n == 0:  # the file shrank since its size was read
            raise CheckpointError(
                f"Checkpoint file '{path}' is truncated: its record '{record.filename}' ends past the end of the file."
            )
        crc = zlib.crc32(view[:n], crc)
        left -= n
    return crc


def _read_into(f: BinaryIO, view: memoryview) -> int:
    readinto = getattr(f, "readinto", None)
    if readinto is not None:
        return readinto(view) or 0
    chunk = f.read(len(view))  # file objects of some iopath handlers have no readinto
    view[: len(chunk)] = chunk
    return len(chunk)


def _inflates_cleanly(archive: zipfile.ZipFile, record: zipfile.ZipInfo) -> bool:
    """Whether a compressed record (not torch's doing: a re-zipped file) matches its CRC-32.

    zipfile checks the CRC-32 itself once the record is read to its end.
    """
    try:
        with archive.open(record) as data:
            while data.read(_CHUNK):
                pass
    except (zipfile.BadZipFile, zlib.error, EOFError):
        return False
    return True


#: torch's warning, before its weights-only unpickler reads a pickle protocol torch.save does not write.
_PICKLE_PROTOCOL_WARNING = r"Detected pickle protocol \d+ in the checkpoint"


def load_checkpoint_file(path: str, path_manager: Any = PathManager) -> Dict[str, Any]:
    """Reads a checkpoint with ``torch.load(map_location="cpu", weights_only=True)``.

    First checks every record of the file against its CRC-32 (see the module
    docstring), through the same open file that is then loaded. A file that
    carries no checksums (legacy format, or saved with CRC-32 turned off) is
    loaded without this check, which is logged.

    Returns the dict stored in the file.

    Raises:
        UnsafeCheckpointError: the file references code (functions, classes)
            that weights-only loading does not allow. Nothing from it ran.
        CheckpointError: the file does not exist, cannot be read, is truncated
            or corrupt (a checksum mismatch included), or does not hold a dict.
    """
    try:
        with path_manager.open(path, "rb") as f:
            verified = _verify_checksums(f, path)
            f.seek(0)
            with warnings.catch_warnings():
                # Said of a file pickle.dump wrote (not torch.save), which the weights-only
                # unpickler then refuses: the refusal below names the file, in its one line.
                warnings.filterwarnings("ignore", message=_PICKLE_PROTOCOL_WARNING, category=UserWarning)
                obj = torch.load(f, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except pickle.UnpicklingError as e:
        unsafe = _unsafe_globals(path, e, path_manager)
        if unsafe:
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint '{path}': it needs unsafe unpickling of "
                f"{', '.join(unsafe)}, and loading it would run code from the file. It was not loaded "
                f"and nothing from it ran. If you trust the file, allowlist these with "
                f"torch.serialization.add_safe_globals, or convert it to plain tensors and data once."
            ) from e
        raise CheckpointError(
            f"Cannot load checkpoint '{path}': it is corrupt or not a plain-data torch checkpoint "
            f"(weights-only unpickling stopped at: {_weights_only_detail(e)}). It was not loaded, "
            f"because reading it with full unpickling could run code from the file."
        ) from e
    except FileNotFoundError as e:
        raise CheckpointError(f"Checkpoint file '{path}' does not exist.") from e
    except PermissionError as e:
        raise CheckpointError(f"Checkpoint file '{path}' cannot be read: permission denied.") from e
    except Exception as e:  # zip, EOF and OS errors from a partly written or damaged file
        raise CheckpointError(
            f"Checkpoint file '{path}' is truncated or corrupt: {type(e).__name__}: {first_line(e)}"
        ) from e
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"Checkpoint file '{path}' holds a {type(obj).__name__}, not the dict a checkpoint is."
        )
    if not verified:
        logger.info(
            "Checkpoint file '%s' carries no checksums (torch's legacy format, or saved with CRC-32 turned off): "
            "it was loaded without checking its content.",
            path,
        )
    return obj


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (messages of checkpoint errors are one line)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def check_checkpoint_file(path: str, path_manager: Any = PathManager) -> None:
    """Raises :class:`CheckpointError` when ``path`` is not a readable file,
    without reading it: a job checks its initial weights before it writes
    anything, and loads them later."""
    try:
        exists = path_manager.isfile(path)
        is_dir = not exists and path_manager.isdir(path)
    except OSError as e:
        raise CheckpointError(f"Checkpoint file '{path}' cannot be reached: {e}") from None
    if is_dir:
        if path_manager.exists(os.path.join(path, ".metadata")):
            return  # a torch.distributed.checkpoint directory (the "dcp" format)
        if any(path_manager.exists(os.path.join(path, n)) for n in ("model.safetensors", "model.safetensors.index.json")):
            return  # a Hugging Face model folder
        raise CheckpointError(
            f"Checkpoint file '{path}' is a directory, not a checkpoint file "
            "(nor a torch.distributed.checkpoint directory with a .metadata, nor a Hugging Face model folder "
            "with model.safetensors or its index)."
        )
    if not exists:
        raise CheckpointError(f"Checkpoint file '{path}' does not exist.")
