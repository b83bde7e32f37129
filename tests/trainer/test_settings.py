"""The plain Trainer's settings table: every setting acts, or is refused or
warned about in one line; names mean what torch means; the seeds' users'
traps (issue 40), each written as its seed's user writes it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate

from treadle.trainer import Trainer
from treadle.trainer.settings import SETTINGS
from treadle.trainer.settings_docs import describe

from tests.tiny_models import CountingTokens, classification, tiny_gpt2

ROOT = Path(__file__).resolve().parents[2]
CE = nn.functional.cross_entropy


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


# ---------------------------------------------------------------------- a name means what torch means
def test_sgd_by_name_trains_bit_identically_to_torch_sgd_by_hand(treadle_caplog):
    """Hezar's "sgd", a hand-written loop and torch mean momentum 0 (it was 0.9)."""
    batches = list(DataLoader(classification(), batch_size=32))
    trainer = Trainer(mlp(), "sgd", iter(batches), lr=0.1, loss_fn=CE, max_iter=8, progress_bar=False)
    trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        CE(by_hand(x), y).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))
    assert "Optimizer 'sgd': torch.optim.SGD(lr=0.1, weight_decay=0.0), torch's defaults for the rest" in treadle_caplog.text


def test_a_name_with_options_is_torchs_class_with_them():
    batches = list(DataLoader(classification(), batch_size=32))
    trainer = Trainer(mlp(), ("sgd", {"momentum": 0.9, "nesterov": True}), iter(batches), lr=0.1, loss_fn=CE, max_iter=8,
                      progress_bar=False)
    trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    for x, y in batches:
        optimizer.zero_grad()
        CE(by_hand(x), y).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))
    with pytest.raises(ValueError, match=r"^optimizer='adamw': torch.optim.AdamW takes no option 'momentum'$"):
        Trainer(mlp(), ("adamw", {"momentum": 0.9}), iter(batches), lr=0.1, loss_fn=CE, max_iter=1)
    with pytest.raises(ValueError, match=r"^lr is given twice"):
        Trainer(mlp(), ("adamw", {"lr": 0.1}), iter(batches), lr=0.1, loss_fn=CE, max_iter=1)


def test_treadles_own_optimizer_default_is_logged_and_can_be_turned_off(treadle_caplog):
    data = classification()
    trainer = Trainer(mlp(), "adamw", data, batch_size=32, lr=1e-3, weight_decay=0.1, loss_fn=CE, max_iter=1)
    assert sorted(g["weight_decay"] for g in trainer.optimizer.param_groups) == [0.0, 0.1]
    assert "norms and biases without weight decay (no_decay_norm_and_bias=True)" in treadle_caplog.text
    trainer = Trainer(mlp(), "adamw", data, batch_size=32, lr=1e-3, weight_decay=0.1, no_decay_norm_and_bias=False,
                      loss_fn=CE, max_iter=1)
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.1]


def test_a_scheduler_built_on_another_optimizer_is_refused():
    """The learning rate never changed, silently."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"^the scheduler \(StepLR\) was built on another optimizer than the one trained"):
        Trainer(model, optimizer, classification(), batch_size=32, loss_fn=CE, max_iter=4,
                scheduler=torch.optim.lr_scheduler.StepLR(other, 2))
    with pytest.raises(ValueError, match=r"^the scheduler \(StepLR\) was built on another optimizer than the one trained"):
        Trainer(model, "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=4,
                scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2))
    trained = Trainer(model, optimizer, classification(), batch_size=32, loss_fn=CE, max_iter=4, progress_bar=False,
                      scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5))
    assert trained.train()["lr"] == pytest.approx([0.1, 0.1, 0.05, 0.05])


def step_rates(lr, max_iter, warmup, milestone, gamma):
    """The rate of each update, by hand: a ramp from 0 over ``warmup`` updates
    (Hugging Face's), then ``lr``, times ``gamma`` from update ``milestone`` on."""
    return [lr * min(1.0, i / warmup if warmup else 1.0) * (gamma if i >= milestone else 1.0) for i in range(max_iter)]


@pytest.mark.parametrize("max_iter, warmup", [(24, 0), (24, 4), (24, 8), (48, 4)])
def test_a_step_schedule_drops_the_rate_at_its_milestone_under_a_warm_up(max_iter, warmup):
    model = mlp()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), classification(), batch_size=32,
                      loss_fn=CE, max_iter=max_iter, scheduler=("step", {"steps": [16], "gamma": 0.1}),
                      warmup_iters=warmup, progress_bar=False)
    rates = trainer.train()["lr"]
    assert rates == pytest.approx(step_rates(0.1, max_iter, warmup, 16, 0.1), rel=1e-12, abs=1e-15)
    assert rates[15] == pytest.approx(0.1) and rates[16] == pytest.approx(0.01)


