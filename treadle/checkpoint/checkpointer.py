"""The checkpointer: what a checkpoint holds, and the rules of saving, loading and resuming.

The folder's names, the file and DCP formats and the background thread are
parts it uses (``folder``, ``file_writer``, ``sharded``, ``background``).
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from treadle.utils import comm
from treadle.utils.atomic import is_local_path
from treadle.utils.file_io import PathManager

from . import sharded as dcp_format
from .background import BackgroundWriter
from .file_writer import make_dir, write_checkpoint_file
from .folder import (
    DCP_SUFFIX,
    POINTER_FILE,
    RESUME_PATTERN,
    CheckpointFolder,
    folder_given_for_a_file,
    is_newer,
    partial_name,
)
from .fsdp import full_optimizer_state_dict, is_fsdp_model, load_full_optimizer_state_dict
from .key_matching import align_by_suffix, extract_model_state, load_model_state, model_state_for_saving, unwrap_model
from .replicas import check_replicas_agree
from .safetensors_io import is_safetensors_source, load_safetensors_weights, save_safetensors_weights
from .serialization import (
    CheckpointError,
    ResumeRefusedError,
    UnsafeCheckpointError,
    check_checkpoint_file,
    check_weights_only_loadable,
    load_checkpoint_file,
)

__all__ = ["Checkpointer"]

logger = logging.getLogger(__name__)

FORMATS = ("file", "dcp")


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
    previous one first); :attr:`in_flight` says whether one is being
    written, :attr:`failed` gives the failure of a finished one;
    :meth:`wait` waits for it and raises its failure,
    :meth:`raise_if_failed` raises a failure without waiting (the
    :class:`~treadle.hooks.PeriodicCheckpointer` calls it every iteration, so a
    failed background save stops training within one iteration). The file
    and ``last_checkpoint`` appear only once the write is complete: until
    then, and after a failure or a ``kill -9``, the previous checkpoint is the
    resume point.

    The parts: the folder's names (:mod:`~treadle.checkpoint.folder`), the
    file format (:mod:`~treadle.checkpoint.file_writer`), the sharded one
    (:mod:`~treadle.checkpoint.sharded`) and the background thread
    (:mod:`~treadle.checkpoint.background`); this class holds the rules of
    saving, loading and resuming.
    """

    POINTER_FILE = POINTER_FILE
    RESUME_PATTERN = RESUME_PATTERN
    """Files :meth:`resume_or_load` falls back to (see :data:`treadle.checkpoint.folder.RESUME_PATTERN`)."""

    def __init__(
        self,
        model: nn.Module,
        save_dir: Union[str, "os.PathLike[str]"] = "",
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
        self.save_dir = os.fspath(save_dir)  # a pathlib.Path too
        # Every file of this checkpointer goes through it (detectron2's
        # per-checkpointer path_manager: a handler for another store).
        self.path_manager = PathManager
        self._save_to_disk = save_to_disk
        self._noted_non_local = False
        self.async_save = bool(async_save)
        # Saves are written in order, one at a time, by one background thread.
        self._background = BackgroundWriter()
        self._dcp_async = dcp_format.AsyncSaver()
        self._replicas_checked = False
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

    # ------------------------------------------------------------------ the folder
    @property
    def folder(self) -> CheckpointFolder:
        """The names in ``save_dir`` (the pointer, the checkpoints), through ``path_manager``."""
        return CheckpointFolder(self.save_dir, self.path_manager)

    def _path(self, filename: str) -> str:
        return os.path.join(self.save_dir, filename)

    def has_checkpoint(self) -> bool:
        """True when there is something to resume from: a ``last_checkpoint``
        pointer naming a file, or a ``model_*.pth`` file or ``model_*.dcp``
        directory in ``save_dir``."""
        folder = self.folder
        return bool(folder.pointer_target()) or bool(folder.resume_files(self.RESUME_PATTERN))

    def get_checkpoint_file(self) -> str:
        """The full path of the file named by ``last_checkpoint``, or "" without one."""
        name = self.folder.pointer_target()
        return self._path(name) if name else ""

    def latest_checkpoint_file(self) -> str:
        """The file a resume tries first: the one ``last_checkpoint`` names when
        it exists, else the newest ``model_*.pth`` or ``.dcp``; "" when there is none.
        The file is not read (it may still turn out unreadable)."""
        pointed = self.get_checkpoint_file()
        if pointed and self.path_manager.exists(pointed):
            return pointed
        files = self.folder.resume_files(self.RESUME_PATTERN)
        return self._path(files[0]) if files else ""

    def get_all_checkpoint_files(self) -> List[str]:
        """Full paths of every ``.pth`` file and ``.dcp`` directory in
        ``save_dir``, sorted by name (unfinished saves excluded)."""
        return [self._path(n) for n in self.folder.checkpoint_names()]

    def checkpoint_format(self) -> str:
        """The format :meth:`save` writes now: ``format``, or ``"dcp"`` for an
        FSDP2 model and ``"file"`` otherwise when it is ``None``."""
        if self.format is not None:
            return self.format
        return "dcp" if is_fsdp_model(unwrap_model(self.model)) else "file"

    def filename_for(self, name: str) -> str:
        """The name :meth:`save` gives the checkpoint ``name``: ``{name}.pth`` or ``{name}.dcp``."""
        return f"{name}{DCP_SUFFIX if self.checkpoint_format() == 'dcp' else '.pth'}"

    # ------------------------------------------------------------------ save
    def save(
        self,
        name: str,
        *,
        tag_last_checkpoint: bool = True,
        asynchronous: Optional[bool] = None,
        then: Optional[Callable[[], object]] = None,
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
            ReplicasDifferError: at the first save on several processes, the
                model or a checkpointable ``nn.Module`` has other weights on
                other ranks (a second model never wrapped in DDP); nothing is
                written, on any rank.
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
        self._check_replicas_once()

        filename = self.filename_for(name)

        def finish() -> None:
            if tag_last_checkpoint:
                self.tag_last_checkpoint(filename)
            if then is not None:
                then()

        asynchronous = self.async_save if asynchronous is None else asynchronous
        if filename.endswith(DCP_SUFFIX):
            return self._write_dcp(name, extra, asynchronous=asynchronous, then=finish)
        return self._write(self._path(filename), extra, sharded, asynchronous=asynchronous, then=finish)

    def _check_replicas_once(self) -> None:
        """At the first save on several processes, where every rank saves
        together: the model and each checkpointable module hold the same
        weights on every rank (see :mod:`~treadle.checkpoint.replicas`), else
        a :class:`~treadle.checkpoint.ReplicasDifferError` on every rank,
        before anything is written. Once per checkpointer: never per iteration."""
        if self._replicas_checked or comm.get_world_size() <= 1:
            return
        modules = {"model": self.model}
        modules.update((name, obj) for name, obj in self.checkpointables.items() if isinstance(obj, nn.Module))
        check_replicas_agree(modules)
        self._replicas_checked = True

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
        make_dir(self.save_dir, self.path_manager)
        self.wait()
        self._write_file(path, data, None)
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
        make_dir(self.save_dir, self.path_manager)
        path = self._path(f"{name}.safetensors")
        save_safetensors_weights(state, path)
        logger.info("Saved the model weights to %s", path)
        return path

    def save_file(self, path: Union[str, "os.PathLike[str]"], **extra: Any) -> Optional[str]:
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
        self._check_replicas_once()
        return self._write(os.fspath(path), extra, sharded, asynchronous=False, then=None)

    def _write(
        self,
        path: str,
        extra: Dict[str, Any],
        sharded: bool,
        *,
        asynchronous: bool,
        then: Optional[Callable[[], object]],
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

        make_dir(directory, self.path_manager)
        if not self._noted_non_local and not is_local_path(path, self.path_manager):
            self._noted_non_local = True
            logger.info(
                "Checkpoints in '%s' are not on the local filesystem: they are written in place, so whether "
                "a crash mid-write can leave a partial file depends on the storage backend.",
                directory,
            )
        self.wait()  # at most one save in flight, and files appear in the order they were saved
        if not asynchronous:
            self._write_file(path, data, then)
            return path
        self._background.submit(path, self._write_file, path, self._background.snapshot(data), then)
        return path

    def _write_file(self, path: str, data: Dict[str, Any], then: Optional[Callable[[], object]]) -> None:
        write_checkpoint_file(path, data, self.path_manager)
        logger.info("Saved checkpoint to %s", path)
        if then is not None:
            then()

    def _write_dcp(
        self, name: str, extra: Dict[str, Any], *, asynchronous: bool, then: Optional[Callable[[], object]]
    ) -> Optional[str]:
        """Every rank writes its shards of ``{name}.dcp`` (see
        :mod:`treadle.checkpoint.sharded`); the main process publishes it."""
        final = self._path(name + DCP_SUFFIX)
        partial = self._path(partial_name(name))
        if not is_local_path(self.save_dir, self.path_manager):
            raise CheckpointError(
                f"The 'dcp' checkpoint format writes to a local or mounted filesystem; '{self.save_dir}' is not one. "
                "Use train.checkpointer.format=file."
            )
        state = dcp_format.sharded_state(self.model, self.checkpointables, extra, what=f"checkpoint '{final}'")
        self.wait()  # at most one save in flight; its directory is published before this one starts
        if self.save_to_disk:
            make_dir(self.save_dir, self.path_manager)
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
        future = self._dcp_async.start(state, partial)
        self._background.submit(final, self._finish_async_dcp, future, partial, final, then)
        return final if self.save_to_disk else None

    def _finish_async_dcp(
        self, future: "Future[Any]", partial: str, final: str, then: Optional[Callable[[], object]]
    ) -> None:
        dcp_format.finish_async_save(future, final)
        if self.save_to_disk:
            self._publish(partial, final, then)

    def _publish(self, partial: str, final: str, then: Optional[Callable[[], object]]) -> None:
        dcp_format.publish_checkpoint(partial, final)
        logger.info("Saved checkpoint to %s", final)
        if then is not None:
            then()

    # ------------------------------------------------------------------ background saves
    @property
    def in_flight(self) -> bool:
        """Whether an asynchronous save is still being written."""
        return self._background.in_flight

    @property
    def failed(self) -> Optional[CheckpointError]:
        """The failure of a finished asynchronous save, or ``None``: the error
        :meth:`wait` and :meth:`raise_if_failed` would raise (asking does not
        raise it, nor clear it)."""
        return self._background.failed

    @property
    def saving(self) -> bool:
        """Same as :attr:`in_flight` (its earlier name)."""
        return self._background.in_flight

    def wait(self) -> None:
        """Waits for the asynchronous save in flight, if any.

        Raises:
            CheckpointError: that save failed; its file and ``last_checkpoint``
                were not written (the previous checkpoint is the resume point).
        """
        self._background.wait()

    def raise_if_failed(self) -> None:
        """Raises the failure of a finished asynchronous save, without waiting
        for one still in flight (cheap enough to call every iteration)."""
        self._background.raise_if_failed()

    def tag_last_checkpoint(self, filename: str) -> None:
        """Points ``last_checkpoint`` at ``filename`` (a name inside ``save_dir``), atomically."""
        if self.save_to_disk:
            self.folder.write_pointer(filename)

    # ------------------------------------------------------------------ load
    def load(
        self,
        path: Union[str, "os.PathLike[str]"],
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
        path, matching_heuristics = _split_query(os.fspath(path), matching_heuristics)
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
        self._refuse_a_folder(path)
        checkpoint = load_checkpoint_file(path, self.path_manager)
        return self._restore(checkpoint, path, names, strict=strict, matching_heuristics=matching_heuristics)

    def check_file(self, path: str) -> None:
        """Refuses, without reading it, a ``path`` that :meth:`load` cannot
        load: missing, unreadable, or a folder that is no checkpoint (a run
        folder is answered with its last checkpoint's file). For a caller
        that checks before it writes anything (a resume by path).

        Raises:
            CheckpointError: naming ``path`` and what to give instead.
        """
        if not (is_safetensors_source(path) or self._is_dcp(path)):
            self._refuse_a_folder(path)
        check_checkpoint_file(path, self.path_manager)

    def _refuse_a_folder(self, path: str) -> None:
        # torch would say "IsADirectoryError", read as a truncated file. (A remote
        # path's handler may not answer isdir: the load then says what it says.)
        if is_local_path(path, self.path_manager) and os.path.isdir(path):
            raise CheckpointError(folder_given_for_a_file(path, self.path_manager))

    def _is_dcp(self, path: str) -> bool:
        if is_safetensors_source(path):
            return False
        return path.rstrip("/").endswith(DCP_SUFFIX) or (
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
            if hasattr(e, "add_note"):  # Python >= 3.11
                e.add_note(f"treadle: raised while loading '{name}' from checkpoint '{path}'")
            raise

    def _check_optimizer_fits(self, name: str, state: Any, path: str) -> None:
        """Refuses an optimizer state whose parameter groups differ from the
        optimizer's in number or size (torch's own error names no file)."""
        obj = self.checkpointables[name]
        if not isinstance(obj, torch.optim.Optimizer) or not isinstance(state, dict) or is_fsdp_model(
            unwrap_model(self.model)
        ):
            return
        saved = [len(group.get("params", ())) for group in state.get("param_groups", ())]
        here = [len(group["params"]) for group in obj.param_groups]
        if saved != here:
            raise CheckpointError(
                f"The optimizer state ('{name}') in '{path}' has {len(saved)} parameter group(s) of {saved} "
                f"parameters, and this run's optimizer {len(here)} of {here}: it was saved by another optimizer "
                "setup (another trainer, or other parameter groups)."
            )

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
        rest: Dict[str, Any] = {}
        if container is not None:
            rest = dict(checkpoint)
            rest.pop(container)
        for name in names:  # before anything is loaded: a refused file changes nothing
            self._check_optimizer_fits(name, rest.get(name), path)
        if matching_heuristics:
            state = align_by_suffix(unwrap_model(self.model).state_dict().keys(), state)
        report = load_model_state(self.model, state, source=f"checkpoint '{path}'", strict=strict)
        _log_load_report(report, path)
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
            folder = self.folder
            pointed, problem = folder.read_pointer()
            if pointed and not self.path_manager.exists(self._path(pointed)):
                pointed, problem = "", f"it names {pointed}, which does not exist in '{self.save_dir}'"
            # The pointer's file first: it is the last one the run saved.
            names = ([pointed] if pointed else []) + [n for n in folder.resume_files(self.RESUME_PATTERN) if n != pointed]
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
            except ResumeRefusedError:
                raise  # its message says what to do with this checkpoint
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
        newer = [n for n in unreadable if is_newer(n, name, order)]
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
        return self.folder.prune(prefix, keep_last=keep_last, protect=protect, only=only, writing=self._background.writing)

    def numbered_files(self, prefix: str = "model_", *, up_to: Optional[int] = None) -> List[str]:
        """Names of the checkpoints ``{prefix}{number}.pth`` (or ``.dcp``) in
        ``save_dir`` (numbers up to ``up_to`` when given), in the order of their numbers."""
        return self.folder.numbered_files(prefix, up_to=up_to)


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
