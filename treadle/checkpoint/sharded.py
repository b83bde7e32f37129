"""Sharded checkpoints: a ``torch.distributed.checkpoint`` (DCP) directory per checkpoint.

The ``"dcp"`` format of :class:`~treadle.checkpoint.Checkpointer`. A checkpoint
``{name}.dcp`` is a directory that every rank writes its own shards into
(``__{rank}_0.distcp``), plus DCP's ``.metadata`` and treadle's
``checksums.json``. What goes where:

- ``model``: the model's state from DCP's ``get_model_state_dict``: under
  FSDP2 each rank writes (and later reads) only its own shards, so no rank
  ever holds the full model; DCP reshards them to any other world size or
  wrapping (FSDP, DDP, one process) when loading;
- each optimizer: DCP's ``get_optimizer_state_dict`` (keyed by parameter
  names, sharded like the parameters);
- ``treadle``: everything else (the trainer's state with every rank's RNG
  state and the data position, schedulers, hook states, ``iteration``), one
  small weights-only ``torch.save`` record written by the main process.

Publishing: the ranks write into ``.{name}.dcp.partial``; once DCP has
written ``.metadata`` (which it does after every rank finished), the main
process records a CRC-32 of every file in ``checksums.json`` and renames the
directory to ``{name}.dcp``. A directory with that name is therefore
complete; a ``kill -9`` at any point leaves a ``.partial`` directory that the
next save or prune removes.

Loading reads the metadata and items without unpickling code (see
:mod:`treadle.checkpoint.dcp_safety`) after checking the checksums.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import warnings
import zlib
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from treadle.utils import comm
from treadle.utils.torch_internals import stager_copy_rules

from .file_writer import describe_os_error
from .folder import DCP_SUFFIX, partial_name
from .key_matching import LoadReport, ShapeMismatch, unwrap_model
from .serialization import CheckpointError, UnsafeCheckpointError, check_weights_only_loadable, first_line


def _reader(directory: str) -> Any:
    """A weights-only DCP reader of ``directory``.

    ``torch.distributed.checkpoint`` is imported here, when a .dcp checkpoint
    is read, not with treadle: importing it costs ~0.5 s and ~60 MB of
    resident memory that a run without .dcp checkpoints never needs.
    """
    from .dcp_safety import SafeFileSystemReader

    return SafeFileSystemReader(directory)


def _weights_only_planner(**kwargs: Any) -> Any:
    from .dcp_safety import WeightsOnlyLoadPlanner

    return WeightsOnlyLoadPlanner(**kwargs)

__all__ = [
    "DCP_SUFFIX",
    "CHECKSUM_FILE",
    "STATE_KEY",
    "is_dcp_checkpoint",
    "partial_name",
    "sharded_state",
    "publish",
    "publish_checkpoint",
    "AsyncSaver",
    "finish_async_save",
    "verify_checksums",
    "load_sharded",
    "read_dcp",
    "dcp_to_file_state",
    "write_dcp",
]

#: The file of a ``"dcp"`` checkpoint's directory that records each file's
#: checksum and size, written when the checkpoint is published: a directory
#: without it is not a complete checkpoint.
CHECKSUM_FILE = "checksums.json"
#: The key of the record holding everything that is neither model nor optimizer.
STATE_KEY = "treadle"
_CHUNK = 8 << 20
_SINGLE_PROCESS_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"
# DCP warns at every save and load without a process group that it "assumes
# the intent is" a single process: that is treadle's intent there. A
# background save warns from its own thread, so the filter is process-wide
# (and matches this message only).
warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING, category=UserWarning)


def is_dcp_checkpoint(path: str) -> bool:
    """Whether ``path`` is a DCP checkpoint directory (it has DCP's ``.metadata``)."""
    return os.path.isdir(path) and os.path.exists(os.path.join(path, ".metadata"))


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    # The process-wide filter above, again: a test runner or a user's
    # warnings.simplefilter may have put others before it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING, category=UserWarning)
        yield


# ---------------------------------------------------------------------- saving
def sharded_state(
    model: nn.Module, checkpointables: Mapping[str, Any], extra: Mapping[str, Any], *, what: str
) -> Dict[str, Any]:
    """The state dict DCP saves: this rank's model and optimizer shards, and
    (on the main process) the rest as one weights-only record.

    A collective under FSDP and with several processes (the trainer's state
    gathers RNG states): call it on every rank.

    Raises:
        TypeError: a value of the rest would not load with ``weights_only=True``.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    target = unwrap_model(model)
    state: Dict[str, Any] = {"model": get_model_state_dict(target)}
    rest: Dict[str, Any] = {}
    for name, obj in checkpointables.items():
        if isinstance(obj, torch.optim.Optimizer):
            state[name] = get_optimizer_state_dict(target, obj)
        else:
            rest[name] = obj.state_dict()
    rest.update(extra)
    if comm.is_main_process():
        check_weights_only_loadable(rest, what=what)
        # Only the main process has this key: DCP then writes it from there
        # (its RNG list holds every rank's state), and every rank reads it.
        state[STATE_KEY] = _record(rest)
    return state


def new_stager() -> Any:
    """A DCP stager for asynchronous saves, meant to be kept from one save to
    the next: it reuses its host copies of the state (see :func:`stager_reusable`)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(StagingOptions(False, False, False, False))


def stager_reusable(stager: Any) -> bool:
    """Whether ``stager`` can stage another save. Some torch releases (2.11
    among them) close a ``DefaultStager``'s copier after every save, where
    later ones keep it open until ``close()``: a closed one fails the next
    save deep in DCP with ``KeyError: <class 'type'>``, so it is replaced.
    A stager whose inside is not the one known here is taken as reusable."""
    rules = stager_copy_rules(stager)
    return rules is None or bool(rules)


def _record(obj: Any) -> bytes:
    """``obj`` as the bytes of a ``torch.save`` file: one DCP item of plain
    bytes (DCP would flatten a dict into items, and write its tensors from
    whichever rank it picks)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unrecord(record: Any, directory: str) -> Dict[str, Any]:
    if record is None:
        return {}
    if isinstance(record, (bytes, bytearray)):
        try:
            record = torch.load(io.BytesIO(record), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"The '{STATE_KEY}' record of checkpoint '{directory}' needs unsafe unpickling; it was not loaded: "
                f"{first_line(e)}"
            ) from None
    if not isinstance(record, dict):
        raise CheckpointError(f"The '{STATE_KEY}' record of checkpoint '{directory}' is a {type(record).__name__}, not a dict.")
    return record


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)


def publish(partial: str, final: str) -> None:
    """Main process, after DCP finished writing ``partial``: records the
    checksums of its files and renames it to ``final`` (replacing an older
    ``final``, e.g. a second ``model_final``)."""
    sums = {
        name: {"crc32": file_crc32(os.path.join(partial, name)), "bytes": os.path.getsize(os.path.join(partial, name))}
        for name in sorted(os.listdir(partial))
        if name != CHECKSUM_FILE
    }
    checksum_path = os.path.join(partial, CHECKSUM_FILE)
    with open(checksum_path, "w") as f:
        json.dump({"format": "treadle-dcp-1", "files": sums}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(partial)
    replaced = None
    if os.path.exists(final):
        replaced = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(partial, final)
    _fsync_dir(os.path.dirname(final) or ".")
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def publish_checkpoint(partial: str, final: str) -> None:
    """:func:`publish`, a failure of which is one :class:`CheckpointError` line."""
    try:
        publish(partial, final)
    except OSError as e:
        raise CheckpointError(
            f"Cannot publish checkpoint '{final}': {describe_os_error(e)}. "
            f"The previous checkpoints and last_checkpoint are untouched."
        ) from e


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def write_dcp(
    state: Dict[str, Any],
    partial: str,
    *,
    final: Optional[str] = None,
    process_group: Any = None,
) -> None:
    """``dcp.save`` of ``state`` into ``partial`` (every rank), the directory
    that becomes ``final``. DCP's failures come back as one
    :class:`CheckpointError` line naming the first one."""
    import torch.distributed.checkpoint as dcp

    try:
        with _quiet_single_process():
            dcp.save(
                state,
                storage_writer=dcp.FileSystemWriter(partial, single_file_per_rank=True, sync_files=True),
                process_group=process_group,
                no_dist=not _distributed(),
            )
    except dcp.api.CheckpointException as e:
        raise write_failure(e, final or partial) from None


class AsyncSaver:
    """Starts DCP's asynchronous saves (``dcp.async_save``), one at a time.

    Keeps, from one save to the next, DCP's stager (it reuses its host
    copies of the state) and the process group the background writes talk
    through: not the training's, since a collective of a background thread
    must not interleave with the gradient all-reduces of the main thread.
    """

    def __init__(self) -> None:
        self._stager: Any = None
        self._group: Any = None

    def start(self, state: Dict[str, Any], partial: str) -> "Future[Any]":
        """Stages ``state`` (returns once it is copied) and writes it into
        ``partial`` in the background; every rank calls it. Wait with
        :func:`finish_async_save`."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if self._stager is None or not stager_reusable(self._stager):
            self._stager = new_stager()
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and self._group is None:
            self._group = dist.new_group(backend="gloo")  # every rank is here, in the same order
        with _quiet_single_process():
            return dcp.async_save(  # type: ignore[return-value]  # typed Future or AsyncSaveResponse: a Future here
                state,
                storage_writer=dcp.FileSystemWriter(partial, single_file_per_rank=True, sync_files=True),
                process_group=self._group,
                async_stager=self._stager,
                no_dist=not distributed,
            )