def test_a_named_schedule_takes_options_and_says_what_it_is(treadle_caplog):
    model = mlp()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), classification(), batch_size=32,
                      loss_fn=CE, max_iter=8, scheduler=("step", {"steps": [4], "gamma": 0.5}), progress_bar=False)
    history = trainer.train()
    assert history["lr"] == pytest.approx([0.1] * 4 + [0.05] * 4)
    assert "Schedule 'step': the optimizer's rate times 0.5 at iterations [4] of the schedule (MultiStepLR)" in treadle_caplog.text
    with pytest.raises(ValueError, match=r"^scheduler='cosine' takes the options steps, gamma, end_value; got \['T_max'\]"):
        Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=8,
                scheduler=("cosine", {"T_max": 3}))


# ---------------------------------------------------------------------- data
def pairs(n=64):
    data = classification(n)
    return [data[i] for i in range(n)]  # a plain list of (x, y) samples


def test_a_list_of_samples_without_a_batch_size_is_refused_in_one_line(tmp_path):
    """It trained one sample per update, silently (torch's DataLoader takes a list as a dataset)."""
    out = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        Trainer(mlp(), "sgd", pairs(), lr=0.1, loss_fn=CE, max_epochs=1, output_dir=str(out))
    assert str(error.value) == (
        "train_loader is a list of samples ((Tensor[6], Tensor[]) each): give batch_size=... (per process) or "
        "total_batch_size=... (over all processes) to batch it; ready-made batches come as a DataLoader "
        "(DataLoader(batches, batch_size=None) for a list of them) or an iterable that is not a list (a generator)"
    )
    assert not out.exists()
    dicts = [{"input_ids": ids, "labels": ids} for ids in CountingTokens(8).ids]
    with pytest.raises(ValueError, match=r"^train_loader is a list of samples \(\{input_ids: Tensor\[16\], labels: Tensor\[16\]\} each\)"):
        Trainer(tiny_gpt2(), "adamw", dicts, lr=1e-3, max_epochs=1)


def test_a_list_of_samples_with_a_batch_size_trains_as_the_same_dataset_does():
    from_list = Trainer(mlp(), "sgd", pairs(), batch_size=16, lr=0.1, loss_fn=CE, max_epochs=2, seed=0,
                        progress_bar=False)
    from_dataset = Trainer(mlp(), "sgd", classification(64), batch_size=16, lr=0.1, loss_fn=CE, max_epochs=2,
                           seed=0, progress_bar=False)
    assert from_list.epoch_length == 4
    from_list.train()
    from_dataset.train()
    assert all(torch.equal(p, q) for p, q in zip(from_list.model.parameters(), from_dataset.model.parameters()))


def _train_counting(trainer):
    """Trains; returns the input shapes the model saw and the optimizer's updates."""
    shapes, updates = [], []
    trainer.model.register_forward_hook(lambda module, inputs, output: shapes.append(tuple(inputs[0].shape)))
    trainer.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: updates.append(1))
    trainer.train()
    return shapes, len(updates)


