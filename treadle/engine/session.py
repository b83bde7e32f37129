"""A run's session in its output folder, the same for both trainers.

``DefaultTrainer`` (from a config) and the plain ``Trainer`` (from objects)
differ in how they are given a run, never in how the run meets its folder.
A :class:`RunSession` does that, in this order:

1. **open**: load what the run starts from and claim the folder
   (:class:`~treadle.utils.run_folder.RunFolder`: one job at a time, no fresh
   start over an earlier run unless it is moved aside). Both load first and
   claim after, so that a broken or unfitting file is named as itself and a
   refused start changes nothing in the folder (a killed job's lock
   included): a fresh start its initial weights; a resume, once no live job
   holds the folder, the newest readable checkpoint (or the one named),
   keeping the hyperparameters the trainer was given over the checkpoint's,
   a warning naming each (:mod:`treadle.engine.resume`);
2. **start**: once there is training to do, write what the job left for
   this moment (``config.yaml``, see :mod:`treadle.utils.run_start`) and start
   the log files, which hold every record logged since the job began;
3. **release** the folder when training ends, however it ends; what the
   console kept for a log file (a run without a folder keeps its warnings
   and errors there) ends with the run, so that the next run's ``log.txt``
   holds that run only.

The writers the run's ``PeriodicWriter`` flushes come from one assembly,
:func:`treadle.events.get_default_writers`, which both trainers call.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

from treadle.checkpoint import Checkpointer, check_checkpoint_file
from treadle.hooks import LRScheduler
from treadle.utils.logger import forget_kept_warnings, start_log_files
from treadle.utils.run_folder import RunFolder, check_on_main_process, claim_on_main_process
from treadle.utils.run_start import training_starts

from .resume import restore_hyperparameters, take_hyperparameters

__all__ = ["RunSession"]

#: ``train(resume=...)``: continue from the folder's last checkpoint (True),
#: from a checkpoint file (a path), or start fresh (False).
Resume = Union[bool, str, "os.PathLike[str]"]


class RunSession:
    """Opens, starts and releases one run (see the module docstring).

    Args:
        output_dir: the run's folder; ``None``: nothing is claimed or written
            (the plain ``Trainer`` without ``output_dir``).
        checkpointer: what resumes and loads read with (it may have no folder
            of its own: a checkpoint is then loaded by path only).
        folder_names, subdirs: the folder's run files and subfolders
            (:class:`RunFolder`'s ``names`` and ``subdirs``).
        write_config: writes the run's ``config.yaml`` when training starts
            (``DefaultTrainer``); ``None``: no config.
    """

    def __init__(
        self,
        output_dir: Optional[str],
        checkpointer: Checkpointer,
        *,
        folder_names: Optional[Dict[str, str]] = None,
        subdirs: Sequence[str] = (),
        write_config: Optional[Callable[[], Any]] = None,
    ) -> None:
        self.folder = RunFolder(output_dir, names=folder_names, subdirs=subdirs) if output_dir else None
        self.checkpointer = checkpointer
        self._write_config = write_config
        self._claimed = False

    def claim(self, *, resume: bool, move_aside: bool = False) -> None:
        """Claims the folder (once; again after :meth:`release`).

        Raises:
            RunFolderError: another job holds it, or a fresh start finds an
                earlier run there and ``move_aside`` is not set.
        """
        if self._claimed or self.folder is None:
            return
        claim_on_main_process(self.folder, resume=resume, move_aside=move_aside)
        self._claimed = True

    def release(self) -> None:
        """Releases the folder claimed by :meth:`claim` (a no-op without
        one), and ends the run's records kept for a log file."""
        if self.folder is not None:
            self.folder.release()
        self._claimed = False
        for name in ("treadle", "fvcore"):
            forget_kept_warnings(name)

    def open(self, trainer: Any, *, resume: Resume = False, init: str = "", move_aside: bool = False) -> int:
        """Claims the folder and loads what ``trainer`` starts from; returns
        the iteration training starts at.

        ``resume=True`` continues from the folder's newest readable checkpoint
        (with none, a warning and a fresh start); a path continues from that
        checkpoint; otherwise ``init``'s weights (if any) are loaded and
        training starts at 0. The folder is released again when loading fails.

        Raises:
            RunFolderError: see :meth:`claim`.
            CheckpointError: ``init`` or the checkpoint to resume cannot be read.
        """
        by_path = isinstance(resume, (str, os.PathLike))
        if not by_path and not (resume and self.checkpointer.has_checkpoint()):
            if init:
                check_checkpoint_file(init)
            # Loaded before the claim: a broken init file is named as itself,
            # also where the claim would refuse a used folder.
            self.checkpointer.resume_or_load(init, resume=bool(resume))
            self.claim(resume=bool(resume), move_aside=move_aside)
            return 0
        if by_path:
            self.checkpointer.check_file(os.fspath(resume))  # type: ignore[arg-type]  # a folder is named, not loaded
        # Loaded before the claim too, once no live job holds the folder: a
        # checkpoint refused (another model, other parameter groups) changes
        # nothing there, the lock a killed job left included.
        if self.folder is not None and not self._claimed:
            check_on_main_process(self.folder, resume=True)
        snapshot = take_hyperparameters(trainer.optimizer, trainer.hooks)
        if by_path:
            extra = self.checkpointer.load(os.fspath(resume), strict=True)  # type: ignore[arg-type]
        else:
            extra = self.checkpointer.resume_or_load(init, resume=True)
        self.claim(resume=True, move_aside=move_aside)
        if "iteration" not in extra:
            return 0
        restore_hyperparameters(snapshot, trainer.optimizer, trainer.hooks)
        return int(extra["iteration"]) + 1

    def load_file(self, trainer: Any, path: Union[str, "os.PathLike[str]"], *, optimizer: bool = True,
                  scheduler: bool = True) -> Dict[str, Any]:
        """Loads the weights of the checkpoint ``path`` into the trainer's model,
        and its optimizer's and learning-rate schedule's states unless told
        not to, without continuing its run (no iteration, data position or
        random states). Returns what else the file holds."""
        rest = self.checkpointer.load(os.fspath(path), checkpointables=["optimizer"] if optimizer else [])
        saved_hooks = (rest.get("trainer") or {}).get("hooks", {})
        if scheduler:
            for key, hook in trainer.hook_state_keys().items():
                if isinstance(hook, LRScheduler) and key in saved_hooks:
                    hook.load_state_dict(saved_hooks[key])
        return rest

    def start(self) -> None:
        """Writes what the job left for the start of training (``config.yaml``)
        and starts the log files."""
        done = training_starts()  # what default_setup left, if it ran
        if self._write_config is not None and "config" not in done:
            self._write_config()
        if "logs" not in done:
            start_log_files()
            start_log_files("fvcore")

    @contextlib.contextmanager
    def running(self, work: bool) -> Iterator[None]:
        """Around training: :meth:`start` when there is ``work`` (a finished
        run resumed writes nothing: its config and logs stay as they are),
        :meth:`release` at the end, however training ends."""
        try:
            if work:
                self.start()
            yield
        finally:
            self.release()
