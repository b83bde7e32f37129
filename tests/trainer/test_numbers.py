"""The plain Trainer gives the right numbers where it silently did not.

Each test is one of the wrong-number bugs found by users of the seeds'
trainers (issue "The seeds' users, Hugging Face and torchmetrics").
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from treadle.trainer import Trainer
from treadle.hooks import EMA, PreciseBN

from tests.tiny_models import CountingTokens, classification, tiny_gpt2


def mlp(seed=0, bn=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 16)] + ([nn.BatchNorm1d(16)] if bn else []) + [nn.ReLU(), nn.Linear(16, 2)]
    return nn.Sequential(*layers)


def _loss(model, data):
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        return float(nn.functional.cross_entropy(model(x), y))


def test_model_best_under_ema_evaluates_to_the_recorded_best(tmp_path):
    """Bug 1: the score came from the EMA weights, model_best held the live ones."""
    val = classification(128, seed=1)
    trainer = Trainer(
        mlp(), "sgd", classification(), batch_size=32, lr=0.2, loss_fn=nn.functional.cross_entropy,
        eval_loader=val, eval_batch_size=64, metrics=["loss"], max_epochs=6, ema_decay=0.8,
        best_metric="loss", output_dir=str(tmp_path), progress_bar=False, seed=0,
    )
    history = trainer.train()
    best = torch.load(tmp_path / "model_best.pth", weights_only=True)
    recorded = best["trainer"]["hooks"]["BestCheckpointer"]["best_metric"]
    assert recorded == pytest.approx(min(e["eval_loss"] for e in history.epochs))
    fresh = mlp()
    fresh.load_state_dict(best["model"])
    assert _loss(fresh, val) == pytest.approx(recorded, rel=1e-5)


def test_ema_and_precise_bn_evaluate_with_statistics_of_the_averaged_weights(tmp_path):
    """Bug 2: precise BN replaced the buffers and EMA kept copying the stale
    ones: the evaluation used statistics from before training."""
    train_set = classification(512)
    bn_data = torch.utils.data.DataLoader(train_set, batch_size=64)
    model = mlp(bn=True)
    seen = []
    trainer = Trainer(
        model, "sgd", train_set, batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy,
        eval_loader=classification(128, seed=1), metrics=["accuracy"], max_epochs=3, ema_decay=0.9,
        hooks=[PreciseBN(16, model, bn_data, num_iter=8)], progress_bar=False, seed=0,
    )
    names = [type(h).__name__ for h in trainer.hooks]
    assert names.index("EMA") < names.index("PreciseBN") < names.index("EvalHook")
    ema = next(h for h in trainer.hooks if isinstance(h, EMA))
    original = trainer.evaluate

    def evaluate():
        # Inside the EMA swap: the statistics must be those of the weights loaded now.
        with torch.no_grad():
            feats = torch.cat([model[0](x) for x, _ in bn_data])
        seen.append((model[1].running_mean.clone(), feats.mean(0)))
        return original()

    trainer.hooks[names.index("EvalHook")]._func = evaluate
    history = trainer.train()
    assert len(seen) == 3
    for used, true_mean in seen:
        torch.testing.assert_close(used, true_mean, rtol=1e-3, atol=1e-4)
    assert history.epochs[-1]["accuracy"] > 0.8
    assert ema.num_updates == trainer.max_iter


def test_perplexity_of_a_causal_lm_is_exp_of_its_own_loss():
    """Bug 3: the logits were scored against unshifted labels (16.17 against 18.92)."""
    model = tiny_gpt2()
    val = CountingTokens(32, seed=1)
    trainer = Trainer(
        model, "adamw", CountingTokens(64), batch_size=8, lr=1e-3, eval_loader=val, eval_batch_size=8,
        metrics=["perplexity", "loss"], max_iter=10, progress_bar=False, seed=0,
    )
    trainer.train()
    results = trainer.evaluate()
    model.eval()
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(val, batch_size=8):
            out = model(**batch)
            n = int((batch["labels"][:, 1:] != -100).sum())
            nll += float(out.loss) * n
            tokens += n
    assert results["perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    assert results["perplexity"] == pytest.approx(math.exp(results["loss"]), rel=1e-5)


def test_best_metric_loss_keeps_the_lowest(tmp_path):
    """Bug 4: mode defaulted to "max", so the worst evaluation was kept."""
    trainer = Trainer(
        mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy,
        eval_loader=classification(128, seed=1), eval_batch_size=128, max_epochs=5, best_metric="loss",
        output_dir=str(tmp_path), progress_bar=False, seed=0,
    )
    history = trainer.train()
    losses = [e["eval_loss"] for e in history.epochs]
    assert losses[-1] < losses[0]
    best = torch.load(tmp_path / "model_best.pth", weights_only=True)
    assert best["trainer"]["hooks"]["BestCheckpointer"]["best_metric"] == pytest.approx(min(losses))


def test_torch_scheduler_meant_per_epoch(treadle_caplog):
    """Bug 6: StepLR(step_size=2) was stepped per iteration (0.1 -> 0.00078 in two epochs)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model, opt, classification(), batch_size=32, loss_fn=nn.functional.cross_entropy, max_epochs=6,
        scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5), scheduler_interval="epoch",
        progress_bar=False,
    )
    history = trainer.train()
    per_epoch = [e["lr"] for e in history.epochs]
    assert per_epoch == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert "stepping StepLR after every epoch (8 iterations)" in treadle_caplog.text


