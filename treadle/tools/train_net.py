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

from treadle.checkpoint import CheckpointError, Checkpointer
from treadle.config import ConfigError, LazyConfig
from treadle.engine.defaults import DefaultTrainer, default_argument_parser, default_setup
from treadle.engine.launch import launch
from treadle.events import NonFiniteLossError

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


def _load_eval_weights(cfg: DictConfig, model: Any, resume: bool) -> str:
    checkpointer = Checkpointer(model, cfg.train.output_dir)
    if resume and checkpointer.has_checkpoint():
        path = checkpointer.get_checkpoint_file()
    elif cfg.train.get("init_checkpoint"):
        path = cfg.train.init_checkpoint
    else:
        raise JobError(
            "--eval-only needs weights: set train.init_checkpoint=PATH, or add --resume to evaluate the "
            f"last checkpoint in {cfg.train.output_dir}"
        )
    checkpointer.load(path, checkpointables=[])
    return path


def main(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The job of one process: set up, then train (or evaluate)."""
    cfg = load_config(args)
    default_setup(cfg, args)
    if args.eval_only:
        model = DefaultTrainer.build_model(cfg)
        path = _load_eval_weights(cfg, model, args.resume)
        results = DefaultTrainer.test(cfg, model)
        logger.info("Evaluation of %s: %s", path, results)
        return results
    trainer = DefaultTrainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


def cli(argv: Optional[List[str]] = None) -> int:
    """Parses the command line, checks the config, launches the job; returns the exit status."""
    parser = default_argument_parser()
    args = parser.parse_intermixed_args(argv)
    try:
        # Checked once here, so that a bad file or override fails before any process starts.
        load_config(args)
        launch(
            main,
            args.num_gpus,
            num_machines=args.num_machines,
            machine_rank=args.machine_rank,
            dist_url=args.dist_url,
            args=(args,),
        )
    except _USER_ERRORS as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2 if not isinstance(e, NonFiniteLossError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(cli())
