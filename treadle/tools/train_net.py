"""Train or evaluate a model described by a lazy config.

    python tools/train_net.py [--config-file FILE] [--resume | --move-aside] [--eval-only]
                              [--num-gpus N] [key=value ...]

Also installed as the ``treadle-train`` command. Without ``--config-file``
it trains the handwritten digits example (``configs/digits_mlp.py``).

A job checks everything it can before it writes a byte into
``train.output_dir``: the config (keys, types, ranges, interpolations, metric
names, device, precision, world size) and the folder (one job at a time; a
fresh start does not overwrite an earlier run), before it prints its
environment; then the objects it builds.
A failure is one line on stderr, ``train_net.py: error: ...``. Exit status:

- 0: trained (or evaluated); also a resumed run that had finished already;
- 1: the run failed while training (a NaN loss, an I/O error, an exception
  in a hook or the step); the traceback is in ``log.txt``;
- 2: the job was asked for wrongly (a bad config or command line, a folder
  in use or holding another run, a missing or unreadable checkpoint); nothing
  was written;
- 75: stopped by SIGTERM/SIGUSR1 after a checkpoint; ``--resume`` continues.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import traceback
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig
from torch import nn

# The other trainers' config nodes (LiBai's graph.enabled), registered into the config's seam.
import treadle.compat  # noqa: F401
from treadle.checkpoint import CheckpointError, Checkpointer, check_checkpoint_file
from treadle.checkpoint.weights import read_weights_file
from treadle.config import ConfigError, LazyConfig, get_config_file
from treadle.config.nodes import child_node, raw_value
from treadle.config.override_parser import parse_override
from treadle.config.top_nodes import step_kind
from treadle.config.train_keys import train_setting
from treadle.engine.defaults import DefaultTrainer, default_argument_parser, default_setup, save_run_config
from treadle.engine.launch import launch
from treadle.config.validation import check_run_config, check_world_size
from treadle.events import NonFiniteLossError
from treadle.hooks import PREEMPTED_EXIT_CODE
from treadle.utils import comm
from treadle.utils.atomic import atomic_write
from treadle.utils.file_io import PathManager
from treadle.utils.logger import (
    is_set_up,
    note_warnings_shown,
    one_line_error,
    setup_logger,
    show_warnings_once,
    shown_warnings,
    start_log_files,
)
from treadle.utils.run_folder import (
    RunFolder,
    RunFolderError,
    RunFolderUsedError,
    check_on_main_process,
    check_output_dir,
)
from treadle.utils.run_start import forget_pending_starts

__all__ = ["JobError", "config_path", "load_config", "check_job", "main", "cli"]

logger = logging.getLogger("treadle.train_net")


class JobError(RuntimeError):
    """A problem with how the job was asked for (printed without a traceback)."""


class _BuildError(JobError):
    """An object of the config could not be built; the message names it."""


# Errors that are the user's input, reported in one line with exit status 2.
_USER_ERRORS = (ConfigError, CheckpointError, JobError, RunFolderError, PermissionError, FileNotFoundError)
_EXIT_USER_ERROR = 2
_EXIT_RUN_FAILED = 1
_EXIT_INTERRUPTED = 130  # the shell's status for SIGINT


def config_path(name: str) -> str:
    """``name`` if it is a file; else the shipped config of that name
    (``configs/charlm_transformer.py`` or ``charlm_transformer.py`` from any
    directory, after a plain ``pip install``).

    Raises:
        ConfigError: neither; the message suggests the closest shipped names.
    """
    if PathManager.isfile(name) or "://" in name:
        return name
    try:
        shipped = get_config_file(name)
    except ConfigError as e:
        raise ConfigError(f"Config file not found: '{name}'. {e}") from None
    logger.info("Using the shipped config %s", shipped)
    return shipped


def load_config(args: argparse.Namespace) -> DictConfig:
    """The config file with the command line's overrides applied."""
    args.config_file = config_path(args.config_file)
    cfg = LazyConfig.load(args.config_file)
    if not isinstance(cfg, DictConfig) or "train" not in cfg:
        raise ConfigError(f"{args.config_file} has no 'train' section; is it a runnable config?")
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    train = cfg.train
    if isinstance(train, DictConfig):
        for key in ("output_dir", "init_checkpoint"):
            # "train.output_dir=~/runs/x" is not expanded by the shell (the ~ is not a word's start).
            node = child_node(train, key) if key in train else None
            value = raw_value(node) if node is not None else None
            if isinstance(value, str) and value.startswith("~"):
                train[key] = os.path.expanduser(value)
    return cfg