def test_a_list_of_per_token_samples_is_batched_by_batch_size():
    """Samples (x[5, 8], y[5]) share a first dimension: the shape rule took
    the list for ready batches (one sample per update), and refused batch_size."""
    g = torch.Generator().manual_seed(0)
    tags = [(torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(20)]
    torch.manual_seed(0)
    trainer = Trainer(nn.Linear(8, 3), "sgd", tags, batch_size=4, lr=0.1, max_epochs=2, progress_bar=False,
                      loss_fn=lambda out, y: CE(out.flatten(0, 1), y.flatten()))
    assert trainer.epoch_length == 5
    shapes, updates = _train_counting(trainer)
    assert shapes == [(4, 5, 8)] * 10 and updates == 10


def test_a_list_of_images_and_masks_is_batched_by_batch_size():
    g = torch.Generator().manual_seed(0)
    pairs_ = [(torch.randn(1, 8, 8, generator=g), (torch.rand(1, 8, 8, generator=g) > 0.5).float())
              for _ in range(12)]
    torch.manual_seed(0)
    trainer = Trainer(nn.Conv2d(1, 1, 3, padding=1), "sgd", pairs_, batch_size=3, lr=0.1, max_epochs=1,
                      loss_fn=nn.functional.binary_cross_entropy_with_logits, progress_bar=False)
    shapes, updates = _train_counting(trainer)
    assert shapes == [(3, 1, 8, 8)] * 4 and updates == 4


def test_a_list_is_a_dataset_whatever_its_items_and_is_refused_without_a_batch_size(tmp_path):
    """A list of what look like batches is samples too, as torch's DataLoader
    takes it; the line says how ready batches are given."""
    out = tmp_path / "run"
    tags = [(torch.randn(5, 8), torch.randint(0, 3, (5,))) for _ in range(4)]
    with pytest.raises(ValueError) as error:
        Trainer(nn.Linear(8, 3), "sgd", tags, lr=0.1, loss_fn=CE, max_iter=2, output_dir=str(out))
    assert str(error.value) == (
        "train_loader is a list of samples ((Tensor[5, 8], Tensor[5]) each): give batch_size=... (per process) or "
        "total_batch_size=... (over all processes) to batch it; ready-made batches come as a DataLoader "
        "(DataLoader(batches, batch_size=None) for a list of them) or an iterable that is not a list (a generator)"
    )
    with pytest.raises(ValueError, match=r"^eval_loader is a list of samples \(\(Tensor\[5, 8\], Tensor\[5\]\) each\): "
                       r"give eval_batch_size=\.\.\. \(or batch_size\) to batch it; ready-made batches come as a DataLoader"):
        Trainer(nn.Linear(8, 3), "sgd", iter(tags), lr=0.1, loss_fn=CE, max_iter=2, eval_loader=tags)
    assert not out.exists()
    # The documented ways to give them as ready batches: each trains one batch per update.
    for ready in (DataLoader(tags, batch_size=None), iter(tags), (batch for batch in tags)):
        trainer = Trainer(nn.Linear(8, 3), "sgd", ready, lr=0.1, loss_fn=CE, max_iter=4, progress_bar=False)
        assert _train_counting(trainer) == ([(5, 8)] * 4, 4)


def test_total_batch_size_batches_evaluation_as_batch_size_does():
    """It was refused ("give eval_batch_size") where batch_size=32 batched evaluation by itself."""
    by_total = Trainer(mlp(), "sgd", classification(), total_batch_size=32, lr=0.1, loss_fn=CE,
                       eval_loader=classification(80, seed=1), metrics=["accuracy", "loss"], max_iter=2)
    by_batch = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE,
                       eval_loader=classification(80, seed=1), metrics=["accuracy", "loss"], max_iter=2)
    assert [len(b[0]) for b in by_total.eval_loader] == [32, 32, 16]
    assert by_total.evaluate() == by_batch.evaluate()


def test_evaluate_batches_a_dataset_as_eval_loader_is_batched():
    """Hezar's trainer.evaluate(eval_dataset): a dataset, batched like eval_loader (it was read one sample at a time)."""
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, eval_batch_size=20, lr=0.1, loss_fn=CE,
                      metrics=["accuracy"], max_iter=2)
    seen = []
    trainer.model.register_forward_hook(lambda module, inputs, output: seen.append(tuple(inputs[0].shape)))
    assert trainer.evaluate(classification(60, seed=1)) == trainer.evaluate(DataLoader(classification(60, seed=1), 20))
    assert seen == [(20, 6)] * 6


# ---------------------------------------------------------------------- no silent restart
def test_train_after_train_epoch_goes_on_where_the_trainer_stands():
    """It restarted at iteration 0 on the trained weights: epochs [0, 0, 1, 2]."""

    def make():
        return Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_epochs=3, seed=0,
                       eval_loader=classification(64, seed=1), progress_bar=False)

    straight = make()
    straight.train()
    stepped = make()
    stepped.train_epoch()
    history = stepped.train()
    assert [row["epoch"] for row in history.epochs] == [0, 1, 2]
    timeless = [{k: v for k, v in row.items() if "time" not in k} for row in history.epochs]
    assert timeless == [{k: v for k, v in row.items() if "time" not in k} for row in straight.history.epochs]
    assert all(torch.equal(p, q) for p, q in zip(stepped.model.parameters(), straight.model.parameters()))


def test_a_second_train_is_refused_in_one_line():
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_epochs=1,
                      progress_bar=False)
    trainer.train()
    with pytest.raises(RuntimeError, match=r"^this Trainer has trained already \(to iteration 7\): a second train\(\) "
                                           r"would start the run over on the trained weights"):
        trainer.train()
    with pytest.raises(RuntimeError, match="every iteration of the run"):
        trainer.train_epoch()


# ---------------------------------------------------------------------- evaluation asks for what it reports
class Continuations(torch.utils.data.Dataset):
    """Prompts of 4 tokens whose labels are the 3 tokens to generate: a
    decoder-only model has no forward loss on them."""

    def __init__(self):
        self.ids = CountingTokens(8, seed=1).ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids[:4], "attention_mask": torch.ones(4, dtype=torch.long), "labels": ids[4:7]}


def _text(rows):
    return ["".join(chr(97 + t % 26) for t in row.tolist()) for row in rows]


