"""The config-driven trainer and the set-up every job shares.

``DefaultTrainer(cfg)`` builds the model, optimizer, loaders, schedule, step
object and hooks of a lazy config (``configs/``), as detectron2's does; every
``build_*`` is a method to override in a subclass.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, Dict, List, NoReturn, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

import treadle
from treadle.checkpoint import Checkpointer, unwrap_model
from treadle.config import LazyCall, LazyConfig, get_config_file, instantiate
from treadle.config.top_nodes import check_top_level_nodes, step_kind_and_why
from treadle.config.rules import num_threads as num_threads_rule
from treadle.config.train_keys import train_section, train_setting
from treadle.evaluation import evaluator_loss_fn, inference_on_dataset
from treadle.evaluation.batch import training_forward
from treadle.events import get_default_writers
from treadle.events.tracking import flatten_params
from treadle.hooks import HookBase
from treadle.utils import comm
from treadle.utils.device import resolve_device
from treadle.utils.env import collect_env_info, import_fvcore_nn, seed_all_rng
from treadle.utils.threads import apply_num_threads
from treadle.utils.atomic import atomic_write
from treadle.utils.file_io import PathManager, describe_os_error
from treadle.utils.logger import setup_logger, start_log_files
from treadle.utils.run_folder import check_output_dir
from treadle.utils.run_start import when_training_starts

from treadle.solver import trainable_parameters

from .build import build_step, loader_epoch_length
from .default_hooks import default_hooks
from .data_parallel import create_ddp_model, wrap_model
from .session import RunSession
from treadle.config.validation import check_watched_metric, enabled_trackers
from .steps import StepBase
from .train_loop import TrainerBase

__all__ = [
    "ArgumentParser",
    "default_argument_parser",
    "default_setup",
    "default_config_file",
    "save_run_config",
    "DefaultTrainer",
    # Where detectron2 has it (detectron2.engine.defaults.create_ddp_model).
    "create_ddp_model",
]

logger = logging.getLogger(__name__)


def default_config_file() -> str:
    """The config ``tools/train_net.py`` runs without ``--config-file``: the
    digits example, shipped inside the package (found installed too)."""
    return get_config_file("digits_mlp.py")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line on stderr
    (``prog: error: ...; see --help``, exit status 2) instead of the usage
    block and the error, and which takes no abbreviated options: ``--resum``
    is an error, not ``--resume``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see --help\n")


def default_argument_parser(epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line of treadle jobs, detectron2's: options and ``key=value`` overrides.

    Parse with ``parser.parse_intermixed_args()`` to accept options after
    overrides too (``train.max_iter=500 --resume``). Options are never
    abbreviated, and a usage error is one line.
    """
    parser = ArgumentParser(
        epilog=epilog
        or (
            "Examples:\n"
            "  python tools/train_net.py                                  # the digits example\n"
            "  python tools/train_net.py --config-file configs/charlm_transformer.py train.max_iter=200\n"
            "  python tools/train_net.py --resume                         # continue the last run\n"
            "  python tools/train_net.py --eval-only train.init_checkpoint=output/digits_mlp/model_final.pth\n"
            "  python tools/train_net.py --num-gpus 2                     # 2 processes (gloo on CPU)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-file", default=default_config_file(), metavar="FILE", help="path to a config file")
    parser.add_argument("--version", action="version", version=f"treadle {treadle.__version__}")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint in train.output_dir (a fresh start, with a warning, if there is none)",
    )
    parser.add_argument(
        "--move-aside",
        action="store_true",
        help="start fresh in a train.output_dir that holds an earlier run, after renaming that run's folder "
        "to OUTPUT_DIR.old-DATE-TIME (nothing is deleted)",
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate train.init_checkpoint (or, with --resume, the last checkpoint) and exit; results go to "
        "OUTPUT_DIR/eval/DATE-TIME/",
    )
    parser.add_argument("--num-gpus", type=int, default=1, help="processes per machine (one per GPU; gloo on CPU)")
    parser.add_argument("--num-machines", type=int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=int, default=0, help="the rank of this machine (unique per machine)")
    parser.add_argument(
        "--dist-url",
        default="auto",
        help="initialization URL of torch.distributed, e.g. tcp://host:port; 'auto' picks a free local port "
        "(one machine only)",
    )
    parser.add_argument(
        "opts",
        nargs="*",
        default=[],
        help="config overrides, key=value (e.g. train.max_iter=500 optimizer.lr=0.01); +key=value adds a key",
    )
    return parser


