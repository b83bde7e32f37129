"""One default-hook list for DefaultTrainer and the plain Trainer, and where user hooks go."""

from pathlib import Path

import torch
from torch import nn

from treadle.config import LazyConfig
from treadle.trainer import Trainer
from treadle.engine.default_hooks import default_hooks
from treadle.engine.defaults import DefaultTrainer
from treadle.hooks import HookBase, PreciseBN, RunSummary

from tests.tiny_models import classification

ROOT = Path(__file__).resolve().parents[2]


def described(hooks):
    """Each hook's class and the settings that make it what it is."""
    keys = ("eval_period", "metric", "mode", "patience", "min_delta", "decay", "max_to_keep")
    return [
        (type(h).__name__, (h.after_step_period(), h.after_iteration_period()),
         {k: getattr(h, k) for k in keys if hasattr(h, k)})
        for h in hooks
    ]


def test_plain_trainer_and_default_trainer_register_the_same_hooks_from_the_same_settings(tmp_path):
    settings = dict(eval_period=10, checkpoint_period=15, log_period=5, max_iter=30)
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    cfg = LazyConfig.apply_overrides(cfg, [
        f"train.output_dir={tmp_path / 'config'}", f"train.max_iter={settings['max_iter']}",
        f"train.eval_period={settings['eval_period']}", f"train.checkpointer.period={settings['checkpoint_period']}",
        f"train.log_period={settings['log_period']}", "train.checkpointer.max_to_keep=3",
        "train.ema.enabled=true", "train.ema.decay=0.99", "train.best_checkpointer.metric=accuracy",
        "train.early_stopping.metric=accuracy", "train.early_stopping.patience=4",
    ])
    from_config = DefaultTrainer(cfg)
    plain = Trainer(
        from_config.model, from_config.optimizer, iter(from_config.train_loader), loss_fn=nn.functional.cross_entropy,
        scheduler=from_config.scheduler, eval_loader=DefaultTrainer.build_test_loader(cfg), metrics=["accuracy"],
        output_dir=str(tmp_path / "plain"), max_to_keep=3, ema_decay=0.99, best_metric="accuracy",
        early_stopping_patience=4, progress_bar=False, **settings,
    )
    assert [type(h).__name__ for h in plain.hooks] == [type(h).__name__ for h in from_config.hooks] == [
        "IterationTimer", "LRScheduler", "EMA", "EvalHook", "BestCheckpointer", "EarlyStopping",
        "PeriodicCheckpointer", "PreemptionHandler", "PeriodicWriter", "RunSummary",
    ]
    assert described(plain.hooks) == described(from_config.hooks)
    periods = {name: period for name, period, _ in described(plain.hooks)}
    # after_step's and after_iteration's: evaluation, checkpoints (after every hook of the iteration), writes.
    assert (periods["EvalHook"], periods["PeriodicCheckpointer"][1], periods["PeriodicWriter"]) == (
        (10, None), 15, (5, None)
    )


def _hook_names(**settings):
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    return [type(h).__name__ for h in default_hooks(optimizer=optimizer, **settings)]


def test_what_one_trainer_has_and_the_other_not_is_a_setting():
    assert _hook_names() == ["IterationTimer", "LRMonitor", "PeriodicWriter", "RunSummary"]
    everything = _hook_names(
        ema_decay=0.9, evaluate=dict, eval_period=5, checkpointer=object(), best_metric="accuracy",
        stop_metric="accuracy", stop_patience=2, epochs=[], checkpoint_period=5, handle_preemption=True,
        progress_bar=True,
    )
    assert everything == [
        "IterationTimer", "LRMonitor", "EMA", "EvalHook", "BestCheckpointer", "EarlyStopping", "EpochHistory",
        "PeriodicCheckpointer", "PreemptionHandler", "PeriodicWriter", "ProgressBar", "RunSummary",
    ]


class Probe(HookBase):
    pass


class NeedsProbe(HookBase):
    runs_after = (Probe,)


def test_user_hooks_go_after_evaluation_and_epoch_history_before_checkpoints_and_writers(tmp_path):
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    bn_data = torch.utils.data.DataLoader(classification(64), batch_size=16)
    probe, precise_bn = Probe(), PreciseBN(16, model, bn_data, num_iter=2)
    trainer = Trainer(
        model, "sgd", classification(), batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy,
        eval_loader=classification(64, seed=1), max_epochs=2, ema_decay=0.9, output_dir=str(tmp_path),
        hooks=[probe, precise_bn], progress_bar=True, seed=0,
    )
    assert [type(h).__name__ for h in trainer.hooks] == [
        "IterationTimer", "LRMonitor", "EMA",
        "PreciseBN",  # EvalHook runs after it: moved before the evaluation
        "EvalHook", "EpochHistory",
        "Probe",  # the slot
        "PeriodicCheckpointer", "PreemptionHandler", "PeriodicWriter", "ProgressBar", "RunSummary",
    ]
    assert trainer.hooks[3] is precise_bn and trainer.hooks[6] is probe


def test_a_users_preemption_handler_is_the_one_in_the_default_ones_place(tmp_path):
    """One handler (a second would take the signal from the first), after the
    periodic checkpointer: at a checkpoint's iteration it finds it written."""
    from treadle.hooks import PreemptionHandler

    mine = PreemptionHandler(exit_code=None)
    trainer = Trainer(nn.Linear(6, 2), "sgd", classification(), batch_size=32, lr=0.1,
                      loss_fn=nn.functional.cross_entropy, max_iter=2, output_dir=str(tmp_path), hooks=[Probe(), mine],
                      progress_bar=False)
    assert [type(h).__name__ for h in trainer.hooks][-5:] == [
        "Probe", "PeriodicCheckpointer", "PreemptionHandler", "PeriodicWriter", "RunSummary",
    ]
    assert trainer.hooks[-3] is mine


def test_a_user_hook_that_another_user_hook_follows_goes_before_it():
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    needs, probe = NeedsProbe(), Probe()
    hooks = default_hooks(optimizer=optimizer, evaluate=dict, user_hooks=[needs, probe])
    assert [type(h).__name__ for h in hooks] == [
        "IterationTimer", "LRMonitor", "EvalHook", "Probe", "NeedsProbe", "PeriodicWriter", "RunSummary",
    ]


def test_the_run_summary_counts_the_samples_of_every_accumulated_batch():
    trainer = Trainer(
        nn.Linear(6, 2), "sgd", classification(64), batch_size=4, lr=0.1, loss_fn=nn.functional.cross_entropy,
        grad_accum_steps=2, max_iter=3, progress_bar=False,
    )
    summary = next(h for h in trainer.hooks if isinstance(h, RunSummary))
    assert summary.samples_per_iter == 8  # one iteration is one update: two batches of 4



def test_a_config_mode_against_the_metrics_direction_is_warned_about_in_one_line(tmp_path, treadle_caplog):
    from treadle.config.validation import check_run_config

    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    cfg = LazyConfig.apply_overrides(cfg, [
        f"train.output_dir={tmp_path}", "train.best_checkpointer.metric=accuracy", "train.best_checkpointer.mode=min",
        "train.early_stopping.metric=accuracy", "train.early_stopping.mode=max",
    ])
    check_run_config(cfg)
    assert [r.getMessage() for r in treadle_caplog.records if r.levelname == "WARNING"] == [
        "train.best_checkpointer.mode='min' contradicts train.best_checkpointer.metric='accuracy', which is better "
        "when higher: the best checkpoint and early stopping will favour its lowest values"
    ]