def test_a_model_computing_its_own_loss_is_called_alike_in_training_and_evaluation():
    """Bug 7: model((x, y)) in training, model(x) in evaluation ("too many values to unpack")."""

    class SelfLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, batch):
            x, y = batch
            logits = self.net(x)
            return {"loss": nn.functional.cross_entropy(logits, y), "logits": logits}

    trainer = Trainer(
        SelfLoss(), "sgd", classification(), batch_size=32, lr=0.1, eval_loader=classification(128, seed=1),
        eval_batch_size=64, metrics=["accuracy", "loss"], max_epochs=3, progress_bar=False, seed=0,
    )
    history = trainer.train()
    assert [set(e) >= {"accuracy", "loss"} for e in history.epochs] == [True] * 3
    assert history.epochs[-1]["accuracy"] > 0.8


def _batches(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g) * 20, torch.randint(0, 2, (16,), generator=g)) for _ in range(n)]


def _clipped_by_value_by_hand(model, optimizer, batches, value):
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_value_(list(model.parameters()), value)
        optimizer.step()


def test_trainer_clip_grad_value_updates_as_clip_grad_value_by_hand():
    batches = _batches()
    hand = mlp()
    _clipped_by_value_by_hand(hand, torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9), batches, 0.01)
    unclipped = mlp()
    _clipped_by_value_by_hand(unclipped, torch.optim.SGD(unclipped.parameters(), lr=0.1, momentum=0.9), batches, 1e9)
    model = mlp()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), iter(batches),
                      loss_fn=nn.functional.cross_entropy, max_iter=len(batches), clip_grad_value=0.01,
                      loggers=(), progress_bar=False)
    trainer.train()
    for p, q in zip(model.parameters(), hand.parameters()):
        assert torch.equal(p, q)
    assert not all(torch.equal(p, q) for p, q in zip(hand.parameters(), unclipped.parameters()))


@pytest.mark.parametrize("value", [0, -0.5, "0.01"])
def test_trainer_refuses_a_bad_clip_grad_value_in_one_line(value):
    with pytest.raises(ValueError, match=r"^clip_grad_value must be a positive number or None, got "):
        Trainer(mlp(), "sgd", iter(_batches()), lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=2,
                clip_grad_value=value, loggers=(), progress_bar=False)


def _digits_cfg(tmp_path, *overrides):
    from pathlib import Path

    from treadle.config import LazyConfig

    cfg = LazyConfig.load(str(Path(__file__).resolve().parents[2] / "configs" / "digits_mlp.py"))
    cfg = LazyConfig.apply_overrides(cfg, [
        f"train.output_dir={tmp_path}", "train.max_iter=5", "train.eval_period=0", "model.dropout=0.0", *overrides,
    ])
    cfg.lr_multiplier = None  # a constant rate: the hand loop has no schedule
    return cfg


def test_config_clip_grad_value_updates_as_clip_grad_value_by_hand(tmp_path):
    import copy

    from treadle.engine.defaults import DefaultTrainer

    trainer = DefaultTrainer(_digits_cfg(tmp_path, "train.step.clip_grad_value=0.01"))
    assert trainer.step.clip_grad_value == 0.01
    # One deepcopy: the copied optimizer holds the copied model's parameters.
    hand, hand_opt = copy.deepcopy((trainer.model, trainer.optimizer))
    seen = []
    next_batch = trainer.step.next_batch
    trainer.step.next_batch = lambda: seen.append(next_batch()) or seen[-1]
    trainer.train()
    assert len(seen) == 5
    for x, y in seen:
        hand_opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(hand(x), y).backward()
        torch.nn.utils.clip_grad_value_(list(hand.parameters()), 0.01)
        hand_opt.step()
    for p, q in zip(trainer.model.parameters(), hand.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_config_refuses_a_bad_clip_grad_value_naming_the_key(tmp_path, value):
    """train_net's check of the config (check_run_config) names the key."""
    from treadle.config.errors import ConfigError
    from treadle.config.validation import check_run_config

    with pytest.raises(ConfigError, match=r"^train.step.clip_grad_value must be") as info:
        check_run_config(_digits_cfg(tmp_path, f"train.step.clip_grad_value={value}"))
    assert "\n" not in str(info.value)
