"""A detectron2-style lazy-config training script whose only treadle-specific
lines are its imports.

It uses detectron2's API the way detectron2's ``tools/lazyconfig_train_net.py``
does: ``SimpleTrainer``/``AMPTrainer`` built by hand, ``DetectionCheckpointer``
with ``trainer=`` and ``resume_or_load``, ``create_ddp_model`` from
``engine.defaults``, ``inference_on_dataset`` + ``print_csv_format``, and the
hooks in detectron2's standard order (IterationTimer, LRScheduler, PreciseBN,
PeriodicCheckpointer, EvalHook, PeriodicWriter). Written with
``from detectron2...`` imports it would run under detectron2; here the module
names are treadle's. tests/ported/test_ported.py runs it, kills it with kill -9,
resumes it and compares the weights with an uninterrupted run.
"""

import logging

from treadle.checkpoint import DetectionCheckpointer
from treadle.config import LazyConfig, instantiate
from treadle.engine import (
    AMPTrainer,
    SimpleTrainer,
    default_argument_parser,
    default_setup,
    default_writers,
    hooks,
    launch,
)
from treadle.engine.defaults import create_ddp_model
from treadle.evaluation import inference_on_dataset, print_csv_format
from treadle.utils import comm

logger = logging.getLogger("detectron2")


def evaluate(cfg, model):
    if "evaluator" not in cfg.dataloader:
        return None
    results = inference_on_dataset(model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator))
    print_csv_format(results)
    return results


def main_only(hook):
    return hook if comm.is_main_process() else None


def train(args, cfg):
    model = instantiate(cfg.model)
    logger.info("Model:\n%s", model)
    model.to(cfg.train.device)

    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    train_loader = instantiate(cfg.dataloader.train)

    model = create_ddp_model(model, **cfg.train.ddp)
    trainer_class = AMPTrainer if cfg.train.amp.enabled else SimpleTrainer
    trainer = trainer_class(model, train_loader, optimizer)
    checkpointer = DetectionCheckpointer(model, cfg.train.output_dir, trainer=trainer)
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
            hooks.PreciseBN(cfg.train.eval_period, model, instantiate(cfg.dataloader.test), 2),
            main_only(hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer)),
            hooks.EvalHook(cfg.train.eval_period, lambda: evaluate(cfg, model)),
            main_only(
                hooks.PeriodicWriter(
                    default_writers(cfg.train.output_dir, cfg.train.max_iter), period=cfg.train.log_period
                )
            ),
        ]
    )

    checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=args.resume)
    # A checkpoint holds the iteration it finished: continue with the next one.
    start_iter = trainer.iter + 1 if args.resume and checkpointer.has_checkpoint() else 0
    trainer.train(start_iter, cfg.train.max_iter)


def main(args):
    cfg = LazyConfig.apply_overrides(LazyConfig.load(args.config_file), args.opts)
    default_setup(cfg, args)
    if not args.eval_only:
        train(args, cfg)
        return
    model = instantiate(cfg.model)
    model.to(cfg.train.device)
    model = create_ddp_model(model)
    DetectionCheckpointer(model).load(cfg.train.init_checkpoint)
    print(evaluate(cfg, model))


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    launch(
        main,
        args.num_gpus,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        dist_url=args.dist_url,
        args=(args,),
    )