def default_setup(cfg: DictConfig, args: Optional[argparse.Namespace] = None) -> None:
    """What every job does first: logging, environment report, seeding.

    Nothing is written to ``cfg.train.output_dir`` here: a job writes into its
    folder only once its inputs are checked and the folder is claimed (see
    ``docs/checkpoints.md``), which ``DefaultTrainer`` does when training
    starts (``resume_or_load`` or ``train``).

    - ``cfg.train.output_dir`` is checked to be writable (a one-line
      :class:`~treadle.utils.run_folder.RunFolderError` if not);
    - logging: a colored console on the main process; ``log.txt`` (and
      ``log.txt.rank{N}`` on other ranks) in the output directory, kept in
      memory until the folder is claimed, then written from the first line;
    - torch's CPU threads are set by ``train.num_threads`` (``"auto"``: one
      on the CPU; ``OMP_NUM_THREADS``, when set, wins; see
      :mod:`treadle.utils.threads`): this process is the job's own;
    - an environment table (python, torch, CUDA, devices, the CPU threads and
      why) and the command line are logged;
    - python, numpy and torch are seeded with ``train.seed + rank``; a
      negative seed picks one, logs it, and writes it back to ``cfg.train.seed``.

    ``config.yaml`` and ``log.txt`` are written when training starts
    (``TrainerBase.train`` or ``DefaultTrainer.train``; see
    :mod:`treadle.utils.run_start`).
    """
    rank = comm.get_rank()
    output_dir = train_setting(cfg, "output_dir")
    if output_dir:
        check_output_dir(output_dir)
    setup_logger(output_dir or None, distributed_rank=rank, defer_file=True)
    setup_logger(output_dir or None, distributed_rank=rank, name="fvcore", defer_file=True)
    logger.info("Rank of current process: %d. World size: %d", rank, comm.get_world_size())
    num_threads = train_setting(cfg, "num_threads")
    num_threads_rule("train.num_threads", num_threads)  # also where check_run_config has not run
    threads = apply_num_threads(num_threads, train_setting(cfg, "device"), name="train.num_threads")
    logger.info("Environment info:\n%s", collect_env_info(threads.describe()))
    if args is not None:
        # detectron2's tests pass a dict; the command line passes a Namespace.
        logger.info("Command line arguments: %s", vars(args) if hasattr(args, "__dict__") else args)
    seed = train_setting(cfg, "seed")
    if seed is None or seed < 0:
        seed = comm.broadcast_object(seed_all_rng(None))
    # Each rank draws its own dropout masks and augmentations.
    seed_all_rng(int(seed) + rank)
    OmegaConf.update(cfg, "train.seed", int(seed), force_add=True)
    if torch.cuda.is_available():
        torch.backends.cudnn.benchmark = bool(train_setting(cfg, "cudnn_benchmark"))
    # Written when training starts (TrainerBase.train), not now: see treadle.utils.run_start.
    when_training_starts("config", lambda: save_run_config(cfg, output_dir))
    when_training_starts("logs", _start_logs)


def _start_logs() -> None:
    start_log_files()
    start_log_files("fvcore")


def save_run_config(cfg: DictConfig, output_dir: str) -> Optional[str]:
    """Writes the resolved config to ``output_dir/config.yaml`` (atomically, main
    process only) and returns its path.

    Raises:
        OSError: the write failed (a full disk), with ``config.yaml`` as its
            ``filename``; a previous ``config.yaml`` is untouched.
    """
    if not comm.is_main_process() or not output_dir:
        return None
    path = os.path.join(output_dir, "config.yaml")
    text = LazyConfig.to_yaml(cfg)
    PathManager.mkdirs(output_dir)
    # Atomic: a resume rewrites the config of a run that has files to lose.
    try:
        atomic_write(path, lambda f: f.write(text.encode("utf-8")))
    except OSError as e:
        # A failed write or fsync names no file, a failed rename the temporary
        # one: the error names config.yaml (one line in tools/train_net.py).
        raise OSError(e.errno, describe_os_error(e), path) from e
    logger.info("Full config saved to %s", path)
    return path


