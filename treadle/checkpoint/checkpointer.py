"""Saving, resuming and rotating training checkpoints."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from treadle.utils import comm
from treadle.utils.file_io import PathManager

from treadle.utils.atomic import TEMP_MARKER, atomic_write, is_local_path
from .fsdp import full_optimizer_state_dict, is_fsdp_model, load_full_optimizer_state_dict
from .key_matching import align_by_suffix, extract_model_state, load_model_state, model_state_for_saving, unwrap_model
from . import sharded as dcp_format
from .safetensors_io import is_safetensors_source, load_safetensors_weights, save_safetensors_weights
from .serialization import (
    CheckpointError,
    UnsafeCheckpointError,
    _first_line,
    check_weights_only_loadable,
    load_checkpoint_file,
    save_with_checksums,
)

__all__ = ["Checkpointer"]

logger = logging.getLogger(__name__)

_TRAILING_NUMBER = re.compile(r"(\d+)\.(?:pth|dcp)$")
FORMATS = ("file", "dcp")
# A file name is at most 255 bytes on common filesystems; a longer pointer is junk.
_MAX_POINTER_BYTES = 1024
# What atomic.temporary_name produces: .{final name}.tmp.{pid}.{8 hex digits}
_TEMP_FILE = re.compile(r"\..+" + re.escape(TEMP_MARKER) + r"(\d+)\.[0-9a-f]{8}")
# What an unfinished DCP save leaves: .{name}.dcp.partial, or .{name}.dcp.replaced
_TEMP_DIR = re.compile(r"\..+\.dcp\.(?:partial|replaced)")


class Checkpointer:
    """Saves a model with everything a run needs to continue, and restores it.

    A checkpoint ``{save_dir}/{name}.pth`` is one dict: ``"model"`` (the
    unwrapped model's state dict), one entry per checkpointable (optimizer,
    scheduler, the trainer, a grad scaler... anything with
    ``state_dict``/``load_state_dict``) and the ``extra`` values given to
    :meth:`save` (e.g. ``iteration``). The file ``last_checkpoint`` names the
    checkpoint to resume from.

    Contract:

    - Atomic: a crash at any instant leaves the previous checkpoint and
      ``last_checkpoint`` usable (see :func:`~treadle.checkpoint.atomic_write`);
      a file is written before the pointer moves to it.
    - Safe: everything saved loads with ``torch.load(weights_only=True)``,
      checked before writing; every file is read that way, so loading a
      checkpoint never runs code from it.
    - Verified: every record of a saved file carries a CRC-32, checked when
      it is loaded; a damaged file is reported like a truncated one (see
      :func:`~treadle.checkpoint.load_checkpoint_file`).
    - Only the main process writes (``save_to_disk`` defaults to
      :func:`~treadle.utils.comm.is_main_process`, checked at each call); every
      process can read.

    Args:
        model: the model; DDP/DataParallel/``torch.compile`` wrappers are
            stripped when saving and accepted when loading.
        save_dir: where checkpoints live; created on the first save.
        save_to_disk: whether :meth:`save` and :meth:`prune` touch the disk.
        async_save: the default of :meth:`save`'s ``asynchronous``: write
            in a background thread from a snapshot of the state in host
            memory, so that training stalls only for the snapshot.
        format: ``"file"`` (one weights-only ``.pth`` file, written by the
            main process) or ``"dcp"`` (a ``torch.distributed.checkpoint``
            directory ``.dcp`` that every rank writes its shards into; see
            :mod:`treadle.checkpoint.sharded`); ``None`` (the default):
            ``"dcp"`` for an FSDP2 model, ``"file"`` otherwise. Either format
            is read whatever this says.
        **checkpointables: name -> object with ``state_dict``/``load_state_dict``.

    Asynchronous saves: at most one is in flight (a save waits for the
    previous one first); :meth:`wait` waits for it and raises its failure,
    :meth:`raise_if_failed` raises a failure without waiting (the
    :class:`~treadle.hooks.PeriodicCheckpointer` calls it every iteration, so a
    failed background save stops training within one iteration). The file
    and ``last_checkpoint`` appear only once the write is complete: until
    then, and after a failure or a ``kill -9``, the previous checkpoint is the
    resume point.
    """

    POINTER_FILE = "last_checkpoint"
    RESUME_PATTERN = re.compile(r"model_(?!best\.(?:pth|dcp)$).*\.(?:pth|dcp)")
    """Files :meth:`resume_or_load` falls back to when the pointed-to file is
    unreadable. Not ``model_best.pth``: the best checkpoint is a point in the
    past (and may hold averaged weights), not where the run stopped."""

    def __init__(
        self,
        model: nn.Module,
        save_dir: str = "",
        *,
        save_to_disk: Optional[bool] = None,
        async_save: bool = False,
        format: Optional[str] = None,
        **checkpointables: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Checkpointer expects an nn.Module as model, got {type(model).__name__}")
        if format is not None and format not in FORMATS:
            raise ValueError(f"Checkpointer format must be one of {FORMATS} (or None: 'dcp' under FSDP), got {format!r}")
        self.format = format
        self.model = model
        self.save_dir = save_dir
        # Every file of this checkpointer goes through it (detectron2's
        # per-checkpointer path_manager: a handler for another store).
        self.path_manager = PathManager
        self._save_to_disk = save_to_disk
        self._noted_non_local = False
        self.async_save = bool(async_save)
        # One background writer: saves are written in order, one at a time.
        self._writer_pool: Optional[ThreadPoolExecutor] = None
        self._in_flight: Optional[Tuple[str, "Future[None]"]] = None
        # DCP's staging copies (reused between asynchronous saves) and the
        # process group its background writes talk through (not the
        # training's: a collective of a background thread must not interleave
        # with the gradient all-reduces of the main thread).
        self._dcp_stager: Any = None
        self._dcp_group: Any = None
        # Host copies of the state kept between asynchronous saves (host_snapshot).
        self._snapshot_buffers: Dict[Tuple[Any, ...], torch.Tensor] = {}
        self.checkpointables: Dict[str, Any] = {}
        for name, obj in checkpointables.items():
            self.add_checkpointable(name, obj)

    # ------------------------------------------------------------------ setup
    @property
    def save_to_disk(self) -> bool:
        # Resolved per call: a Checkpointer built before the process group was
        # initialized must still write on rank 0 only.
        return comm.is_main_process() if self._save_to_disk is None else self._save_to_disk

    def add_checkpointable(self, name: str, obj: Any) -> None:
        """Adds an object whose state is saved under ``name``.

        Raises:
            ValueError: ``name`` is ``"model"`` or already used.
            TypeError: ``obj`` lacks ``state_dict``/``load_state_dict``.
        """
        if name == "model" or name in self.checkpointables:
            raise ValueError(f"Checkpointable name '{name}' is already used in this Checkpointer.")
        for method in ("state_dict", "load_state_dict"):
            if not callable(getattr(obj, method, None)):
                raise TypeError(
                    f"Checkpointable '{name}' ({type(obj).__name__}) has no {method}() method; "
                    f"a checkpointable needs both state_dict() and load_state_dict()."
                )
        self.checkpointables[name] = obj

    # ------------------------------------------------------------------ paths
    def _path(self, filename: str) -> str:
        return os.path.join(self.save_dir, filename)

    def _list_dir(self) -> List[str]:
        if not self.save_dir or not self.path_manager.isdir(self.save_dir):
            return []
        return sorted(self.path_manager.ls(self.save_dir))

    def _mtime(self, path: str) -> float:
        if not is_local_path(path, self.path_manager):
            return 0.0  # iopath has no portable mtime; the number in the name decides
        try:
            return os.path.getmtime(self.path_manager.get_local_path(path))
        except OSError:
            return 0.0

    def has_checkpoint(self) -> bool:
        """True when there is something to resume from: a ``last_checkpoint``
        pointer naming a file, or a ``model_*.pth`` file or ``model_*.dcp``
        directory in ``save_dir``."""
        return bool(self._pointer_target()) or bool(self._resume_files())

    def _pointer_target(self) -> str:
        """The file name in ``last_checkpoint``, or "" when there is none or it is unusable."""
        return self._read_pointer()[0]

    def _read_pointer(self) -> Tuple[str, str]:
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
            with self.path_manager.open(self._path(self.POINTER_FILE), "rb") as f:
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

    def get_checkpoint_file(self) -> str:
        """The full path of the file named by ``last_checkpoint``, or "" without one."""
        name = self._pointer_target()
        return self._path(name) if name else ""

    def latest_checkpoint_file(self) -> str:
        """The file a resume tries first: the one ``last_checkpoint`` names when
        it exists, else the newest ``model_*.pth`` or ``.dcp``; "" when there is none.
        The file is not read (it may still turn out unreadable)."""
        pointed = self.get_checkpoint_file()
        if pointed and self.path_manager.exists(pointed):
            return pointed
        files = self._resume_files()
        return self._path(files[0]) if files else ""

    def get_all_checkpoint_files(self) -> List[str]:
        """Full paths of every ``.pth`` file and ``.dcp`` directory in
        ``save_dir``, sorted by name (unfinished saves excluded)."""
        return [
            self._path(n) for n in self._list_dir() if n.endswith((".pth", dcp_format.DCP_SUFFIX)) and not n.startswith(".")
        ]

    def checkpoint_format(self) -> str:
        """The format :meth:`save` writes now: ``format``, or ``"dcp"`` for an
        FSDP2 model and ``"file"`` otherwise when it is ``None``."""
        if self.format is not None:
            return self.format
        return "dcp" if is_fsdp_model(unwrap_model(self.model)) else "file"

    def filename_for(self, name: str) -> str:
        """The name :meth:`save` gives the checkpoint ``name``: ``{name}.pth`` or ``{name}.dcp``."""
        return f"{name}{dcp_format.DCP_SUFFIX if self.checkpoint_format() == 'dcp' else '.pth'}"

    def _resume_files(self) -> List[str]:
        """``model_*.pth`` and ``model_*.dcp`` names, newest first.

        Numbered files in the order of their numbers; a file without one
        (``model_final``) goes before the numbered files it was written after
        (by modification time), so that a finished run falls back to its
        final checkpoint rather than to its last periodic one.
        """
        names = [n for n in self._list_dir() if self.RESUME_PATTERN.fullmatch(n)]
        numbered: List[Tuple[int, str]] = []
        unnumbered: List[Tuple[float, str]] = []
        for n in names:
            m = _TRAILING_NUMBER.search(n)
            if m:
                numbered.append((int(m.group(1)), n))
            else:
                unnumbered.append((self._mtime(self._path(n)), n))
        numbered.sort(reverse=True)
        unnumbered.sort(reverse=True)
        order = [n for _, n in numbered]
        times = {n: self._mtime(self._path(n)) for n in order}
        for mtime, n in reversed(unnumbered):  # oldest first: each newer one lands before it
            index = len(order)  # no modification time (a remote store): after the numbered files
            if mtime:
                index = next((i for i, other in enumerate(order) if other in times and times[other] <= mtime), index)
            order.insert(index, n)
        return order

    # ------------------------------------------------------------------ save
    def save(
        self,
        name: str,
        *,
        tag_last_checkpoint: bool = True,
        asynchronous: Optional[bool] = None,
        then: Optional[Callable[[], None]] = None,
        **extra: Any,
    ) -> Optional[str]:
        """Writes ``{save_dir}/{name}.pth`` atomically; returns its path.

        ``asynchronous`` (default: the checkpointer's ``async_save``) returns
        once the state is copied to host memory and writes it in the
        background (see the class docstring); ``then`` runs after the file
        and the pointer are written (in the background thread for an
        asynchronous save), e.g. to prune older checkpoints.

        Holds ``{"model": ..., <checkpointable>: state, ..., **extra}``. With
        ``tag_last_checkpoint`` (the default) ``last_checkpoint`` then names it;
        ``False`` writes the file without moving the pointer (e.g. ``model_best``).
        Returns ``None`` without writing on processes that do not save to disk.
        With several processes every rank must call it at the same point (the
        hooks do): the trainer's state gathers each rank's RNG state, and an
        FSDP2 model's sharded model and optimizer states are gathered into full
        tensors, so the file is the one a plain model would write.

        Raises:
            ValueError: ``name`` is empty, contains a path separator or starts
                with "."; an ``extra`` key collides with ``"model"`` or a
                checkpointable; there is no ``save_dir``.
            TypeError: a value would not load with ``weights_only=True``; the
                message names its key path. Nothing is written.
            CheckpointError: ``save_dir`` cannot be created or written (a full
                disk included, also when torch's zip writer reports it as a
                RuntimeError): one line naming the file and the OS error, e.g.
                ``No space left on device (ENOSPC)``. The temporary file is
                removed; the previous checkpoints and ``last_checkpoint`` are
                untouched.
        """
        sharded = is_fsdp_model(unwrap_model(self.model))
        # With several processes every rank takes part: states may gather
        # across ranks (an FSDP model's shards, each rank's RNG state in the
        # trainer's state); only the main process then writes.
        gathering = sharded or comm.get_world_size() > 1
        if not self.save_to_disk and not gathering:
            return None
        if not self.save_dir:
            raise ValueError("Checkpointer.save needs a save_dir; this Checkpointer was built without one.")
        if not name or "/" in name or os.sep in name or name.startswith("."):
            raise ValueError(
                f"Checkpoint name {name!r} must be a plain, non-hidden file name (no directories); "
                f"it is written as '{{save_dir}}/{{name}}.pth'."
            )
        for key in extra:
            if key == "model" or key in self.checkpointables:
                raise ValueError(f"save(..., {key}=...) collides with the checkpointable '{key}'; rename it.")

        filename = self.filename_for(name)

        def finish() -> None:
            if tag_last_checkpoint:
                self.tag_last_checkpoint(filename)
            if then is not None:
                then()

        asynchronous = self.async_save if asynchronous is None else asynchronous
        if filename.endswith(dcp_format.DCP_SUFFIX):
            return self._write_dcp(name, extra, asynchronous=asynchronous, then=finish)
        return self._write(self._path(filename), extra, sharded, asynchronous=asynchronous, then=finish)

    def save_weights(self, name: str, **extra: Any) -> Optional[str]:
        """Writes ``{save_dir}/{name}.pth`` holding ``{"model": weights, **extra}``
        only, synchronously, without moving ``last_checkpoint``: the final or
        best weights of a run whose checkpoints are DCP directories, loadable
        by a plain ``torch.load(weights_only=True)``. Under FSDP the weights are
        gathered one tensor at a time onto the main process (which then holds
        the full model once, in host memory); the optimizer state is not. A
        collective with several processes: every rank calls it. Returns the
        path, or ``None`` on processes that do not write."""
        data: Dict[str, Any] = {"model": model_state_for_saving(self.model)}
        if not self.save_to_disk:
            return None
        if not self.save_dir:
            raise ValueError("Checkpointer.save_weights needs a save_dir; this Checkpointer was built without one.")
        data.update(extra)
        path = self._path(f"{name}.pth")
        check_weights_only_loadable(data, what=f"checkpoint '{path}'")
        self._make_dir(self.save_dir)
        self.wait()
        self._write_file(path, self.save_dir, data, None)
        return path

    def save_safetensors(self, name: str) -> Optional[str]:
        """Writes the model's weights to ``{save_dir}/{name}.safetensors``
        (the format Hugging Face users exchange weights in), atomically; keys
        are those of the unwrapped model. Gathered onto the main process under
        FSDP: every rank calls it. Returns the path, or ``None`` on processes
        that do not write."""
        state = model_state_for_saving(self.model)
        if not self.save_to_disk:
            return None
        self._make_dir(self.save_dir)
        path = self._path(f"{name}.safetensors")
        save_safetensors_weights(state, path)
        logger.info("Saved the model weights to %s", path)
        return path

    def save_file(self, path: str, **extra: Any) -> Optional[str]:
        """Writes the same checkpoint as :meth:`save` to any ``path`` (its
        directory is created), without moving ``last_checkpoint``: for a
        checkpoint outside ``save_dir`` (``Trainer.save_checkpoint``). Returns
        the path, or ``None`` on processes that do not write. Raises as
        :meth:`save` does."""
        sharded = is_fsdp_model(unwrap_model(self.model))
        if not self.save_to_disk and not (sharded or comm.get_world_size() > 1):
            return None
        for key in extra:
            if key == "model" or key in self.checkpointables:
                raise ValueError(f"save_file(..., {key}=...) collides with the checkpointable '{key}'; rename it.")
        return self._write(path, extra, sharded, asynchronous=False, then=None)

    def _write(
        self,
        path: str,
        extra: Dict[str, Any],
        sharded: bool,
        *,
        asynchronous: bool,
        then: Optional[Callable[[], None]],
    ) -> Optional[str]:
        """Gathers the state (every rank) and writes it to ``path`` (main process),
        now or from a host-memory snapshot in the background."""
        directory = os.path.dirname(path) or "."
        data: Dict[str, Any] = {"model": model_state_for_saving(self.model)}
        for key, obj in self.checkpointables.items():
            if sharded and isinstance(obj, torch.optim.Optimizer):
                data[key] = full_optimizer_state_dict(obj)
            else:
                data[key] = obj.state_dict()
        if not self.save_to_disk:
            return None
        data.update(extra)
        check_weights_only_loadable(data, what=f"checkpoint '{path}'")

        self._make_dir(directory)
        if not self._noted_non_local and not is_local_path(path, self.path_manager):
            self._noted_non_local = True
            logger.info(
                "Checkpoints in '%s' are not on the local filesystem: they are written in place, so whether "
                "a crash mid-write can leave a partial file depends on the storage backend.",
                directory,
            )
        self.wait()  # at most one save in flight, and files appear in the order they were saved
        if not asynchronous:
            self._write_file(path, directory, data, then)
            return path
        # The previous save is complete (waited for above): its buffers can be reused.
        snapshot = host_snapshot(data, self._snapshot_buffers)
        if self._writer_pool is None:
            self._writer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-checkpoint")
        self._in_flight = (path, self._writer_pool.submit(self._write_file, path, directory, snapshot, then))
        return path

    def _write_file(
        self, path: str, directory: str, data: Dict[str, Any], then: Optional[Callable[[], None]]
    ) -> None:
        try:
            atomic_write(path, lambda f: save_with_checksums(data, f), self.path_manager)
        except (OSError, RuntimeError) as e:
            if not isinstance(e, OSError) and not _is_torch_write_failure(e):
                raise  # a RuntimeError of torch.save that is not about writing (a device error)
            # torch's zip writer turns a failed write (a full disk) into a
            # RuntimeError whose context holds the OSError, when there is one.
            os_error = _os_error_in(e)
            reason = _describe_os_error(os_error) if os_error else self._torch_write_failure(e, directory)
            raise CheckpointError(
                f"Cannot write checkpoint '{path}' in directory '{directory}': {reason}. "
                f"The previous checkpoints and {self.POINTER_FILE} are untouched."
            ) from e
        logger.info("Saved checkpoint to %s", path)
        if then is not None:
            then()

    def _write_dcp(
        self, name: str, extra: Dict[str, Any], *, asynchronous: bool, then: Optional[Callable[[], None]]
    ) -> Optional[str]:
        """Every rank writes its shards of ``{name}.dcp`` (see
        :mod:`treadle.checkpoint.sharded`); the main process publishes it."""
        final = self._path(name + dcp_format.DCP_SUFFIX)
        partial = self._path(dcp_format.partial_name(name))
        if not is_local_path(self.save_dir, self.path_manager):
            raise CheckpointError(
                f"The 'dcp' checkpoint format writes to a local or mounted filesystem; '{self.save_dir}' is not one. "
                "Use train.checkpointer.format=file."
            )
        state = dcp_format.sharded_state(self.model, self.checkpointables, extra, what=f"checkpoint '{final}'")
        self.wait()  # at most one save in flight; its directory is published before this one starts
        if self.save_to_disk:
            self._make_dir(self.save_dir)
            shutil.rmtree(partial, ignore_errors=True)  # what a killed save of this name left
        comm.synchronize()  # no rank writes into the directory before it is cleared
        if not asynchronous:
            try:
                dcp_format.write_dcp(state, partial, final=final)
                if self.save_to_disk:
                    self._publish(partial, final, then)
            finally:
                comm.synchronize()  # on return the checkpoint exists for every rank
            return final if self.save_to_disk else None
        future = self._start_async_dcp(state, partial)
        if self._writer_pool is None:
            self._writer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-checkpoint")
        self._in_flight = (final, self._writer_pool.submit(self._finish_async_dcp, future, partial, final, then))
        return final if self.save_to_disk else None

    def _start_async_dcp(self, state: Dict[str, Any], partial: str) -> "Future[Any]":
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        if self._dcp_stager is None or not dcp_format.stager_reusable(self._dcp_stager):
            # Kept between saves: DCP's stager reuses its host copies.
            self._dcp_stager = dcp_format.new_stager()
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and self._dcp_group is None:
            self._dcp_group = dist.new_group(backend="gloo")  # every rank is here, in the same order
        with dcp_format._quiet_single_process():
            return dcp.async_save(
                state,
                storage_writer=dcp.FileSystemWriter(partial, single_file_per_rank=True, sync_files=True),
                process_group=self._dcp_group,
                async_stager=self._dcp_stager,
                no_dist=not distributed,
            )

    def _finish_async_dcp(
        self, future: "Future[Any]", partial: str, final: str, then: Optional[Callable[[], None]]
    ) -> None:
        import torch.distributed.checkpoint as dcp

        try:
            future.result()
        except dcp.api.CheckpointException as e:
            raise dcp_format.write_failure(e, final) from None
        if self.save_to_disk:
            self._publish(partial, final, then)

    def _publish(self, partial: str, final: str, then: Optional[Callable[[], None]]) -> None:
        try:
            dcp_format.publish(partial, final)
        except OSError as e:
            raise CheckpointError(
                f"Cannot publish checkpoint '{final}': {_describe_os_error(e)}. "
                f"The previous checkpoints and {self.POINTER_FILE} are untouched."
            ) from e
        logger.info("Saved checkpoint to %s", final)
        if then is not None:
            then()

    # ------------------------------------------------------------------ background saves
    @property
    def saving(self) -> bool:
        """Whether an asynchronous save is still being written."""
        return self._in_flight is not None and not self._in_flight[1].done()

    def wait(self) -> None:
        """Waits for the asynchronous save in flight, if any.

        Raises:
            CheckpointError: that save failed; its file and ``last_checkpoint``
                were not written (the previous checkpoint is the resume point).
        """
        if self._in_flight is None:
            return
        path, future = self._in_flight
        self._in_flight = None
        error = future.exception()
        if error is not None:
            raise _background_failure(path, error) from error

    def raise_if_failed(self) -> None:
        """Raises the failure of a finished asynchronous save, without waiting
        for one still in flight (cheap enough to call every iteration)."""
        if self._in_flight is not None and self._in_flight[1].done():
            self.wait()

    def _torch_write_failure(self, error: BaseException, directory: str) -> str:
        """What a failed ``torch.save`` without an OS error to show says, and the free space left."""
        said = f"torch.save failed ({_first_line(error)})"
        if is_local_path(directory, self.path_manager):
            try:
                free = shutil.disk_usage(self.path_manager.get_local_path(directory)).free
            except OSError:
                return said
            # A full disk is the usual cause; the free space says whether it is this one.
            said += f"; {free / 2**20:.1f} MiB free on its filesystem"
        return said

    def _make_save_dir(self) -> None:
        self._make_dir(self.save_dir)

    def _make_dir(self, directory: str) -> None:
        try:
            self.path_manager.mkdirs(directory)
        except OSError as e:
            raise CheckpointError(f"Cannot create the checkpoint directory '{directory}': {_describe_os_error(e)}.") from e

    def tag_last_checkpoint(self, filename: str) -> None:
        """Points ``last_checkpoint`` at ``filename`` (a name inside ``save_dir``), atomically."""
        if not self.save_to_disk:
            return
        pointer = self._path(self.POINTER_FILE)
        self._make_save_dir()
        try:
            atomic_write(pointer, lambda f: f.write(filename.encode("utf-8")), self.path_manager)
        except OSError as e:
            raise CheckpointError(
                f"Cannot update '{pointer}' in directory '{self.save_dir}': {_describe_os_error(e)}. "
                f"It still names the previous checkpoint."
            ) from e

    # ------------------------------------------------------------------ load
    def load(
        self,
        path: str,
        checkpointables: Optional[Sequence[str]] = None,
        *,
        strict: bool = False,
        matching_heuristics: bool = False,
    ) -> Dict[str, Any]:
        """Loads ``path`` into the model and the checkpointables.

        The model takes every key that matches by name (DDP ``module.`` and
        compile ``_orig_mod.`` prefixes are accepted on either side);
        shape-mismatched keys are skipped; missing, unexpected and mismatched
        keys are logged as a table. With ``matching_heuristics`` (also
        ``path + "?matching_heuristics=True"``, detectron2's form), a
        checkpoint key matches the model key it is the longest dotted suffix
        of (``layer1.weight`` loads into ``block1.layer1.weight``): for
        weights saved from a part of another model. With ``strict`` any such key is a
        :class:`CheckpointError` instead, raised before anything is loaded
        (evaluating or continuing a run needs the model's own weights). Each
        checkpointable (all of them, or those named in ``checkpointables``;
        ``[]`` loads the model only) is loaded when the file has its state; a
        missing one is a warning.

        Returns what the file holds besides what was loaded (e.g. ``iteration``).
        An empty ``path`` loads nothing and returns ``{}`` (no initial weights).

        Raises:
            UnsafeCheckpointError: the file needs unsafe unpickling; not loaded.
            CheckpointError: the file is missing, truncated or corrupt; with
                ``strict``, its model weights do not fit the model.
            ValueError: ``checkpointables`` names an unknown checkpointable.
        """
        if not path:
            logger.info("No checkpoint given: the model keeps its current weights.")
            return {}
        path, matching_heuristics = _split_query(path, matching_heuristics)
        names = self._select(checkpointables)
        logger.info("Loading checkpoint from %s", path)
        if is_safetensors_source(path):
            # Weights only (a .safetensors file, a Hugging Face model folder).
            checkpoint: Dict[str, Any] = {"model": load_safetensors_weights(path)}
            return self._restore(checkpoint, path, names, strict=strict, matching_heuristics=matching_heuristics)
        if self._is_dcp(path):
            if matching_heuristics:
                raise ValueError(
                    f"matching_heuristics is not available for the DCP directory '{path}'; convert it to one file "
                    "first (tools/convert_checkpoint.py)."
                )
            return self._restore_dcp(path, names, strict=strict)
        checkpoint = load_checkpoint_file(path, self.path_manager)
        return self._restore(checkpoint, path, names, strict=strict, matching_heuristics=matching_heuristics)

    def _is_dcp(self, path: str) -> bool:
        if is_safetensors_source(path):
            return False
        return path.rstrip("/").endswith(dcp_format.DCP_SUFFIX) or (
            is_local_path(path, self.path_manager) and dcp_format.is_dcp_checkpoint(path)
        )

    def _restore_dcp(self, path: str, names: Iterable[str], *, strict: bool = False) -> Dict[str, Any]:
        """Loads a DCP checkpoint directory into the model and the checkpointables
        named in ``names`` (every rank; each reads what its shards need)."""
        names = list(names)
        optimizers = {
            n: obj for n, obj in self.checkpointables.items() if n in names and isinstance(obj, torch.optim.Optimizer)
        }
        report, rest, loaded = dcp_format.load_sharded(path, self.model, optimizers, strict=strict)
        _log_load_report(report, path)
        rest = dict(rest)
        for name in names:
            if name in loaded:
                continue
            if name not in rest:
                logger.warning("Checkpoint %s has no state for '%s'; it keeps its current state.", path, name)
                continue
            self._load_checkpointable(name, rest.pop(name), path)
        return rest

    def _load_checkpointable(self, name: str, state: Any, path: str) -> None:
        obj = self.checkpointables[name]
        try:
            if isinstance(obj, torch.optim.Optimizer) and is_fsdp_model(unwrap_model(self.model)):
                # Each rank keeps its shard of the full state it read.
                load_full_optimizer_state_dict(obj, state)
            else:
                obj.load_state_dict(state)
        except Exception as e:
            e.add_note(f"treadle: raised while loading '{name}' from checkpoint '{path}'")
            raise

    def _select(self, checkpointables: Optional[Sequence[str]]) -> List[str]:
        if checkpointables is None:
            return list(self.checkpointables)
        if isinstance(checkpointables, str):
            raise TypeError("checkpointables must be a list of names, not a string.")
        unknown = [n for n in checkpointables if n not in self.checkpointables]
        if unknown:
            raise ValueError(
                f"Unknown checkpointables {unknown}; this Checkpointer has {sorted(self.checkpointables)}."
            )
        return list(checkpointables)

    def _restore(
        self,
        checkpoint: Dict[str, Any],
        path: str,
        names: Iterable[str],
        *,
        strict: bool = False,
        matching_heuristics: bool = False,
    ) -> Dict[str, Any]:
        state, container = extract_model_state(checkpoint, path)
        if matching_heuristics:
            state = align_by_suffix(unwrap_model(self.model).state_dict().keys(), state)
        report = load_model_state(self.model, state, source=f"checkpoint '{path}'", strict=strict)
        _log_load_report(report, path)
        rest = dict(checkpoint) if container is not None else {}
        rest.pop(container, None)
        for name in names:
            if name not in rest:
                logger.warning("Checkpoint %s has no state for '%s'; it keeps its current state.", path, name)
                continue
            self._load_checkpointable(name, rest.pop(name), path)
        return rest

    def resume_or_load(self, path: str = "", *, resume: bool = True) -> Dict[str, Any]:
        """Continues a run from ``save_dir``, or starts one from ``path``'s weights.

        With ``resume`` and a checkpoint in ``save_dir``: loads everything from
        the newest readable checkpoint, starting with the one ``last_checkpoint``
        names; a truncated or corrupt one (a checksum mismatch included) is
        reported (warning naming the file and the error) and the other
        ``model_*.pth`` files are tried, newest first (highest iteration number
        in the name, then files without one by modification time). A pointer
        that is unusable (binary, empty, a path, unreadable) or names a missing
        file is not tried; the warning then says so and names the file resumed
        from instead. "An older checkpoint than the newest one" is said only
        when a newer checkpoint file exists and could not be read. ``path`` is
        not used then (logged). Returns the extra data of the checkpoint (e.g.
        ``iteration``).

        Otherwise (no ``resume``, or nothing to resume from, which is a
        warning): loads only the model weights from ``path`` if given, leaves
        the other checkpointables untouched, and returns ``{}``.

        Raises:
            CheckpointError: resuming, but no checkpoint could be read; the
                message lists each file tried and why it failed. Also when
                ``last_checkpoint`` exists but is unusable and there is no
                ``model_*.pth`` file: the run saved checkpoints there, so
                starting over silently could throw its progress away.
            UnsafeCheckpointError: a checkpoint needs unsafe unpickling. This
                stops the resume instead of falling back to an older file: the
                file is intact, and a person must decide whether to trust it.
        """
        if resume:
            pointed, problem = self._read_pointer()
            if pointed and not self.path_manager.exists(self._path(pointed)):
                pointed, problem = "", f"it names {pointed}, which does not exist in '{self.save_dir}'"
            # The pointer's file first: it is the last one the run saved.
            names = ([pointed] if pointed else []) + [n for n in self._resume_files() if n != pointed]
            if names:
                return self._resume_from(names, pointed, problem, ignored_path=path)
            if problem:
                raise CheckpointError(
                    f"Cannot resume: the checkpoint pointer '{self._path(self.POINTER_FILE)}' is unusable "
                    f"({problem}) and there is no model_*.pth file to resume from instead. Remove it to start "
                    f"this run fresh."
                )
            logger.warning(
                "Asked to resume, but there is no checkpoint in '%s': training starts fresh%s.",
                self.save_dir,
                f", from the weights in {path}" if path else "",
            )
        if path:
            self.load(path, checkpointables=[])
        return {}

    def _resume_from(
        self, names: List[str], pointed: str, pointer_problem: str, ignored_path: str
    ) -> Dict[str, Any]:
        failures: List[str] = []
        unreadable: List[str] = []
        for i, name in enumerate(names):
            path = self._path(name)
            dcp_dir = self._is_dcp(path)
            try:
                if dcp_dir:
                    dcp_format.checked_metadata(path)  # the same verdict on every rank
                    checkpoint = {}
                else:
                    checkpoint = load_checkpoint_file(path, self.path_manager)
            except UnsafeCheckpointError:
                raise
            except CheckpointError as e:
                then = f"trying {names[i + 1]}" if i + 1 < len(names) else "no other checkpoint to try"
                logger.warning("Cannot resume from %s (%s); %s.", path, e, then)
                failures.append(f"{path}: {e}")
                unreadable.append(name)
                continue
            if not dcp_dir and self.checkpointables and not any(n in checkpoint for n in self.checkpointables):
                # A weights file (save_weights: model_final.pth beside model_final.dcp)
                # cannot continue a run: nothing but the model is in it.
                logger.info("Not resuming from %s: it holds model weights only.", path)
                continue
            self._log_resume_point(name, i == 0, pointed, pointer_problem, unreadable, names)
            if ignored_path:
                logger.info("Resuming, so the initial weights '%s' are not loaded.", ignored_path)
            try:
                if dcp_dir:
                    return self._restore_dcp(path, list(self.checkpointables), strict=True)
                return self._restore(checkpoint, path, list(self.checkpointables), strict=True)
            except CheckpointError as e:
                # Not a damaged file: the run's model is not the one that was
                # saved (a changed config). An older checkpoint would not fit either.
                raise CheckpointError(
                    f"Cannot resume from {path}: {e} Resume with the config the run was trained with, or "
                    "start a new run that loads these weights as its initial weights (train.init_checkpoint)."
                ) from None
        problem = f" The checkpoint pointer is unusable: {pointer_problem}." if pointer_problem else ""
        raise CheckpointError(
            # One line: the command line shows an error's lines joined by "; ".
            f"Cannot resume: none of the checkpoints in '{self.save_dir}' could be read.{problem} Tried: "
            + "; ".join(failures)
        )

    def _log_resume_point(
        self, name: str, first: bool, pointed: str, pointer_problem: str, unreadable: List[str], order: List[str]
    ) -> None:
        """Says which file a resume uses, and why when it is not the one ``last_checkpoint`` names.

        "Older than the newest" only when a newer checkpoint file exists and
        could not be read: a pointer naming a missing file, or garbage, does
        not make the newest file an older one.
        """
        path = self._path(name)
        if not pointer_problem and not unreadable:
            logger.info("Resuming from %s", path)
            return
        said = []
        if pointer_problem:
            said.append(f"The checkpoint pointer '{self._path(self.POINTER_FILE)}' is unusable: {pointer_problem}.")
        newer = [n for n in unreadable if _is_newer(n, name, order)]
        if newer:
            said.append(
                f"Resuming from {path}, an older checkpoint than the newest one: {', '.join(newer)} could not be read."
            )
        elif pointed in unreadable:
            said.append(f"Resuming from {path} instead of {pointed}, which last_checkpoint names and could not be read.")
        elif first:
            said.append(f"Resuming from {path}, the newest checkpoint file, instead.")
        else:
            said.append(f"Resuming from {path} instead.")
        logger.warning(" ".join(said))

    # ------------------------------------------------------------------ rotation
    def prune(
        self,
        prefix: str = "model_",
        *,
        keep_last: int,
        protect: Sequence[str] = ("model_final", "model_best"),
        only: Optional[Sequence[str]] = None,
    ) -> List[str]:
        """Deletes all but the newest ``keep_last`` files ``{prefix}{number}.pth``.

        Files are counted on disk, so the limit holds across restarts and
        Checkpointer instances, and ordered by the number in their names.
        With ``only`` (file names), only those files are counted and may be
        deleted: the others, another run's say, are left alone. Never
        deleted: the file ``last_checkpoint`` names, and names in ``protect``
        (with or without ``.pth``). Also removes temporary files left in
        ``save_dir`` by other processes' unfinished saves. Does nothing on
        processes that do not save to disk.

        Returns the paths deleted.

        Raises:
            ValueError: ``keep_last`` < 1.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if not self.save_to_disk:
            return []
        pattern = re.compile(re.escape(prefix) + r"(\d+)\.(?:pth|dcp)")
        kept = {self._pointer_target()} | {
            p + suffix for p in protect for suffix in ("", ".pth", dcp_format.DCP_SUFFIX)
        }
        names = self._list_dir()
        eligible = set(only) if only is not None else None
        numbered = sorted(
            (int(m.group(1)), n)
            for n in names
            if (m := pattern.fullmatch(n)) is not None and (eligible is None or n in eligible)
        )
        doomed = [n for _, n in numbered[:-keep_last] if n not in kept]
        doomed += self._stale_temporary_files(names)
        writing = self._in_flight[0] if self._in_flight is not None and not self._in_flight[1].done() else None
        deleted = []
        for n in doomed:
            path = self._path(n)
            if writing is not None and n == dcp_format.partial_name(os.path.basename(writing)[: -len(dcp_format.DCP_SUFFIX)]):
                continue  # this checkpointer's own save in flight
            if n.endswith((dcp_format.DCP_SUFFIX, ".partial", ".replaced")) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                self.path_manager.rm(path)
            deleted.append(path)
        if deleted:
            logger.info("Removed old checkpoint files: %s", ", ".join(os.path.basename(p) for p in deleted))
        return deleted

    def numbered_files(self, prefix: str = "model_", *, up_to: Optional[int] = None) -> List[str]:
        """Names of the checkpoints ``{prefix}{number}.pth`` (or ``.dcp``) in
        ``save_dir`` (numbers up to ``up_to`` when given), in the order of their numbers."""
        pattern = re.compile(re.escape(prefix) + r"(\d+)\.(?:pth|dcp)")
        found = sorted(
            (int(m.group(1)), n)
            for n in self._list_dir()
            if (m := pattern.fullmatch(n)) is not None and (up_to is None or int(m.group(1)) <= up_to)
        )
        return [n for _, n in found]

    @staticmethod
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


def host_snapshot(obj: Any, buffers: Optional[Dict[Tuple[Any, ...], torch.Tensor]] = None) -> Any:
    """A copy of ``obj`` whose tensors are copies in host memory, detached from
    training: what an asynchronous save writes while training goes on.

    ``buffers`` (path in ``obj`` -> tensor) keeps the copies between saves:
    a tensor of the same shape and dtype is copied into its previous buffer
    instead of freshly allocated memory, which is several times faster (no
    page faults) and keeps the host memory at one copy of the state. Kept
    copies of GPU tensors are in pinned memory, filled by copies issued
    together without waiting for each, then waited for once: on return
    every copy has landed, and training may change the originals.
    """
    devices: Set[torch.device] = set()
    copied = _snapshot(obj, buffers, (), devices)
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return copied


def _snapshot(obj: Any, buffers: Optional[Dict[Tuple[Any, ...], torch.Tensor]], key: Tuple[Any, ...],
              devices: Set[torch.device]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        on_host = tensor.device.type == "cpu"
        if buffers is None:
            return tensor.clone() if on_host else tensor.to("cpu")
        buffer = buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or tensor.is_sparse:
            if on_host or tensor.is_sparse or tensor.device.type != "cuda":
                buffer = tensor.clone() if on_host else tensor.to("cpu")
                buffers[key] = buffer
                return buffer
            buffer = buffers[key] = _pinned_like(tensor)
        if tensor.device.type == "cuda" and buffer.is_pinned():
            buffer.copy_(tensor, non_blocking=True)
            devices.add(tensor.device)
        else:
            buffer.copy_(tensor)
        return buffer
    if isinstance(obj, dict):
        copied = {k: _snapshot(v, buffers, key + (k,), devices) for k, v in obj.items()}
        return copied if type(obj) is dict else type(obj)(copied)  # an OrderedDict stays one
    if isinstance(obj, list):
        return [_snapshot(v, buffers, key + (i,), devices) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_snapshot(v, buffers, key + (i,), devices) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def _pinned_like(tensor: torch.Tensor) -> torch.Tensor:
    """An empty host tensor like ``tensor`` in pinned memory (copies from the
    GPU into it run at the link's full speed and need not wait one by one),
    or in ordinary memory where pinning is refused (a limit on locked memory)."""
    try:
        return torch.empty_like(tensor, device="cpu", pin_memory=True)
    except RuntimeError:
        return torch.empty_like(tensor, device="cpu")


def _log_load_report(report: Any, path: str) -> None:
    if report.complete:
        logger.info("Loaded all %d model keys from %s", len(report.loaded), path)
    else:
        logger.warning(
            "Loaded %d model keys from %s; these were not loaded:\n%s",
            len(report.loaded),
            path,
            report.table(include_loaded=False),
        )


def _background_failure(path: str, error: BaseException) -> CheckpointError:
    if isinstance(error, CheckpointError):
        return CheckpointError(f"Background save failed: {error}")
    return CheckpointError(
        f"Background save of checkpoint '{path}' failed: {_first_line(error)}. It was not written; "
        f"the previous checkpoint is the resume point."
    )


def _split_query(path: str, matching_heuristics: bool) -> Tuple[str, bool]:
    """``("x.pth", True)`` for detectron2's ``"x.pth?matching_heuristics=True"``."""
    base, sep, query = path.partition("?")
    if not sep:
        return path, matching_heuristics
    options = dict(item.partition("=")[::2] for item in query.split("&") if item)
    unknown = sorted(set(options) - {"matching_heuristics"})
    if unknown:
        raise ValueError(f"Unknown checkpoint path option(s) {unknown} in {path!r}; known: matching_heuristics")
    value = options.get("matching_heuristics", "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise ValueError(f"matching_heuristics must be True or False in {path!r}, got {value!r}")
    return base, matching_heuristics or value in ("true", "1")


def _preview(raw: bytes, limit: int = 40) -> str:
    """A short, one-line rendering of a pointer's content for a message: the
    text without surrounding whitespace, or the bytes when it is not text."""
    try:
        content: Any = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        content = raw
    return repr(content[:limit]) + ("..." if len(content) > limit else "")


def _is_newer(a: str, b: str, order: Sequence[str]) -> bool:
    """Whether checkpoint ``a`` is newer than ``b``: by the iteration numbers in
    their names when both have one, else by resume order (the pointer's file,
    then newest first)."""
    na, nb = _TRAILING_NUMBER.search(a), _TRAILING_NUMBER.search(b)
    if na and nb:
        return int(na.group(1)) > int(nb.group(1))
    return order.index(a) < order.index(b)


# What torch's zip writer says when a write fails (messages of torch 2.x's
# inline_container.cc): it raises RuntimeError, not OSError.
_TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed", "file write failed", "inline_container.cc", "iostream error")


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


def _describe_os_error(error: OSError) -> str:
    """One line: ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(error.errno) if error.errno is not None else None
    if error.strerror:
        return f"{error.strerror} ({name})" if name else error.strerror
    return _first_line(error)