def test_evaluate_with_generate_on_a_decoder_only_model_computes_no_forward_loss_it_was_not_asked_for(tmp_path):
    """eval_step computed the forward loss on the continuation labels and failed with torch's
    "Expected input batch_size (...) to match target batch_size (...)"."""
    cer = ("cer", {"decode": lambda out: _text(out[:, 4:]), "decode_targets": _text})
    generate = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    trainer = Trainer(tiny_gpt2(), "adamw", CountingTokens(16), batch_size=8, lr=1e-3, eval_loader=Continuations(),
                      eval_batch_size=4, metrics=[cer], evaluate_with_generate=generate, max_iter=1,
                      progress_bar=False)
    batch = default_collate([Continuations()[i] for i in range(4)])
    step = trainer.eval_step(batch)
    assert set(step) == {"cer"} and 0 <= step["cer"] <= 1
    assert set(trainer.evaluate()) == {"cer"}
    # Asked for, the forward loss is refused when the Trainer is built (it was at the first evaluation, after
    # training), and nothing is written.
    out = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        Trainer(tiny_gpt2(), "adamw", CountingTokens(16), batch_size=8, lr=1e-3, eval_loader=Continuations(),
                eval_batch_size=4, metrics=[cer, "loss"], evaluate_with_generate=generate, max_iter=1,
                output_dir=str(out))
    assert not out.exists()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the evaluation 'loss' is the model's forward loss on the batch (input_ids (4, 4), "
                              "attention_mask (4, 4), labels (4, 3)), which this batch does not allow")
    assert message.endswith("leave 'loss' out of metrics where the labels are the text to generate rather than "
                            "the inputs' next tokens")


def test_the_forward_loss_tried_when_the_trainer_is_built_leaves_the_random_states_as_they_were():
    """The check reads one evaluation batch (a DataLoader draws its seed) and runs the model once."""
    cer = ("cer", {"decode": lambda out: _text(out[:, 4:]), "decode_targets": _text})
    generate = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    draws = []
    for metrics in ([cer], [cer, "loss"]):
        model = tiny_gpt2()
        torch.manual_seed(1)
        trainer = Trainer(model, "adamw", CountingTokens(16), batch_size=8, lr=1e-3, metrics=metrics, max_iter=1,
                          eval_loader=DataLoader(CountingTokens(8), batch_size=4), evaluate_with_generate=generate)
        draws.append(torch.rand(3))
    assert torch.equal(draws[0], draws[1])
    assert trainer.evaluation.metric_names() == ["cer", "loss"]


def test_evaluate_without_a_loss_fn_explains_a_model_that_returns_predictions():
    """Training explained it; evaluate() gave torch's "linear(): argument 'input' ... must be Tensor, not list"."""
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, max_iter=1)
    with pytest.raises(TypeError) as error:
        trainer.evaluate(DataLoader(classification(32, seed=1), batch_size=16))
    assert str(error.value).startswith("the model was given the whole (inputs, targets) batch, as there is no "
                                       "loss_fn, and raised: linear(): argument 'input'")
    assert str(error.value).endswith("A model that returns predictions needs a loss_fn (train.step.loss_fn in a config)")


# ---------------------------------------------------------------------- what needs no evaluation, and what does
def test_metrics_without_evaluation_data_are_warned_in_one_line_and_act_in_evaluate(treadle_caplog):
    """They were accepted without a word, and computed nothing during training."""
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, metrics=["accuracy"],
                      max_iter=2, progress_bar=False)
    assert warnings_of(treadle_caplog) == [
        "metrics=['accuracy'] are computed by evaluation, and no eval_loader is given: they act only in evaluate(loader)"
    ]
    trainer.train()
    assert set(trainer.evaluate(classification(64, seed=1))) == {"accuracy"}


@pytest.mark.parametrize("name", ["train.loss", "train/loss", "train_loss"])
def test_best_metric_on_the_training_loss_needs_no_evaluation_data(name, tmp_path):
    """It was accepted, then failed at iteration 0: "BestCheckpointer('total_loss') needs an EvalHook registered
    before it". It is read at each epoch's end, as the history's train_loss: model_best.pth holds the end of
    the epoch of the lowest one."""
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_epochs=4, seed=0,
                      best_metric=name, output_dir=str(tmp_path), progress_bar=False)
    train_loss = trainer.train().to_dict()["train_loss"]
    epoch = min(range(4), key=lambda e: train_loss[e])
    saved = torch.load(tmp_path / "model_best.pth", weights_only=False)
    assert saved["iteration"] == 8 * epoch + 7
    best_hook = next(h for h in trainer.hooks if type(h).__name__ == "BestCheckpointer")
    assert (best_hook.best_iter, best_hook.best_metric) == (8 * epoch + 7, pytest.approx(train_loss[epoch]))