def finish_async_save(future: "Future[Any]", final: str) -> None:
    """Waits for an asynchronous save of ``final`` started by
    :meth:`AsyncSaver.start`; a failure on any rank is one :class:`CheckpointError` line."""
    import torch.distributed.checkpoint as dcp

    try:
        future.result()
    except dcp.api.CheckpointException as e:
        raise write_failure(e, final) from None


def write_failure(error: BaseException, final: str) -> CheckpointError:
    """The one-line error of a DCP save of ``final`` that failed on some rank."""
    return _unwrapped(
        error, f"Cannot write checkpoint '{final}'", ". The previous checkpoints and last_checkpoint are untouched."
    )


def _unwrapped(error: BaseException, doing: str, after: str = ".") -> CheckpointError:
    """DCP wraps each rank's failure as ``(exception, traceback)`` in a
    CheckpointException; the caller wants the first one, as one line."""
    failures = getattr(error, "failures", {}) or {}
    for rank in sorted(failures):
        failure = failures[rank]
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
        if isinstance(inner, OSError) and inner.strerror:
            return CheckpointError(f"{doing}: {inner.strerror} (rank {rank}){after}")
        return CheckpointError(f"{doing}: {first_line(inner)} (rank {rank}){after}")
    return CheckpointError(f"{doing}: {first_line(error)}{after}")