def check_job(cfg: DictConfig, args: argparse.Namespace) -> Optional[str]:
    """Everything that can be checked before any process starts, anything is
    printed or any file is written: the command line, the config, the output
    directory (may this job use it?), and the weights to load; returns the
    weights of ``--eval-only`` (``None`` when training).

    Raises:
        ConfigError, JobError, RunFolderError, CheckpointError: one line each.
    """
    if args.resume and args.move_aside:
        raise JobError("--resume continues the run in train.output_dir and --move-aside starts a new one; give one")
    if args.eval_only and args.move_aside:
        raise JobError("--move-aside starts a new training run; --eval-only trains nothing and writes into OUTPUT_DIR/eval/")
    world_size = check_world_size(args.num_gpus, args.num_machines, args.machine_rank)
    check_run_config(cfg, world_size=world_size, eval_only=args.eval_only)
    if any(parse_override(text).key == "train.step.kind" for text in args.opts):
        step_kind(cfg, kind_given=True)  # its 'eager' is then a choice that a registered node may contradict
    output_dir = train_setting(cfg, "output_dir")
    check_output_dir(output_dir)
    if args.eval_only:
        weights = _eval_weights(cfg, args.resume)
        check_checkpoint_file(weights)
        return weights
    init = train_setting(cfg, "init_checkpoint")
    if init and args.resume and Checkpointer(nn.Module(), output_dir).has_checkpoint():
        # A resume loads the run's own checkpoint; a broken init is said, not
        # refused: a requeued job must not fail on a file it does not read.
        # Read as a fresh start reads it, so that a file that is there but
        # is no checkpoint is said too (once, before anything is built).
        try:
            check_checkpoint_file(init)
            read_weights_file(init.partition("?")[0])
        except CheckpointError as e:
            logger.warning("train.init_checkpoint is not loaded (--resume continues the run's checkpoint), and it "
                           "could not be: %s", e)
        init = ""
    if init:
        check_checkpoint_file(init)  # the weights a fresh start loads
    _check_run_folder(output_dir, args, init)
    return None


def _check_run_folder(output_dir: str, args: argparse.Namespace, init: str) -> None:
    """The folder may take this training job: no other job holds it, and a
    fresh start finds no earlier run there (or moves it aside).

    Checked before anything is printed or built, so that a refused job says
    so in its first line, at once; the folder is claimed when training starts.
    A broken ``init`` (the weights a fresh start loads) is named as itself,
    also in a used folder: it is read before the folder is refused.
    """
    try:
        check_on_main_process(RunFolder(output_dir), resume=args.resume, move_aside=args.move_aside)
    except RunFolderUsedError:
        if init:
            # Read as loading it would (detectron2's "x.pth?matching_heuristics=True" is the file x.pth).
            read_weights_file(init.partition("?")[0])
        raise


def _eval_weights(cfg: DictConfig, resume: bool) -> str:
    """The checkpoint ``--eval-only`` evaluates: the last one of the run with
    ``--resume``, else ``train.init_checkpoint``.

    Raises:
        JobError: neither is there.
    """
    # Finding the file needs no model: the checkpointer only reads its pointer file.
    output_dir = train_setting(cfg, "output_dir")
    finder = Checkpointer(nn.Module(), output_dir)
    latest = finder.latest_checkpoint_file() if resume else ""
    if latest:
        return latest
    init = train_setting(cfg, "init_checkpoint")
    if init:
        return init
    raise JobError(
        "--eval-only needs weights: set train.init_checkpoint=PATH, or add --resume to evaluate the "
        f"last checkpoint in {output_dir}"
    )


def _build(what: str, build: Any) -> Any:
    """``build()``; an error other than a config error becomes a one-line
    :class:`_BuildError` naming ``what`` and, when instantiating a config node
    raised it, the node (its traceback goes to a temporary file named in the line)."""
    try:
        return build()
    except _USER_ERRORS:
        raise
    except Exception as e:
        notes = [n for n in getattr(e, "__notes__", []) if n.startswith("while instantiating")]
        where = f" ({notes[0]})" if notes else ""
        trace = _save_traceback(e)
        raise _BuildError(f"Cannot build {what}: {one_line_error(e)}{where}; traceback in {trace}") from e