def test_early_stopping_on_a_training_scalar_needs_no_evaluation_data(tmp_path):
    """best_mode='max' on a falling loss: the second reading is no better, and patience 1 stops the run there."""
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_epochs=5, seed=0,
                      best_metric="train/loss", best_mode="max", early_stopping_patience=1, output_dir=str(tmp_path),
                      progress_bar=False)
    history = trainer.train()
    assert [row["epoch"] for row in history.epochs] == [0, 1]
    assert trainer.last_run_iter == 15


def test_best_metric_on_a_training_scalar_of_a_stream_is_read_every_eval_period(tmp_path):
    with pytest.raises(ValueError) as error:
        Trainer(mlp(), "sgd", _generator(), lr=0.1, loss_fn=CE, max_iter=8, best_metric="train/loss",
                output_dir=str(tmp_path / "refused"))
    assert str(error.value) == (
        "best_metric='train/loss' is a training scalar, read without an eval_loader every eval_period iterations "
        "(default: each epoch), and this train_loader has no length (no epochs): give eval_period"
    )
    assert not (tmp_path / "refused").exists()
    trainer = Trainer(mlp(), "sgd", _generator(), lr=0.1, loss_fn=CE, max_iter=8, best_metric="train/loss",
                      eval_period=4, output_dir=str(tmp_path / "run"), progress_bar=False)
    losses = trainer.train()["total_loss"]
    saved = torch.load(tmp_path / "run" / "model_best.pth", weights_only=False)
    # Each reading is the mean over the eval_period iterations it ends.
    assert saved["iteration"] == min((3, 7), key=lambda i: sum(losses[i - 3:i + 1]))


# ---------------------------------------------------------------------- the table
def _generator():
    return (b for b in DataLoader(classification(), batch_size=32))


#: For each (setting, need) of the table: the arguments that give the setting
#: where the need does not hold (``_model``, ``_optimizer``, ``_data`` replace
#: the positional ones).
CASES = {
    ("metrics", "an evaluation set"): dict(metrics=["accuracy"]),
    ("scheduler", "the optimizer trained"): dict(
        scheduler=torch.optim.lr_scheduler.StepLR(torch.optim.SGD(mlp().parameters(), lr=0.1), 2)),
    ("max_epochs", "epochs"): dict(_data=_generator, max_iter=None, max_epochs=1),
    ("scheduler_interval", "a scheduler"): dict(scheduler_interval="epoch"),
    ("scheduler_interval", "a torch scheduler"): dict(scheduler="cosine", scheduler_interval="epoch"),
    ("scheduler_interval", "epochs"): dict(_data=_generator, scheduler_interval="epoch",
                                           scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2)),
    ("warmup_iters", "a schedule the Trainer builds"): dict(
        warmup_iters=2, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2)),
    ("lr", "a named optimizer"): dict(lr=0.1),
    ("weight_decay", "a named optimizer"): dict(weight_decay=0.01),
    ("no_decay_norm_and_bias", "a named optimizer"): dict(no_decay_norm_and_bias=False),
    ("no_decay_norm_and_bias", "a weight decay"): dict(_optimizer="sgd", lr=0.1, no_decay_norm_and_bias=False),
    ("batch_size", "no total_batch_size"): dict(_data=classification, batch_size=8, total_batch_size=16),
    ("batch_size", "a dataset"): dict(batch_size=8),
    ("total_batch_size", "a dataset"): dict(total_batch_size=8),
    ("eval_batch_size", "an evaluation dataset"): dict(
        eval_loader=DataLoader(classification(16), batch_size=8), eval_batch_size=4),
    ("eval_batch_size", "an evaluation set"): dict(eval_batch_size=4),
    ("shuffle", "a dataset"): dict(shuffle=True),
    ("collate_fn", "a dataset"): dict(collate_fn=default_collate),
    ("num_workers", "a dataset"): dict(num_workers=2),
    ("callbacks", "epochs"): dict(_data=_generator, callbacks=[lambda trainer, epoch, metrics: None]),
    ("checkpoints_dir", "output_dir"): dict(checkpoints_dir="checkpoints"),
    ("logs_dir", "output_dir"): dict(logs_dir="logs"),
    ("loggers", "output_dir"): dict(loggers=["csv"]),
    ("precision", "CUDA"): dict(precision="fp16"),
    ("clip_grad_norm", "no clip_grad_value"): dict(clip_grad_norm=1.0, clip_grad_value=0.5),
    ("eval_period", "an evaluation set"): dict(eval_period=5),
    ("checkpoint_period", "output_dir"): dict(checkpoint_period=5),
    ("max_to_keep", "output_dir"): dict(max_to_keep=2),
    ("max_to_keep", "periodic checkpoints"): dict(_output_dir=True, checkpoint_period=0, max_to_keep=2),
    ("preemption", "output_dir"): dict(preemption=True),
    ("ema_decay", "not FSDP"): dict(ddp="fsdp", ema_decay=0.9),
    ("best_metric", "an evaluation set"): dict(best_metric="accuracy"),
    ("best_metric", "a period to read it"): dict(_data=_generator, best_metric="train/loss", _output_dir=True),
    ("best_metric", "output_dir"): dict(best_metric="accuracy", metrics=["accuracy"],
                                        eval_loader=DataLoader(classification(16), batch_size=8)),
    ("best_mode", "a watched metric"): dict(best_mode="max"),
    ("early_stopping_patience", "an evaluation set"): dict(early_stopping_patience=2),
    ("evaluate_with_generate", "a model that generates"): dict(evaluate_with_generate=True),
    ("evaluate_with_generate", "a metric of the generated tokens"): dict(_model=tiny_gpt2, evaluate_with_generate=True),
    ("ddp", "several processes"): dict(ddp="fsdp"),
    ("dist_timeout", "several processes"): dict(dist_timeout=60),
}


