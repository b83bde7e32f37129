"""One run session for both trainers: the same run given as a config to
DefaultTrainer and as objects to the plain Trainer writes the same files and
metrics rows, resumes the same way and refuses a used folder the same way."""

from __future__ import annotations

import json

import pytest
import torch
from fvcore.common.param_scheduler import CosineParamScheduler
from omegaconf import OmegaConf
from torch import nn

from treadle.config import LazyCall as L
from treadle.data import build_test_loader, build_train_loader
from treadle.trainer import Trainer
from treadle.engine.defaults import DefaultTrainer, default_setup
from treadle.evaluation import build_evaluator
from treadle.hooks import CallbackHook, LRMultiplier
from treadle.utils.run_folder import RunFolderUsedError

from tests.tiny_models import classification

MAX_ITER = 24


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def config(out) -> object:
    cfg = OmegaConf.create({
        "model": L(mlp)(),
        "optimizer": L(torch.optim.SGD)(lr=0.1),
        "lr_multiplier": L(LRMultiplier)(multiplier=L(CosineParamScheduler)(start_value=1.0, end_value=0.0),
                                         max_iter=MAX_ITER),
        "dataloader": {
            "train": L(build_train_loader)(dataset=L(classification)(), total_batch_size=32, seed=0),
            "test": L(build_test_loader)(dataset=L(classification)(n=64, seed=1), batch_size=32),
            "evaluator": L(build_evaluator)(metrics=["accuracy", "loss"], loss_fn=L(nn.CrossEntropyLoss)()),
        },
        "train": {
            "output_dir": str(out), "max_iter": MAX_ITER, "device": "cpu", "seed": 0, "log_period": 4,
            "eval_period": 8, "checkpointer": {"period": 8}, "handle_preemption": False,
            "step": {"loss_fn": L(nn.CrossEntropyLoss)()},
        },
    })
    cfg.lr_multiplier.optimizer = None  # DefaultTrainer gives its optimizer
    return cfg


def by_config(out, *hooks, resume=False):
    cfg = config(out)
    default_setup(cfg)
    trainer = DefaultTrainer(cfg)
    trainer.register_hooks(list(hooks))
    trainer.resume_or_load(resume=resume)
    trainer.train()
    return trainer


def by_objects(out, *hooks, resume=False):
    # The optimizer is built on the model, as DefaultTrainer builds the config's.
    model = mlp()
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), classification(), total_batch_size=32,
        loss_fn=nn.CrossEntropyLoss(), eval_loader=classification(64, seed=1), eval_batch_size=32,
        metrics=["accuracy", "loss"], scheduler=CosineParamScheduler(1.0, 0.0), max_iter=MAX_ITER, eval_period=8,
        log_period=4, checkpoint_period=8, seed=0, device="cpu", output_dir=str(out), progress_bar=False,
        hooks=list(hooks),
    )
    trainer.train(resume=resume)
    return trainer


FRONTS = {"config": by_config, "objects": by_objects}


def rows(out):
    """metrics.json's rows without the clock's values."""
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "time" not in k} for row in lines]


def files(out):
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and "tfevents" not in p.name)


def weights(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]


class Crash(Exception):
    pass


def crash_at(iteration):
    def after_step(trainer):
        if trainer.iter == iteration:
            raise Crash(f"crash at {iteration}")

    return CallbackHook(after_step=after_step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each front's run straight through, and crashed at iteration 11 then resumed."""
    out = {}
    for name, front in FRONTS.items():
        root = tmp_path_factory.mktemp(name)
        straight = front(root / "straight")
        with pytest.raises(Crash):
            front(root / "resumed", crash_at(11))
        resumed = front(root / "resumed", resume=True)
        out[name] = (root, straight, resumed)
    return out


def test_both_fronts_write_the_same_files_and_rows(runs):
    (config_root, config_run, _), (objects_root, objects_run, _) = runs["config"], runs["objects"]
    assert files(config_root / "straight") == sorted(files(objects_root / "straight") + ["config.yaml"])
    assert {"metrics.json", "log.txt", "last_checkpoint", "model_0000007.pth", "model_0000015.pth",
            "model_final.pth", "summary.json"} <= set(files(objects_root / "straight"))
    assert rows(config_root / "straight") == rows(objects_root / "straight")
    assert [row["iteration"] for row in rows(objects_root / "straight") if "total_loss" in row] == [3, 7, 11, 15, 19, 23]
    assert all(torch.equal(p, q) for p, q in zip(weights(config_run), weights(objects_run)))


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_a_crashed_run_resumes_to_the_straight_runs_weights_and_rows(runs, front):
    root, straight, resumed = runs[front]
    assert resumed.start_iter == 8  # after the checkpoint of iteration 7
    assert all(torch.equal(p, q) for p, q in zip(weights(straight), weights(resumed)))
    assert rows(root / "resumed") == rows(root / "straight")
    assert files(root / "resumed") == files(root / "straight")


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_both_fronts_refuse_a_fresh_start_in_a_used_folder_and_leave_it_as_it_was(runs, front):
    root, _, _ = runs[front]
    before = {name: (root / "straight" / name).read_bytes() for name in files(root / "straight")}
    with pytest.raises(RunFolderUsedError, match="holds an earlier run"):
        FRONTS[front](root / "straight")
    assert {name: (root / "straight" / name).read_bytes() for name in files(root / "straight")} == before


def test_a_jobs_log_txt_holds_that_job_only_after_a_failed_job_without_a_folder(tmp_path):
    """A DefaultTrainer job without an output_dir (its console keeps warnings and errors for a log file)
    fails; the next job's log.txt does not begin with that failure."""
    cfg = config(tmp_path / "unused")
    cfg.train.output_dir = ""
    default_setup(cfg)
    trainer = DefaultTrainer(cfg)
    trainer.register_hooks([crash_at(3)])
    trainer.resume_or_load(resume=False)
    with pytest.raises(Crash):
        trainer.train()
    by_config(tmp_path / "run")
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "crash at 3" not in log and "Exception during training" not in log
    assert "Starting training from iteration 0" in log