def _save_traceback(error: BaseException) -> str:
    """Writes ``error``'s traceback to a new temporary file (not the run's
    folder: nothing is written there before the job is accepted); returns its path."""
    fd, path = tempfile.mkstemp(prefix="treadle-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("".join(traceback.format_exception(error)))
    return path


def _evaluate(cfg: DictConfig, args: argparse.Namespace, weights: str) -> Dict[str, Any]:
    """``--eval-only``: evaluates ``weights``; the results, the config and the
    log go to a new ``OUTPUT_DIR/eval/DATE-TIME/``, never over the run's files."""
    model = _build("the model", lambda: DefaultTrainer.build_model(cfg))
    # The weights to evaluate must be this model's, every key of them.
    output_dir = train_setting(cfg, "output_dir")
    Checkpointer(model, output_dir).load(weights, checkpointables=[], strict=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    eval_dir = comm.broadcast_object(_new_dir(os.path.join(output_dir, "eval", stamp)))
    start_log_files(output=eval_dir)
    start_log_files("fvcore", output=eval_dir)
    save_run_config(cfg, eval_dir)
    results = DefaultTrainer.test(cfg, model)
    logger.info("Evaluation of %s: %s", weights, results)
    if comm.is_main_process():
        record = {"weights": weights, "results": results}
        text = json.dumps(record, indent=2, default=float) + "\n"
        atomic_write(os.path.join(eval_dir, "results.json"), lambda f: f.write(text.encode("utf-8")))
        logger.info("Evaluation results saved to %s", os.path.join(eval_dir, "results.json"))
    return results


def _new_dir(path: str) -> str:
    """Creates ``path`` (or ``path-2``, ``-3``... when taken) on the main process."""
    if not comm.is_main_process():
        return path
    candidate, n = path, 1
    while True:
        try:
            os.makedirs(candidate)
            return candidate
        except FileExistsError:
            n += 1
            candidate = f"{path}-{n}"


def main(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The job of one process: set up, build, claim the folder, then train (or evaluate)."""
    cfg = load_config(args)
    weights = check_job(cfg, args)
    default_setup(cfg, args)
    if weights is not None:
        return _evaluate(cfg, args, weights)
    trainer = _build("the run", lambda: DefaultTrainer(cfg))
    trainer.resume_or_load(resume=args.resume, move_aside=args.move_aside)
    _JobSignals.phase = "training"
    try:
        results = trainer.train()
    except BaseException:
        _JobSignals.phase = "stopping"
        raise
    _JobSignals.phase = "over"
    return results


def _exit_status(error: BaseException) -> int:
    # A failure inside the training loop (it carries where it was raised) is a
    # run that failed, whatever its type: a full disk at a checkpoint, a NaN.
    if getattr(error, "treadle_origin", None):
        return _EXIT_RUN_FAILED
    return _EXIT_USER_ERROR if isinstance(error, _USER_ERRORS) else _EXIT_RUN_FAILED


def _error_line(error: BaseException) -> str:
    """The one line that reports ``error``: the message of an error treadle
    words for users; otherwise the exception's type and first line, where
    it was raised and where its traceback is."""
    origin = getattr(error, "treadle_origin", None)
    if isinstance(error, NonFiniteLossError) or (
        isinstance(error, _USER_ERRORS) and not (isinstance(error, OSError) and error.filename)
    ):
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        text = "; ".join(lines) or type(error).__name__
        # A message of treadle's own says what happened; where is still news.
        return f"{text} (raised by {origin})" if origin and not isinstance(error, NonFiniteLossError) else text
    if isinstance(error, OSError) and error.filename:
        text = f"cannot use '{error.filename}': {error.strerror or error}"
    else:
        text = one_line_error(error)
    details = []
    if origin:
        details.append(f"raised by {origin}")
    log = _log_file()
    if log:
        details.append(f"traceback in {log}")
    return f"{text} ({'; '.join(details)})" if details else text


def _log_file() -> Optional[str]:
    for handler in logging.getLogger("treadle").handlers:
        filename = getattr(handler, "filename", None) or getattr(getattr(handler, "stream", None), "name", None)
        started = getattr(handler, "started", True) and not getattr(handler, "failed", False)
        if isinstance(filename, str) and started and os.path.exists(filename):
            return filename
    return None


class _JobSignals:
    """SIGTERM/SIGUSR1 outside training.

    During training the :class:`~treadle.hooks.PreemptionHandler` owns these
    signals (checkpoint, then exit 75). Before training starts nothing is
    saved and nothing needs to be: the job exits at once with status 75 (retry
    later). While a stopping job finishes (a second signal after a preemption
    checkpoint, say) its status is decided and it is on its way out: the
    signal is noted. After training ended the work is done: the signal is
    noted and the job ends normally. No traceback in any case.
    """

    phase = "starting"  # then "training", "stopping" or "over"
    # Whether this process is the command's own (not cli() called from Python).
    standalone = False

    @classmethod
    def install(cls, standalone: bool = False) -> Dict[int, Any]:
        """Installs the handlers; returns the previous ones."""
        cls.phase = "starting"
        cls.standalone = standalone
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, cls._handle) for sig in (signal.SIGTERM, signal.SIGUSR1)}

    @staticmethod
    def restore(previous: Dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    @classmethod
    def _handle(cls, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if cls.phase == "over":
            logger.info("Received %s after training ended; finishing.", name)
            return
        if cls.phase == "stopping":
            # An exception raised here would land wherever the exit is (a
            # weakref callback of the garbage collector printed "Exception
            # ignored ... SystemExit: 75" with a traceback), and change nothing.
            logger.info("Received %s while the job stops; it is exiting already.", name)
            return
        if cls.phase == "starting" and cls.standalone:
            # os._exit, not SystemExit: raised from a signal handler, an
            # exception lands wherever the job is (inside an import of torch,
            # numpy or a model library), where a half-loaded C extension can
            # abort the process or a bare except swallow it and let the job
            # train on. Before training nothing is written that needs closing:
            # the folder's lock goes with the process, and renames are atomic.
            if comm.is_main_process():
                os.write(2, f"Received {name} before training started; exiting with status {PREEMPTED_EXIT_CODE}.\n".encode())
            os._exit(PREEMPTED_EXIT_CODE)
        logger.warning("Received %s before training started; exiting with status %d.", name, PREEMPTED_EXIT_CODE)
        raise SystemExit(PREEMPTED_EXIT_CODE)


def _job(
    args: argparse.Namespace, prog: str, standalone: bool = False, shown: Sequence[Dict[str, Any]] = ()
) -> Optional[Dict[str, Any]]:
    """:func:`main` in one process of the job, its failures as one line.

    A user error is the same on every rank and printed once, by rank 0. A
    failure while training is printed by each rank that has it (with its
    rank), since a rank failing alone leaves the others waiting. The exit
    status is raised as ``SystemExit`` (the launcher passes it on).
    ``shown``: the warnings the launching process showed while it checked
    the job (a process it started does not show them again).
    """
    previous = _JobSignals.install(standalone)
    single = comm.get_world_size() == 1
    if not is_set_up():
        # A process the launcher started: a console (rank 0's) before the job
        # checks its config again, so that its warnings are shown as in the
        # launching process and reach log.txt (see setup_logger).
        setup_logger(None, distributed_rank=comm.get_rank())
        note_warnings_shown(shown)
    try:
        return main(args)
    except KeyboardInterrupt as e:
        if comm.is_main_process():
            origin = getattr(e, "treadle_origin", None)
            where = f" at {origin}" if origin else ""
            print(f"{prog}: interrupted (Ctrl-C){where}; --resume continues from the last checkpoint", file=sys.stderr, flush=True)
        raise SystemExit(_EXIT_INTERRUPTED) from None
    except Exception as e:
        user_error = isinstance(e, _USER_ERRORS) and not getattr(e, "treadle_origin", None)
        if comm.is_main_process() or not user_error:
            rank = "" if single or user_error else f" (rank {comm.get_rank()})"
            print(f"{prog}: error{rank}: {_error_line(e)}", file=sys.stderr, flush=True)
        raise SystemExit(_exit_status(e)) from None
    finally:
        forget_pending_starts()  # a job that failed before training leaves nothing for the next
        if single and not standalone:
            # In the caller's process (cli() called from Python): give the
            # signals back.
            _JobSignals.restore(previous)
        elif previous:
            # The job's own process (the command's, or a spawned worker's):
            # its status is decided. Python's shutdown puts back the default
            # action of the signals it handles, and a signal then would be a
            # death by signal (143) after a finished run; ignored ones stay
            # ignored.
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)


def cli(argv: Optional[List[str]] = None, *, standalone: bool = False) -> int:
    """Parses the command line, checks the config, launches the job; returns the exit status.

    ``standalone``: this process is the command's own (``treadle-train``,
    ``tools/train_net.py``), which keeps its signal handlers until it exits;
    from Python (``cli([...])`` in a test or a notebook) they are given back.
    """
    parser = default_argument_parser()
    try:
        args = parser.parse_intermixed_args(argv)
    except SystemExit as e:  # a usage error, already printed in one line, or --help
        return int(e.code or 0)
    # The console before anything logs (an override's parse warning): stdout,
    # so that stderr holds only the job's one error line.
    # Under torchrun every process runs this: rank 0's console only.
    rank = os.environ.get("RANK", "0")
    setup_logger(None, distributed_rank=int(rank) if rank.isdigit() else 0)
    show_warnings_once()  # the job is checked here and again in its process(es)
    try:
        # Checked once here, so that a bad file, override or missing weights
        # fail before any process starts; each process checks again.
        cfg = load_config(args)
        check_job(cfg, args)
        launch(
            _job,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(args, parser.prog, standalone, shown_warnings()),
            timeout=datetime.timedelta(seconds=train_setting(cfg, "dist_timeout")),
        )
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted (Ctrl-C)", file=sys.stderr)
        return _EXIT_INTERRUPTED
    except _USER_ERRORS as e:
        # A user error is the same on every rank: under torchrun, rank 0 says it (as _job does).
        if rank == "0":
            print(f"{parser.prog}: error: {_error_line(e)}", file=sys.stderr)
        return _EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(cli())