#: The settings that act whatever else is given, and why.
ALWAYS_ACTS = {
    "loss_fn": "the loss of training and evaluation (a compute_loss override may call it)",
    "eval_loader": "evaluated every eval_period and at the end",
    "max_iter": "the run length",
    "hooks": "registered",
    "output_dir": "the run's folder",
    "grad_accum_steps": "the step the Trainer builds accumulates",
    "clip_grad_value": "the step clips (with clip_grad_norm: refused by clip_grad_norm's row)",
    "compile": "the step the Trainer builds is compiled",
    "device": "where the model and batches go",
    "seed": "python, numpy and torch, and the data order",
    "log_period": "the writers' period, or the progress bar's",
    "init_weights_from": "loaded into the model",
    "progress_bar": "shown or not",
    "num_threads": "the CPU threads while train() runs",
}


def test_every_setting_either_always_acts_or_has_a_case_where_it_cannot():
    needs = {(row.name, need.key) for row in SETTINGS for need in row.needs}
    assert needs == set(CASES)
    assert {row.name for row in SETTINGS if not row.needs} == set(ALWAYS_ACTS)


@pytest.mark.parametrize("setting, need", sorted(CASES), ids=[f"{s}-{n}" for s, n in sorted(CASES)])
def test_a_setting_that_cannot_act_is_refused_or_warned_in_one_line(setting, need, tmp_path, treadle_caplog):
    kwargs = dict(CASES[(setting, need)])
    model = (kwargs.pop("_model", None) or mlp)()
    optimizer = kwargs.pop("_optimizer", None) or torch.optim.SGD(model.parameters(), lr=0.1)
    data = (kwargs.pop("_data", None) or (lambda: DataLoader(classification(), batch_size=32)))()
    out = tmp_path / "run"
    if kwargs.pop("_output_dir", False):
        kwargs["output_dir"] = str(out)
    options = dict(loss_fn=CE, max_iter=2, progress_bar=False)
    options.update(kwargs)
    refused = next(n for n in next(r for r in SETTINGS if r.name == setting).needs if n.key == need).refuse
    if refused:
        with pytest.raises(ValueError) as error:
            Trainer(model, optimizer, data, **{k: v for k, v in options.items() if v is not None})
        message = str(error.value)
        assert "\n" not in message and setting.split("_")[0] in message, message
        assert not out.exists()
    else:
        Trainer(model, optimizer, data, **{k: v for k, v in options.items() if v is not None})
        found = [w for w in warnings_of(treadle_caplog) if w.startswith(f"{setting}=")]
        assert len(found) == 1 and "\n" not in found[0], warnings_of(treadle_caplog)