# ---------------------------------------------------------------------- loading
def verify_checksums(directory: str) -> None:
    """Checks every file of a published DCP directory against ``checksums.json``.

    Raises:
        CheckpointError: a file is missing, of another size or content, or
            the checksums are missing (the directory was not published by treadle).
    """
    path = os.path.join(directory, CHECKSUM_FILE)
    try:
        with open(path) as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        raise CheckpointError(
            f"'{directory}' has no {CHECKSUM_FILE}: it is not a complete treadle checkpoint "
            "(convert a DCP directory written elsewhere with tools/convert_checkpoint.py)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"'{path}' is unreadable ({first_line(e)})") from None
    for name, expected in files.items():
        file = os.path.join(directory, name)
        try:
            size = os.path.getsize(file)
        except OSError:
            raise CheckpointError(f"'{file}' is missing from the checkpoint directory") from None
        if size != expected["bytes"]:
            raise CheckpointError(f"'{file}' is truncated or damaged: {size} bytes, {expected['bytes']} written")
        if file_crc32(file) != expected["crc32"]:
            raise CheckpointError(f"'{file}' is damaged: its CRC-32 differs from the one recorded when it was written")


def checked_metadata(directory: str) -> Any:
    """Verifies the checksums (the main process; the verdict is shared with
    every rank so that all of them take the same decision) and returns the
    DCP metadata. Raises :class:`CheckpointError` on every rank."""
    problem: Optional[str] = None
    unsafe = False
    if comm.is_main_process():
        try:
            verify_checksums(directory)
            _reader(directory).read_metadata()
        except UnsafeCheckpointError as e:
            problem, unsafe = str(e), True
        except CheckpointError as e:
            problem = str(e)
        except Exception as e:  # a .metadata that does not unpickle
            problem = f"'{directory}/.metadata' is unreadable ({first_line(e)})"
    if comm.get_world_size() > 1:
        problem, unsafe = comm.broadcast_object((problem, unsafe))
    if problem is not None:
        raise (UnsafeCheckpointError if unsafe else CheckpointError)(problem)
    return _reader(directory).read_metadata()


def _load(template: Dict[str, Any], directory: str, what: str) -> None:
    import torch.distributed.checkpoint as dcp

    try:
        with _quiet_single_process():
            dcp.load(
                template,
                storage_reader=_reader(directory),
                planner=_weights_only_planner(),
                no_dist=not _distributed(),
            )
    except dcp.api.CheckpointException as e:
        raise _unwrapped(e, f"Cannot load {what} from '{directory}'") from None


def _sizes(metadata: Any, prefix: str) -> Dict[str, Optional[Tuple[int, ...]]]:
    """``{key: shape}`` of the items under ``prefix.`` (``None`` for non-tensors)."""
    out: Dict[str, Optional[Tuple[int, ...]]] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if fqn.startswith(prefix + "."):
            size = getattr(item, "size", None)
            out[fqn[len(prefix) + 1 :]] = tuple(size) if size is not None else None
    return out


def load_sharded(
    directory: str,
    model: nn.Module,
    optimizers: Mapping[str, torch.optim.Optimizer],
    *,
    strict: bool,
    want_state: bool = True,
) -> Tuple[LoadReport, Dict[str, Any], List[str]]:
    """Loads a DCP checkpoint directory into ``model`` and ``optimizers`` (every rank).

    Each rank reads the parts of the saved shards it needs for its own
    (DCP reshards across world sizes). Model keys are matched by name and
    shape; the rest is in the returned :class:`LoadReport`. With ``strict``
    any mismatch raises before anything is loaded. Returns the report, the
    ``treadle`` record (the other checkpointables' states and the extras;
    ``{}`` without ``want_state``) and the names of the optimizers loaded.

    Raises:
        CheckpointError: damaged or incomplete directory; with ``strict``, a
            model that does not match.
        UnsafeCheckpointError: the metadata or an item would run code.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    metadata = checked_metadata(directory)
    target = unwrap_model(model)
    own = get_model_state_dict(target)
    saved = _sizes(metadata, "model")
    report = LoadReport(source=f"checkpoint '{directory}'")
    loadable: Dict[str, Any] = {}
    for key, shape in saved.items():
        if key not in own:
            report.unexpected.append(key)
            report.shapes[key] = (str(shape) if shape is not None else "", "-")
        elif shape is not None and isinstance(mine := own[key], torch.Tensor) and tuple(mine.shape) != shape:
            report.shape_mismatched.append(ShapeMismatch(key, shape, tuple(mine.shape)))
        else:
            loadable[key] = own[key]
            report.loaded.append(key)
    report.missing = [k for k in own if k not in saved]
    for key in report.missing:
        value = own[key]
        report.shapes[key] = ("-", str(tuple(value.shape)) if isinstance(value, torch.Tensor) else "")
    if strict and not report.complete:
        raise CheckpointError(f"The model does not match the weights in checkpoint '{directory}': {report.summary()}.")

    template: Dict[str, Any] = {"model": loadable}
    loaded_optimizers = []
    for name, optimizer in optimizers.items():
        if any(fqn.startswith(name + ".state.") or fqn.startswith(name + ".param_groups.") for fqn in metadata.state_dict_metadata):
            template[name] = get_optimizer_state_dict(target, optimizer)
            loaded_optimizers.append(name)
    if want_state and STATE_KEY in metadata.state_dict_metadata:
        template[STATE_KEY] = None
    _load(template, directory, "the checkpoint")
    set_model_state_dict(target, template["model"], options=StateDictOptions(strict=False))
    for name in loaded_optimizers:
        set_optimizer_state_dict(target, optimizers[name], template[name])
    return report, _unrecord(template.get(STATE_KEY), directory), loaded_optimizers


def read_dcp(directory: str) -> Dict[str, Any]:
    """The whole content of a DCP directory as one nested dict of full tensors,
    in this process (for conversion to a single file). Checked like a load."""
    from torch.distributed.checkpoint._traverse import set_element

    metadata = checked_metadata(directory) if os.path.exists(os.path.join(directory, CHECKSUM_FILE)) else None
    if metadata is None:
        metadata = _reader(directory).read_metadata()
    flat: Dict[str, Any] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        size = getattr(item, "size", None)
        flat[fqn] = torch.empty(tuple(size), dtype=item.properties.dtype) if size is not None else None
    import torch.distributed.checkpoint as dcp

    planner = _weights_only_planner(flatten_state_dict=False)
    try:
        with _quiet_single_process():
            dcp.load(flat, storage_reader=_reader(directory), planner=planner, no_dist=True)
    except dcp.api.CheckpointException as e:
        raise _unwrapped(e, f"Cannot read '{directory}'") from None
    # The planner's dict holds the non-tensor items it read (tensors were read in place).
    loaded = {**flat, **{k: v for k, v in planner.state_dict.items() if k in flat}}
    mappings = metadata.planner_data or {}
    nested: Dict[str, Any] = {}
    for fqn, value in loaded.items():
        path = mappings.get(fqn, (fqn,)) if isinstance(mappings, dict) else (fqn,)
        set_element(nested, path, value)
    return nested


def dcp_to_file_state(content: Dict[str, Any]) -> Dict[str, Any]:
    """A DCP checkpoint's content (:func:`read_dcp`) as a ``"file"`` checkpoint:
    the ``treadle`` record's entries at the top level and each optimizer
    state in ``torch.optim.Optimizer``'s own format (integer ids numbered in
    ``param_groups`` order, as ``Optimizer.state_dict`` numbers them)."""
    out: Dict[str, Any] = {"model": content.get("model", {})}
    for key, value in content.items():
        if key in ("model", STATE_KEY):
            continue
        out[key] = _optimizer_with_ids(value) if _is_named_optimizer_state(value) else value
    out.update(_unrecord(content.get(STATE_KEY), "(converted)"))
    return out


def _is_named_optimizer_state(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and "param_groups" in value
        and all(isinstance(p, str) for g in value["param_groups"] for p in g.get("params", []))
    )


def _optimizer_with_ids(state: Dict[str, Any]) -> Dict[str, Any]:
    ids: Dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        numbered = []
        for name in group["params"]:
            ids.setdefault(name, len(ids))
            numbered.append(ids[name])
        groups.append({**group, "params": numbered})
    per_param = {ids[name]: value for name, value in state.get("state", {}).items() if name in ids}
    return {"state": dict(sorted(per_param.items())), "param_groups": groups}


def file_state_to_dcp(checkpoint: Dict[str, Any]) -> Dict[str, Any]:
    """A ``"file"`` checkpoint as the state dict of a DCP directory: the model
    weights as DCP items, everything else (optimizer states in torch's own
    format included, which load on any world size) in the ``treadle`` record."""
    model = checkpoint.get("model", {})
    rest = {k: v for k, v in checkpoint.items() if k != "model"}
    return {"model": dict(model), STATE_KEY: _record(rest)}
