"""Train or evaluate a model described by a lazy config.

    python tools/train_net.py [--config-file FILE] [--resume] [--eval-only]
                              [--num-gpus N] [key=value ...]

Also installed as the ``treadle-train`` command. Without ``--config-file``
it trains the handwritten digits example (``configs/digits_mlp.py``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig
from torch import nn

from treadle.checkpoint import CheckpointError, Checkpointer
from treadle.config import ConfigError, LazyConfig
from treadle.engine.defaults import DefaultTrainer, default_argument_parser, default_setup
from treadle.engine.launch import launch
from treadle.events import NonFiniteLossError
from treadle.utils import comm

__all__ = ["JobError", "load_config", "main", "cli"]

logger = logging.getLogger("treadle.train_net")


class JobError(RuntimeError):
    """A problem with how the job was asked for (printed without a traceback)."""


# Errors that are the user's input, reported in one line.
_USER_ERRORS = (ConfigError, CheckpointError, JobError, PermissionError, FileNotFoundError, NonFiniteLossError)


def load_config(args: argparse.Namespace) -> DictConfig:
    """The config file with the command line's overrides applied."""
    cfg = LazyConfig.load(args.config_file)
    if not isinstance(cfg, DictConfig) or "train" not in cfg:
        raise ConfigError(f"{args.config_file} has no 'train' section; is it a runnable config?")
    return LazyConfig.apply_overrides(cfg, args.opts)


def _eval_weights(cfg: DictConfig, resume: bool) -> str:
    """The checkpoint ``--eval-only`` evaluates: the last one of the run with
    ``--resume``, else ``train.init_checkpoint``.

    Raises:
        JobError: neither is there.
    """
    # Finding the file needs no model: the checkpointer only reads its pointer file.
    finder = Checkpointer(nn.Module(), cfg.train.output_dir)
    if resume and finder.has_checkpoint():
        return finder.get_checkpoint_file()
    if cfg.train.get("init_checkpoint"):
        return cfg.train.init_checkpoint
    raise JobError(
        "--eval-only needs weights: set train.init_checkpoint=PATH, or add --resume to evaluate the "
        f"last checkpoint in {cfg.train.output_dir}"
    )


def main(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The job of one process: set up, then train (or evaluate)."""
    cfg = load_config(args)
    # Before default_setup, which writes config.yaml into the run's directory:
    # an evaluation that cannot start must not replace the training run's config.
    weights = _eval_weights(cfg, args.resume) if args.eval_only else None
    default_setup(cfg, args)
    if weights is not None:
        model = DefaultTrainer.build_model(cfg)
        Checkpointer(model, cfg.train.output_dir).load(weights, checkpointables=[])
        results = DefaultTrainer.test(cfg, model)
        logger.info("Evaluation of %s: %s", weights, results)
        return results
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def _exit_status(error: BaseException) -> int:
    return 1 if isinstance(error, NonFiniteLossError) else 2


def _job(args: argparse.Namespace, prog: str) -> Optional[Dict[str, Any]]:
    """:func:`main` in a process of a multi-process job.

    A user error raised in a worker would reach the launcher as a worker's
    traceback; here it becomes the same one-line message (printed once, by
    rank 0) and exit status as in a single process.
    """
    try:
        return main(args)
    except _USER_ERRORS as e:
        if comm.get_world_size() == 1:
            raise  # cli prints it
        if comm.is_main_process():
            print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(_exit_status(e)) from None


def cli(argv: Optional[List[str]] = None) -> int:
    """Parses the command line, checks the config, launches the job; returns the exit status."""
    parser = default_argument_parser()
    args = parser.parse_intermixed_args(argv)
    try:
        # Checked once here, so that a bad file, override or missing weights
        # fail before any process starts.
        cfg = load_config(args)
        if args.eval_only:
            _eval_weights(cfg, args.resume)
        launch(
            _job,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(args, parser.prog),
        )
    except _USER_ERRORS as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return _exit_status(e)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