class DefaultTrainer(TrainerBase):
    """A trainer built from a lazy config, with detectron2's conventions.

    The config has the top-level keys ``model``, ``optimizer``,
    ``lr_multiplier``, ``dataloader`` (``train``, ``test``, ``evaluator``) and
    ``train`` (see ``configs/common/train.py`` for every key of ``train``).

    ::

        trainer = DefaultTrainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        trainer.train()

    Subclass and override ``build_model``, ``build_optimizer``,
    ``build_train_loader``, ``build_test_loader``, ``build_evaluator``,
    ``build_lr_scheduler``, ``build_step`` or ``build_hooks``.

    Default hooks, in order (the plain ``Trainer``'s list, from
    :func:`~treadle.engine.default_hooks.default_hooks`; see
    ``docs/defaults.md`` for why this order): ``IterationTimer``,
    ``LRScheduler`` (``LRMonitor`` without ``lr_multiplier``), ``EMA``
    (``train.ema.enabled``), ``EvalHook`` (``train.eval_period``),
    ``BestCheckpointer`` (``train.best_checkpointer.metric``),
    ``EarlyStopping`` (``train.early_stopping.metric``),
    ``PeriodicCheckpointer``, ``PreemptionHandler``
    (``train.handle_preemption``), ``PeriodicWriter``, then ``RunSummary`` last.
    """

    def __init__(self, cfg: DictConfig) -> None:
        if type(self) is DefaultTrainer:
            # It reads these nodes and no other: one it does not read would be
            # silently unused (another trainer's node whose layer is not
            # imported, LiBai's graph). A subclass's builders may read more.
            check_top_level_nodes(cfg)
        self.cfg = cfg
        self.device = resolve_device(train_setting(cfg, "device"))
        model = self.build_model(cfg, device=self.device)
        self.model = self.wrap_model(cfg, model)
        self.optimizer = self.build_optimizer(cfg, unwrap_model(self.model))
        self.train_loader = self.build_train_loader(cfg)
        step = self.build_step(cfg, self.model, self.train_loader, self.optimizer)
        super().__init__(step, nonfinite_check=train_setting(cfg, "nonfinite_check"))
        self.max_iter = int(train_setting(cfg, "max_iter"))
        self.epoch_length = loader_epoch_length(self.train_loader, int(train_setting(cfg, "step.grad_accum_steps")))
        self.start_iter = 0
        output_dir = train_setting(cfg, "output_dir")
        self.checkpointer = Checkpointer(
            unwrap_model(self.model),
            output_dir,
            format=train_setting(cfg, "checkpointer.format"),
            optimizer=self.optimizer,
            trainer=self,
        )
        self.session = RunSession(output_dir, self.checkpointer, write_config=lambda: save_run_config(cfg, output_dir))
        self._last_eval_results: Optional[Dict[str, Any]] = None
        self._check_evaluation(cfg)
        # The schedule, for LRScheduler() without arguments (LiBai's build_hooks).
        self.scheduler = self.build_lr_scheduler(cfg, self.optimizer)
        self.register_hooks(self.build_hooks())

    # ------------------------------------------------------------------ builders
    @classmethod
    def build_model(cls, cfg: DictConfig, device: Optional[torch.device] = None) -> nn.Module:
        """Instantiates ``cfg.model``, moves it to the device and logs a parameter-count table."""
        parameter_count_table = import_fvcore_nn().parameter_count_table

        model = instantiate(cfg.model)
        if not isinstance(model, nn.Module):
            raise TypeError(f"cfg.model must build a torch.nn.Module, got {type(model).__name__}")
        model.to(device if device is not None else resolve_device(train_setting(cfg, "device")))
        logger.info("Model:\n%s", model)
        logger.info("Parameters:\n%s", parameter_count_table(model, max_depth=2))
        return model

    def wrap_model(self, cfg: DictConfig, model: nn.Module) -> nn.Module:
        """Wraps the model for data-parallel training when the world size is above one.

        ``cfg.train.ddp.kind`` picks how: ``"ddp"`` (the default) wraps it in
        ``DistributedDataParallel`` with the other keys of ``train.ddp`` as
        options (see :func:`~treadle.engine.data_parallel.create_ddp_model`);
        ``"fsdp"`` shards it with FSDP2 (see
        :func:`~treadle.engine.data_parallel.create_fsdp_model`, whose options are
        ``reshard_after_forward``, ``param_dtype``, ``reduce_dtype`` and
        ``sync_module_states``). An option of the other kind set away from
        its default is an error, as are EMA with ``"fsdp"`` (its averaged copy
        is not sharded) and an unknown kind.
        """
        options = train_section(cfg, "ddp")
        kind = options.pop("kind")
        if kind == "fsdp" and train_setting(cfg, "ema.enabled"):
            raise ValueError(
                "train.ema.enabled=True is not supported with train.ddp.kind='fsdp': the EMA hook keeps an "
                "unsharded copy of the weights. Use kind='ddp', or disable EMA."
            )
        return wrap_model(model, kind, setting="train.ddp.kind", **options)

    @classmethod
    def build_optimizer(cls, cfg: DictConfig, model: nn.Module) -> torch.optim.Optimizer:
        """Instantiates ``cfg.optimizer``; its ``params`` node receives ``model``
        (as detectron2's ``get_default_optimizer_params``), or the model's
        parameters are used when ``params`` is absent."""
        node = cfg.optimizer.copy()  # the model must not be written into the user's config
        params = node.get("params")
        if params is None:
            node.params = LazyCall(trainable_parameters)(model=model)
        elif isinstance(params, DictConfig) and "_target_" in params:
            node.params.model = model
        optimizer = instantiate(node)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"cfg.optimizer must build a torch.optim.Optimizer, got {type(optimizer).__name__}")
        return optimizer

    @classmethod
    def build_train_loader(cls, cfg: DictConfig) -> Any:
        loader_cfg = cfg.dataloader.train
        if "seed" in loader_cfg and loader_cfg.seed is None:
            loader_cfg = OmegaConf.merge(loader_cfg, {"seed": int(train_setting(cfg, "seed") or 0)})
        return instantiate(loader_cfg)

    @classmethod
    def build_test_loader(cls, cfg: DictConfig) -> Any:
        return instantiate(cfg.dataloader.test)

    @classmethod
    def build_evaluator(cls, cfg: DictConfig) -> Any:
        return instantiate(cfg.dataloader.evaluator) if "evaluator" in cfg.dataloader else None

    @classmethod
    def build_lr_scheduler(cls, cfg: DictConfig, optimizer: torch.optim.Optimizer) -> Any:
        """The ``LRScheduler`` hook's scheduler from ``cfg.lr_multiplier`` (a
        ``ParamScheduler``, a torch scheduler factory taking the optimizer, or None)."""
        if cfg.get("lr_multiplier") is None:
            return None
        node = cfg.lr_multiplier
        if "optimizer" in node:
            node = OmegaConf.merge(node, {})
            node.optimizer = optimizer
        return instantiate(node)

    def build_step(self, cfg: DictConfig, model: nn.Module, data_loader: Any, optimizer: torch.optim.Optimizer) -> StepBase:
        """The step object of ``cfg.train.step``: ``kind`` eager or compiled
        (or a registered node's choice, :func:`~treadle.config.top_nodes.step_kind`),
        with ``precision``, ``grad_accum_steps``, ``clip_grad_norm`` or
        ``clip_grad_value``, ``loss_fn`` and ``compile`` options; or a node with ``_target_``, a
        user's ``StepBase`` class called with ``model``, ``data_loader`` and
        ``optimizer`` plus its own arguments (a research loop)."""
        kind, why = step_kind_and_why(cfg)  # train.step.kind, or a registered node's; a contradiction is refused
        step_cfg = cfg.train.get("step")
        if isinstance(step_cfg, DictConfig) and "_target_" in step_cfg:
            node = OmegaConf.merge(step_cfg, {})
            node.model, node.data_loader, node.optimizer = model, data_loader, optimizer
            step = instantiate(node)
            if not isinstance(step, StepBase):
                raise TypeError(f"cfg.train.step built a {type(step).__name__}, not a StepBase")
            return step
        options = instantiate(train_section(cfg, "step"))
        options.pop("kind")
        if why is not None:
            logger.info(why)
        compile_options = options.pop("compile")
        return build_step(kind, model, data_loader, optimizer, compile_options=compile_options, **options)

    def build_writers(self) -> List[Any]:
        """Console, ``metrics.json``, TensorBoard and the trackers ``train.writers``
        turns on, on the main process; none elsewhere
        (:func:`~treadle.events.get_default_writers`, the plain ``Trainer``'s assembly too)."""
        return get_default_writers(
            train_setting(self.cfg, "output_dir"), self.max_iter, samples_per_iter=self._samples_per_iter(),
            trackers=self._tracker_options(),
        )

    def _tracker_options(self) -> Dict[str, Dict[str, Any]]:
        """Each tracker ``train.writers`` turns on, with its writer's options."""
        trackers = enabled_trackers(self.cfg)
        if not trackers or not comm.is_main_process():
            return {}
        output_dir = train_setting(self.cfg, "output_dir")
        params = flatten_params(self.cfg)
        options: Dict[str, Dict[str, Any]] = {}
        if "mlflow" in trackers:
            mlflow = train_section(self.cfg, "writers.mlflow")
            options["mlflow"] = dict(
                tracking_uri=mlflow["tracking_uri"], experiment_name=mlflow["experiment_name"],
                run_name=mlflow["run_name"], tags=dict(mlflow["tags"] or {}), params=params,
                log_model=os.path.join(output_dir, "model_final.pth") if mlflow["log_model"] else None,
            )
        if "wandb" in trackers:
            wandb = train_section(self.cfg, "writers.wandb")
            options["wandb"] = dict(
                project=wandb["project"], name=wandb["name"], mode=wandb["mode"], dir=output_dir,
                entity=wandb["entity"], tags=list(wandb["tags"] or []) or None, config=params,
            )
        return options

    def build_hooks(self) -> Sequence[Optional[HookBase]]:
        """The default hooks of :func:`~treadle.engine.default_hooks.default_hooks`
        for the config's settings (the order and why: ``docs/defaults.md``)."""
        cfg = self.cfg
        best_metric = train_setting(cfg, "best_checkpointer.metric")
        stop_metric = train_setting(cfg, "early_stopping.metric")
        eval_period = int(train_setting(cfg, "eval_period"))
        has_eval = "test" in cfg.dataloader and cfg.dataloader.test is not None
        stopping = has_eval and bool(stop_metric)

        def test_and_save_results() -> Dict[str, Any]:
            self._last_eval_results = self.test(self.cfg, self.model, loader=self._test_loader)
            return self._last_eval_results

        return default_hooks(
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            ema_decay=float(train_setting(cfg, "ema.decay")) if train_setting(cfg, "ema.enabled") else None,
            evaluate=test_and_save_results if has_eval else None,
            eval_period=eval_period,
            checkpointer=self.checkpointer,
            best_metric=best_metric if has_eval and best_metric else None,
            best_mode=train_setting(cfg, "best_checkpointer.mode"),
            stop_metric=stop_metric if stopping else None,
            stop_patience=int(train_setting(cfg, "early_stopping.patience")) if stopping else None,
            stop_min_delta=float(train_setting(cfg, "early_stopping.min_delta")) if stopping else 0.0,
            stop_mode=train_setting(cfg, "early_stopping.mode"),
            checkpoint_period=int(train_setting(cfg, "checkpointer.period")),
            max_to_keep=train_setting(cfg, "checkpointer.max_to_keep"),
            async_save=bool(train_setting(cfg, "checkpointer.async_save")),
            export_safetensors=bool(train_setting(cfg, "checkpointer.export_safetensors")),
            handle_preemption=bool(train_setting(cfg, "handle_preemption")),
            writers=self.build_writers(),
            log_period=int(train_setting(cfg, "log_period")),
            output_dir=train_setting(cfg, "output_dir"),
            samples_per_iter=self._samples_per_iter(),
        )

    def _samples_per_iter(self) -> Optional[int]:
        total_batch = getattr(self.train_loader, "total_batch_size", None)
        return total_batch * int(train_setting(self.cfg, "step.grad_accum_steps")) if total_batch else None

    @property
    def _trainer(self) -> StepBase:
        """LiBai's and detectron2's name for the object that runs each iteration:
        the step object. ``self._trainer = MyStep(...)`` in a subclass's
        ``__init__`` (LiBai's documented way to replace ``run_step``) sets
        :attr:`step`."""
        return self.step

    @_trainer.setter
    def _trainer(self, step: StepBase) -> None:
        self.step = step

    def _check_evaluation(self, cfg: DictConfig) -> None:
        """Builds the evaluator once, so that a bad metric name fails now, and
        checks the metrics that the best checkpointer and early stopping
        watch against its result names (when it knows them)."""
        self._test_loader: Any = None
        if "test" not in cfg.dataloader or cfg.dataloader.test is None:
            return
        # Built now so that a bad test loader fails before training, and kept
        # for the evaluations (one build per run, not per evaluation).
        self._test_loader = self.build_test_loader(cfg)
        evaluator = self.build_evaluator(cfg)
        known = getattr(evaluator, "result_names", None)
        for section in ("best_checkpointer", "early_stopping"):
            metric = train_setting(cfg, f"{section}.metric")
            if metric:
                check_watched_metric(f"train.{section}.metric", metric, known)

    # ------------------------------------------------------------------ running
    def resume_or_load(self, resume: bool = True, *, move_aside: bool = False) -> None:
        """With ``resume`` and a checkpoint in ``output_dir``: restore everything
        from the newest readable one and continue after its iteration.
        Otherwise load the weights of ``train.init_checkpoint`` (if any) and
        start at iteration 0. ``--resume`` with nothing to resume warns and
        starts fresh.

        The output directory is claimed (see
        :class:`~treadle.utils.run_folder.RunFolder`), before a resume reads it
        and after a fresh start has loaded its weights: a job already running
        there, or a fresh start in a folder holding an earlier run, is refused
        in one line, unless ``move_aside`` renames the earlier run's folder.
        Values the config sets for the optimizer and the scheduler are kept
        over the checkpoint's, with a warning for each (see
        :mod:`treadle.engine.resume`).

        Raises:
            RunFolderError: the folder is busy, or used and neither resumed nor moved aside.
            CheckpointError: ``train.init_checkpoint`` is missing or unreadable,
                or no checkpoint of the run can be read.
        """
        init = train_setting(self.cfg, "init_checkpoint") or ""
        self.start_iter = self.session.open(self, resume=resume, init=init, move_aside=move_aside)

    @property
    def run_folder(self) -> Any:
        """The run's :class:`~treadle.utils.run_folder.RunFolder` (its session's)."""
        return self.session.folder

    def train(self) -> Optional[Dict[str, Any]]:  # type: ignore[override]
        """Trains from ``start_iter`` to ``train.max_iter``; returns the last evaluation results.

        Claims the output directory if :meth:`resume_or_load` has not (a
        fresh start), then writes ``config.yaml`` and starts ``log.txt``; the
        folder's lock is released when training ends (:class:`~treadle.engine.session.RunSession`).
        """
        self._last_eval_results = None
        self.session.claim(resume=self.start_iter > 0)
        with self.session.running(self.has_work(self.start_iter, self.max_iter)):
            super().train(self.start_iter, self.max_iter)
        return self._last_eval_results

    @classmethod
    def test(cls, cfg: DictConfig, model: nn.Module, evaluator: Any = None, *, loader: Any = None) -> Dict[str, Any]:
        """Evaluates ``model`` on ``cfg.dataloader.test`` (or ``loader``) with ``cfg.dataloader.evaluator``."""
        loader = loader if loader is not None else cls.build_test_loader(cfg)
        evaluator = evaluator if evaluator is not None else cls.build_evaluator(cfg)
        device = next(iter(model.parameters())).device
        # The model is fed as the training step feeds it: a model that computes
        # its own loss (no loss_fn) gets the whole batch; with one, a dict without its labels.
        # A step without one (a research step with its own criterion) leaves it to the evaluator's.
        loss_fn = train_setting(cfg, "step.loss_fn")
        if loss_fn is None:
            loss_fn = evaluator_loss_fn(evaluator)
        return inference_on_dataset(model, loader, evaluator, device=device, forward=training_forward(loss_fn))