def test_bad_values_are_refused_by_the_rule_of_their_row():
    data = classification()
    for options, message in [
        (dict(scheduler_interval="batch"), "scheduler_interval must be one of 'iter', 'epoch'; got 'batch'"),
        (dict(precision="fp8"), "precision must be one of 'fp32', 'bf16', 'fp16'; got 'fp8'"),
        (dict(log_period=0), "log_period must be an integer >= 1, got 0"),
        (dict(device="tpu"), "device='tpu' is not a device; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
        (dict(progress_bar="yes"), "progress_bar must be one of None, True, False; got 'yes'"),
        (dict(loggers=["jsn"]), "Unknown loggers ['jsn']; choose from ['json', 'tensorboard', 'csv', 'mlflow', 'wandb']"),
        (dict(max_to_keep=0), "max_to_keep must be an integer >= 1 or None, got 0"),
    ]:
        with pytest.raises(ValueError) as error:
            Trainer(mlp(), "sgd", data, batch_size=32, lr=0.1, loss_fn=CE, max_iter=2, **options)
        assert str(error.value) == message


def test_the_signature_docstring_and_table_name_the_same_settings_with_the_same_defaults():
    import inspect

    parameters = list(inspect.signature(Trainer.__init__).parameters.values())[4:]
    assert [p.name for p in parameters] == [row.name for row in SETTINGS]
    for parameter, row in zip(parameters, SETTINGS):
        assert parameter.default == row.default, row.name
    documented = []
    # cleandoc: Python 3.13 strips a docstring's indentation when compiling, earlier ones do not.
    for line in inspect.cleandoc(Trainer.__doc__).split("Args:")[1].splitlines():
        match = re.match(r"^    ([a-z_]+(?:, [a-z_]+)*):", line)
        if match:
            documented += match.group(1).split(", ")
    assert documented[:3] == ["model", "optimizer", "train_loader"]
    assert documented[3:] == [row.name for row in SETTINGS]
    page = (ROOT / "docs" / "trainer.md").read_text()
    start = page.index("<!-- settings table: treadle.trainer.settings_docs.describe() -->\n")
    table = page[page.index("\n", start) + 1:page.index("\n<!-- end of settings table -->")]
    assert table == describe()


def test_docs_coming_from_names_only_settings_of_the_table():
    """Every lowercase name the tables of the "Coming from ..." pages of the
    plain Trainer's seeds give on treadle's side is a row of the table, an
    argument or method of the Trainer, a hook stage, a name of the history,
    or the seed's own name of its row (the generated rows are checked by
    tests/compat/test_names.py; this covers the hand-written ones)."""
    from treadle.engine import HookBase

    names = {row.name for row in SETTINGS}
    trainer_api = {"model", "optimizer", "train_loader", "train", "train_epoch", "evaluate", "compute_loss",
                   "eval_step", "train_step", "save_checkpoint", "load_checkpoint", "resume", "move_aside",
                   "load_optimizer", "load_scheduler"}
    stages = {name for name in vars(HookBase) if name.startswith(("before_", "after_"))}
    history = {"train_loss", "eval_loss", "epoch", "iteration"}
    pages = ("hezar", "pytorch_accelerated", "qurious", "hugging_face", "lightning")
    text = "\n".join((ROOT / "docs" / "coming_from" / f"{page}.md").read_text() for page in pages)
    rows = [line.split("|") for line in text.splitlines() if line.startswith("|") and "---" not in line]
    seeds_names = {name for cells in rows for name in re.findall(r"\w+", cells[1])}
    used = {name for cells in rows if len(cells) > 3 for name in re.findall(r"`([a-z_]+)(?:=|`)", cells[2])}
    assert used - names - trainer_api - stages - history - seeds_names == set()
    assert {"max_epochs", "batch_size", "best_metric", "checkpoint_period", "lr"} <= used
    assert "`no_decay_norm_and_bias=False`" in text and "treadle/trainer/settings.py" in text


def test_the_checks_come_before_anything_is_built(tmp_path):
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="^eval_period=5 is when eval_loader is evaluated"):
        Trainer(model, "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=2, eval_period=5,
                init_weights_from=str(tmp_path / "missing.pth"), output_dir=str(out))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before)) and not out.exists()


def test_a_warning_of_the_checks_reaches_log_txt(tmp_path):
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=2, dist_timeout=60,
                      output_dir=str(tmp_path), progress_bar=False)
    trainer.train()
    log = (tmp_path / "log.txt").read_text()
    assert "WARNING: dist_timeout=60 bounds what several processes wait for each other; this is one process" in log


def test_max_epochs_stopping_before_max_iter_is_warned_about_as_hugging_faces_max_steps_overrides_epochs(
        treadle_caplog):
    # TrainingArguments(max_steps=40, num_train_epochs=3): 40 updates there, 3 epochs of 5 here.
    data = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.randn(10, 1))
    trainer = Trainer(nn.Linear(3, 1), "adamw", data, lr=0.01, batch_size=2, max_iter=40, max_epochs=3,
                      loss_fn=nn.MSELoss(), device="cpu", progress_bar=False)
    assert trainer.max_iter == 15
    assert warnings_of(treadle_caplog) == [
        "max_iter=40 is not reached: max_epochs=3 stops training after 15 iterations (whichever comes first); leave "
        "max_epochs out to train max_iter iterations (Hugging Face's max_steps)"]
    treadle_caplog.clear()
    Trainer(nn.Linear(3, 1), "adamw", data, lr=0.01, batch_size=2, max_iter=10, max_epochs=3, loss_fn=nn.MSELoss(),
            device="cpu", progress_bar=False)
    assert warnings_of(treadle_caplog) == []  # max_iter stops first, as Hugging Face's max_steps


# ---------------------------------------------------------------------- the settings, typed and grouped
def test_the_trainer_keeps_its_settings_by_purpose_typed_frozen_and_by_name():
    """Hezar's user's settings come back where the groups put them; the old flat reads still work."""
    import dataclasses

    from treadle.trainer.settings import TrainerSettings

    trainer = Trainer(mlp(), "adamw", classification(), batch_size=32, lr=1e-3, loss_fn=CE, max_epochs=2,
                      eval_loader=classification(64, seed=1), eval_period=4, metrics=["accuracy"], progress_bar=False)
    s = trainer.settings
    assert isinstance(s, TrainerSettings)
    assert (s.data.batch_size, s.optimization.lr, s.optimization.max_epochs) == (32, 1e-3, 2)
    assert (s.evaluation.eval_period, list(s.evaluation.metrics), s.checkpoints.output_dir) == (4, ["accuracy"], None)
    assert (s.processes.dist_timeout, s.logging.log_period, s.data.shuffle) == (300.0, 20, True)
    with pytest.warns(DeprecationWarning, match="is removed in treadle 0.10"):  # the flat reads of 0.8.0
        assert (s.eval_period, s.batch_size, s.dist_timeout) == (4, 32, 300.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.evaluation.eval_period = 8
    with pytest.raises(AttributeError, match="^TrainerSettings has no setting 'eval_steps'$"):
        _ = s.eval_steps


def _admits(annotation, value) -> bool:
    """Whether ``value`` is of the type ``annotation`` (the forms the settings' fields use)."""
    import collections.abc
    import typing

    if annotation is typing.Any:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return any(_admits(arg, value) for arg in args)
    if origin is collections.abc.Callable:
        return callable(value)
    if origin in (collections.abc.Sequence, collections.abc.Iterable):
        return isinstance(value, origin) and all(_admits(args[0], v) for v in value)
    return isinstance(value, origin or annotation)


def test_the_table_is_the_fields_of_the_groups_each_typed_with_its_default():
    """The table's rows are the settings dataclasses' fields: same names, in
    order, each default of its field's type and accepted by its row's rule."""
    import dataclasses
    import typing

    from treadle.engine.history import EpochCallback
    from treadle.trainer import settings

    names = {"data", "optimization", "evaluation", "checkpoints", "logging", "processes"}
    assert [name for name, _ in settings.GROUPS] == [f.name for f in dataclasses.fields(settings.TrainerSettings)]
    assert set(dict(settings.GROUPS)) == names
    fields = [(name, f) for name, group in settings.GROUPS for f in dataclasses.fields(group)]
    assert [(row.name, row.group, row.default) for row in SETTINGS] == [(f.name, g, f.default) for g, f in fields]
    for name, group in settings.GROUPS:
        assert dataclasses.is_dataclass(group) and group.__dataclass_params__.frozen, name
        types = typing.get_type_hints(group, {**vars(settings), "torch": torch, "EpochCallback": EpochCallback})
        for f in dataclasses.fields(group):
            assert _admits(types[f.name], f.default), (f.name, types[f.name], f.default)
    assert typing.get_type_hints(settings.EvaluationSettings, vars(settings))["eval_period"] == typing.Optional[int]
    for row in SETTINGS:
        if row.rule is not None and row.default is not None:
            row.rule(row.name, row.default)  # raises where the rule refuses its own default


def test_the_trainers_api_entry_is_its_arguments_then_its_settings_by_group():
    """The reference shows Trainer(model, optimizer, train_loader, **settings), then a
    section per group (named in docs/conf.py) listing its settings; docs/trainer.md a table per group."""
    import inspect

    from treadle.trainer.settings import GROUPS
    from treadle.trainer.settings_docs import section_title

    doc = inspect.getdoc(Trainer)
    assert doc.splitlines()[0] == "Trainer(model, optimizer, train_loader, **settings)"
    sections = re.findall(r"^(\w+ settings):\n((?:    .*\n?)+)", doc, re.M)
    assert [title for title, _ in sections] == [section_title(name) for name, _ in GROUPS]
    assert [title for title, _ in sections][3:] == ["Checkpoint settings", "Logging settings", "Process settings"]
    for (title, body), (name, _) in zip(sections, GROUPS):
        listed = re.findall(r"^    (\w+): ", body, re.M)
        assert listed == [row.name for row in SETTINGS if row.group == name], title
    assert "eval_period: ``Optional[int]``, default ``None``." in doc
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert "napoleon_custom_sections = [(section_title(group), \"params_style\") for group, _ in GROUPS]" in conf
    page = (ROOT / "docs" / "trainer.md").read_text()
    assert re.findall(r"^### (\w+ settings)$", page, re.M) == [title for title, _ in sections]
