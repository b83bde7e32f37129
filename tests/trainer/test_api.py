"""The plain Trainer with what the seeds' users bring: Hugging Face models,
torchmetrics, datasets, callbacks, checkpoints by path, one-batch calls."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from treadle.trainer import Trainer
from treadle.events import get_event_storage

from tests.tiny_models import CountingTokens, classification, tiny_gpt2


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def make(**kwargs):
    options = dict(batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy, progress_bar=False, seed=0)
    options.update(kwargs)
    return Trainer(options.pop("model", None) or mlp(), options.pop("optimizer", "sgd"), options.pop("data", None) or classification(), **options)


# ---------------------------------------------------------------------- Hugging Face
def test_hugging_face_gpt2_trains_evaluates_resumes_and_loads_back_bare(tmp_path):
    def gpt2_trainer(out, max_iter):
        return Trainer(
            tiny_gpt2(), "adamw", CountingTokens(64), batch_size=8, lr=3e-3, eval_loader=CountingTokens(16, seed=1),
            eval_batch_size=8, metrics=["perplexity", "loss"], max_iter=max_iter, checkpoint_period=10,
            output_dir=str(out), progress_bar=False, seed=0,
        )

    straight = gpt2_trainer(tmp_path / "a", 30)
    history = straight.train()
    losses = history["total_loss"]
    assert losses[-1] < losses[0] * 0.7  # it learns to count
    first = gpt2_trainer(tmp_path / "b", 30)
    first.max_iter = 20  # stopped after 20 iterations, then resumed to 30
    first.train()
    resumed = gpt2_trainer(tmp_path / "b", 30)
    resumed.train(resume=True)
    a = torch.load(tmp_path / "a" / "model_final.pth", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "model_final.pth", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The weights load into a bare Hugging Face model: no wrapper prefix.
    bare = tiny_gpt2(seed=1)
    assert not bare.load_state_dict(a, strict=True).missing_keys
    assert resumed.evaluate()["perplexity"] < 32  # better than uniform over the vocabulary


# ---------------------------------------------------------------------- metrics
def test_torchmetrics_metric_beside_metric_names():
    from torchmetrics.classification import MulticlassAUROC

    trainer = make(eval_loader=classification(128, seed=1), eval_batch_size=64, max_epochs=2,
                   metrics=["accuracy", MulticlassAUROC(num_classes=2), ("auc_named", MulticlassAUROC(num_classes=2))])
    history = trainer.train()
    row = history.epochs[-1]
    assert isinstance(row["multiclass_auroc"], float) and 0.5 < row["multiclass_auroc"] <= 1.0
    assert row["auc_named"] == pytest.approx(row["multiclass_auroc"])
    assert trainer.evaluate()["accuracy"] == pytest.approx(row["accuracy"])


def test_best_metric_of_a_torchmetrics_metric_follows_its_declared_direction(tmp_path):
    from torchmetrics.regression import MeanSquaredError

    trainer = make(eval_loader=classification(64, seed=1), max_epochs=2, output_dir=str(tmp_path),
                   metrics=[("calibration", MeanSquaredError())], best_metric="calibration")
    best = next(h for h in trainer.hooks if type(h).__name__ == "BestCheckpointer")
    assert best.mode == "min"  # torchmetrics says lower is better; the name says nothing


def test_unknown_metric_fails_when_the_trainer_is_built():
    with pytest.raises(KeyError, match="unknown metric 'acuracy'"):
        make(eval_loader=classification(64), max_iter=1, metrics=["acuracy"])
    with pytest.raises(ValueError, match="best_metric='acuracy' is not a result of the evaluation; did you mean 'accuracy'"):
        make(eval_loader=classification(64), max_iter=1, metrics=["accuracy", "f1"], best_metric="acuracy", output_dir="unused")


def test_metric_with_its_own_options():
    """Hezar's cer needs a decoder from predictions to text."""
    decode = lambda logits: ["".join("ab"[i] for i in row) for row in logits.argmax(-1).reshape(-1, 1).tolist()]  # noqa: E731
    targets = lambda y: ["ab"[int(i)] for i in y]  # noqa: E731
    trainer = make(eval_loader=classification(64, seed=1), eval_batch_size=64, max_iter=8,
                   metrics=[("cer", {"decode": decode, "decode_targets": targets}), "accuracy"])
    trainer.train()
    results = trainer.evaluate()
    assert results["cer"] == pytest.approx(1 - results["accuracy"])


@pytest.mark.parametrize("name", ["accuracy", "eval/accuracy", "evaluation.accuracy", "eval_accuracy"])
def test_best_metric_prefixes(tmp_path, name):
    trainer = make(eval_loader=classification(64, seed=1), max_epochs=1, metrics=["accuracy"], best_metric=name,
                   output_dir=str(tmp_path))
    best = next(h for h in trainer.hooks if type(h).__name__ == "BestCheckpointer")
    assert (best.metric, best.mode) == ("accuracy", "max")


def test_early_stopping_on_the_best_metric():
    class Flat(nn.Module):  # never improves: the evaluation loss is the same every epoch
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.zeros(len(x), 2) + 0 * self.w

    trainer = make(model=Flat(), eval_loader=classification(64, seed=1), max_epochs=20, early_stopping_patience=2)
    history = trainer.train()
    assert len(history.epochs) == 3  # the first evaluation, then two without improvement
    assert trainer.stop_reason is not None and "loss" in trainer.stop_reason


def test_train_epoch_after_early_stopping_says_early_stopping_ended_the_run():
    """It said "every iteration of the run (max_iter=160) has been trained", after 3 of 20 epochs."""

    class Flat(nn.Module):  # never improves
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.zeros(len(x), 2) + 0 * self.w

    trainer = make(model=Flat(), eval_loader=classification(64, seed=1), max_epochs=20, early_stopping_patience=2)
    trainer.train()
    with pytest.raises(RuntimeError) as error:
        trainer.train_epoch()
    message = str(error.value)
    assert message.startswith("train_epoch(): the run was stopped at epoch 2 (iteration 23 of max_iter=160) by early "
                              "stopping: loss has not improved by more than 0.0 for 2 evaluation(s); best 0.69")
    assert message.endswith(" at iteration 7; build a new Trainer to train more") and "\n" not in message


def test_evaluate_a_loader_without_metrics_reports_the_loss_over_it():
    """No eval_loader, no metrics: evaluate(loader) is the loss per sample over
    the loader (a short last batch counts for what it holds), not a refusal."""
    trainer = make(max_iter=3, loggers=())
    trainer.train()
    data = classification(100, seed=1)
    loader = torch.utils.data.DataLoader(data, batch_size=32)  # 32, 32, 32, 4
    results = trainer.evaluate(loader)
    x, y = data.tensors
    with torch.no_grad():
        by_hand = sum(nn.functional.cross_entropy(trainer.model(xb), yb, reduction="sum")
                      for xb, yb in zip(x.split(32), y.split(32))) / len(y)
    assert set(results) == {"loss"}
    assert results["loss"] == pytest.approx(float(by_hand), rel=1e-6)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_best_mode_against_the_metrics_direction_is_warned_about_in_one_line(tmp_path, treadle_caplog):
    trainer = make(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_iter=2, best_metric="accuracy",
                   best_mode="min", output_dir=str(tmp_path / "a"))
    assert _warnings(treadle_caplog) == [
        "best_mode='min' contradicts best_metric='accuracy', which is better when higher: the best checkpoint "
        "and early stopping will favour its lowest values"
    ]
    best = next(h for h in trainer.hooks if type(h).__name__ == "BestCheckpointer")
    assert best.mode == "min"  # a warning: what the user asked for is kept
    treadle_caplog.clear()
    make(eval_loader=classification(64, seed=1), max_iter=2, early_stopping_patience=2, best_mode="max")
    make(max_iter=2, best_metric="train/loss", best_mode="max", output_dir=str(tmp_path / "b"))
    assert _warnings(treadle_caplog) == [
        "best_mode='max' contradicts early stopping's metric='loss', which is better when lower: the best "
        "checkpoint and early stopping will favour its highest values",
        "best_mode='max' contradicts best_metric='train/loss', which is better when lower: the best "
        "checkpoint and early stopping will favour its highest values",
    ]
    treadle_caplog.clear()
    # Agreeing, or a metric whose direction nothing tells: nothing said.
    make(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_iter=2, best_metric="accuracy",
         best_mode="max", output_dir=str(tmp_path / "c"))
    make(eval_loader=classification(64, seed=1), max_iter=2, early_stopping_patience=2, best_mode="min")
    assert _warnings(treadle_caplog) == []


def test_early_stopping_on_a_loss_the_metrics_leave_out_warns_and_evaluates_the_loss(treadle_caplog):
    """early_stopping_patience without best_metric watches the loss; with
    metrics=["accuracy"] this was an error about a best_metric='loss' that the
    user never set."""
    trainer = make(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_iter=2, early_stopping_patience=3)
    assert _warnings(treadle_caplog) == [
        "early_stopping_patience=3 watches the evaluation 'loss' (no best_metric is given), which the metrics "
        "leave out (the evaluation computes: accuracy): the loss is evaluated too; give best_metric= to watch "
        "another metric"
    ]
    stop = next(h for h in trainer.hooks if type(h).__name__ == "EarlyStopping")
    assert (stop.metric, stop.mode) == ("loss", "min")
    assert set(trainer.evaluate()) == {"accuracy", "loss"}
    treadle_caplog.clear()
    make(eval_loader=classification(64, seed=1), metrics=["accuracy", "loss"], max_iter=2, early_stopping_patience=3)
    assert _warnings(treadle_caplog) == []


def test_evaluate_with_generate_scores_the_generated_tokens_cer_by_hand():
    from tests.tiny_models import VOCAB

    class Prompts(torch.utils.data.Dataset):  # the first 4 tokens of a count; the next 3 are to be generated
        def __init__(self):
            self.ids = CountingTokens(12, seed=1).ids[:, :4]

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            ids = self.ids[i]
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    letters = "abcdefghijklmnopqrstuvwxyz0123456789"

    def text(rows):
        return ["".join(letters[t % len(letters)] for t in row.tolist()) for row in rows]

    def decode(generated):  # what was generated after the prompt
        return text(generated[:, 4:])

    def decode_targets(labels):  # the count goes on
        return text((labels[:, -1:] + torch.arange(1, 4)) % VOCAB)

    generate = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    trainer = Trainer(tiny_gpt2(), "adamw", CountingTokens(64), batch_size=8, lr=3e-3, eval_loader=Prompts(),
                      eval_batch_size=4, metrics=[("cer", {"decode": decode, "decode_targets": decode_targets}), "loss"],
                      max_iter=10, progress_bar=False, seed=0, evaluate_with_generate=generate)
    history = trainer.train()
    got = history.epochs[-1] if history.epochs else trainer.evaluate()

    def levenshtein(a, b):
        row = list(range(len(b) + 1))
        for i, x in enumerate(a, 1):
            prev, row[0] = row[0], i
            for j, y in enumerate(b, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
        return row[-1]

    trainer.model.eval()
    errors = chars = 0
    losses = []
    with torch.no_grad():
        for start in range(0, 12, 4):
            batch = torch.utils.data.default_collate([Prompts()[i] for i in range(start, start + 4)])
            losses.append(trainer.model(**batch).loss.item())
            out = trainer.model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **generate)
            for hyp, ref in zip(decode(out), decode_targets(batch["labels"])):
                errors, chars = errors + levenshtein(hyp, ref), chars + len(ref)
    assert chars == 36
    assert trainer.evaluate()["cer"] == pytest.approx(errors / chars)
    assert got["cer"] == pytest.approx(errors / chars)
    # The loss is the forward's (on the labels), beside the generated tokens' metric.
    assert trainer.evaluate()["loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    assert got["loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    with pytest.raises(ValueError, match="needs a model with a generate"):
        make(eval_loader=classification(32), evaluate_with_generate=True, max_iter=1)


# ---------------------------------------------------------------------- data
def test_datasets_with_shuffle_collate_fn_and_eval_batch_size():
    sizes, first = [], []

    def collate(samples):
        sizes.append(len(samples))
        if not first:
            first.extend(samples)
        x = torch.stack([s[0] for s in samples])
        y = torch.stack([s[1] for s in samples])
        return x, y

    trainer = make(data=classification(64), batch_size=16, shuffle=False, collate_fn=collate,
                   eval_loader=classification(40, seed=1), eval_batch_size=20, max_epochs=1)
    trainer.train()
    assert sizes[:4] == [16, 16, 16, 16] and sizes[4:6] == [20, 20]  # train batches, then evaluation's
    data = classification(64)
    assert all(torch.equal(first[i][0], data[i][0]) for i in range(16))  # shuffle=False: in order


def test_a_list_of_examples_is_an_eval_dataset_and_eval_batch_size_with_batches_is_refused(tmp_path):
    """A list of examples is a dataset, as torch's DataLoader takes it: batched
    by eval_batch_size (it used to be taken as a list of one-example batches).
    Ready batches (a DataLoader) are taken as they are; a batch size given for
    them would be ignored, so it is refused before anything is written."""
    examples = [classification(12, seed=1)[i] for i in range(12)]
    trainer = make(eval_loader=examples, eval_batch_size=4, metrics=["accuracy", "loss"], max_iter=2)
    by_loader = trainer.evaluate(torch.utils.data.DataLoader(classification(12, seed=1), batch_size=4))
    assert [len(b[0]) for b in trainer.eval_loader] == [4, 4, 4]
    assert trainer.evaluate() == pytest.approx(by_loader)
    batches = torch.utils.data.DataLoader(
        [tuple(torch.stack(t) for t in zip(*examples[i:i + 4])) for i in range(0, 12, 4)], batch_size=None)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"eval_batch_size is for a dataset; this eval_loader \(DataLoader\) is taken as its own batches"):
        make(eval_loader=batches, eval_batch_size=4, max_iter=2, output_dir=str(out))
    assert not out.exists()
    # Batches made by the user stay welcome, with or without the training batch_size.
    trainer = make(eval_loader=batches, metrics=["accuracy"], max_iter=2)
    assert set(trainer.evaluate()) == {"accuracy"}


def test_reduce_lr_on_plateau_is_refused_when_the_trainer_is_built_not_after_an_epoch(tmp_path):
    """torch's ReduceLROnPlateau is an LRScheduler by class, but its step needs
    a metric: it used to be taken, then fail after the first epoch of training."""
    from functools import partial

    out = tmp_path / "run"
    plateau = partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=1)
    with pytest.raises(TypeError, match=r"^ReduceLROnPlateau is not supported: it steps on a metric value"):
        make(scheduler=plateau, scheduler_interval="epoch", eval_loader=classification(16, seed=1), max_epochs=2,
             output_dir=str(out))
    assert not out.exists()


def test_epochs_whose_batches_do_not_divide_into_accumulated_updates_are_announced(treadle_caplog):
    """10 batches, 4 per update: an epoch is 2 updates and 2 batches carry
    over (the peers end each epoch with a short update instead); said when
    the trainer is built, and what training then does matches the line."""
    trainer = make(data=classification(80), batch_size=8, grad_accum_steps=4, max_epochs=2)
    warnings = [r.getMessage() for r in treadle_caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "10 batches per epoch is not a multiple of grad_accum_steps=4: an epoch is 2 updates (8 batches), "
        "and the 2 batches left over begin the next epoch's first update"
    ]
    assert trainer.max_iter == 4
    treadle_caplog.clear()
    make(data=classification(64), batch_size=8, grad_accum_steps=4, max_epochs=2)  # 8 batches: 2 whole updates
    make(data=classification(80), batch_size=8, grad_accum_steps=4, max_iter=3)  # no epochs asked for
    assert [r for r in treadle_caplog.records if r.levelname == "WARNING"] == []


@pytest.mark.parametrize("options, message", [
    (dict(lr="fast"), "lr must be a positive number, got 'fast'"),
    (dict(lr=0), "lr must be a positive number, got 0"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(eval_loader=classification(8, seed=1), eval_batch_size=2.5), "eval_batch_size must be an integer >= 1, got 2.5"),
])
def test_bad_numbers_are_named_by_the_trainers_own_argument(tmp_path, options, message):
    out = tmp_path / "run"
    with pytest.raises(ValueError) as caught:
        make(max_iter=2, output_dir=str(out), **options)
    assert str(caught.value) == message
    assert not out.exists()


def test_a_sequence_without_iter_is_a_dataset_as_torch_takes_it_and_anything_else_is_refused():
    """Python iterates an object with __getitem__ and __len__ alone (the
    sequence protocol), and torch's DataLoader takes it for a map-style
    dataset: the Trainer takes it as it takes a list, batched by batch_size."""
    torch.manual_seed(0)
    samples = [(torch.randn(6), torch.randint(0, 2, ())) for _ in range(32)]

    class Samples:
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            return samples[i]

    model = nn.Linear(6, 2)
    trainer = Trainer(model, "sgd", Samples(), batch_size=8, loss_fn=nn.functional.cross_entropy, lr=0.1,
                      max_epochs=2, device="cpu", progress_bar=False)
    assert trainer.max_iter == 8
    trainer.train()
    assert len(trainer.history.epochs) == 2
    with pytest.raises(ValueError, match=r"^train_loader is a Samples of samples \(\(Tensor\[6\], Tensor\[\]\) each\): give batch_size="):
        Trainer(nn.Linear(6, 2), "sgd", Samples(), loss_fn=nn.functional.cross_entropy, lr=0.1, max_iter=2, device="cpu")
    with pytest.raises(TypeError, match="train_loader must be an iterable of batches or a dataset, got int"):
        Trainer(nn.Linear(6, 2), "sgd", 3, loss_fn=nn.functional.cross_entropy, lr=0.1, max_iter=2, device="cpu")


def test_max_iter_and_max_epochs_whichever_first():
    assert make(max_iter=5, max_epochs=3).max_iter == 5
    assert make(max_iter=500, max_epochs=3).max_iter == 24


# ---------------------------------------------------------------------- epochs, callbacks, history
def test_callbacks_see_each_epochs_metrics_the_last_one_included():
    seen = []
    trainer = make(eval_loader=classification(64, seed=1), metrics=["accuracy", "loss"], max_epochs=3,
                   callbacks=[lambda t, epoch, metrics: seen.append((epoch, t.iter, sorted(metrics)))])
    history = trainer.train()
    assert [(e, it) for e, it, _ in seen] == [(0, 7), (1, 15), (2, 23)]
    for _, _, names in seen:
        assert {"accuracy", "eval_loss", "loss", "train_loss", "total_loss", "lr", "epoch", "iteration"} <= set(names)
    table = history.to_dict()
    assert table["epoch"] == [0, 1, 2] and len(table["accuracy"]) == 3 and len(table["train_loss"]) == 3
    assert table["train_loss"] == [e["total_loss"] for e in history.epochs]


def _halve_lr(trainer, epoch, metrics):
    for group in trainer.optimizer.param_groups:
        group["lr"] *= 0.5


def test_without_a_scheduler_a_rate_changed_by_a_callback_stays_changed():
    # A hand-written loop's "lr *= 0.5 after each epoch": without a scheduler
    # nothing sets the rate back. The same halving from StepLR every epoch
    # (8 iterations) trains the same weights.
    by_hand = make(max_epochs=3, callbacks=[_halve_lr])
    history = by_hand.train()
    scheduled = make(max_epochs=3, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 8, 0.5))
    scheduled.train()
    assert [e["lr"] for e in history.epochs] == [0.1, 0.05, 0.025]
    assert history["lr"] == [0.1] * 8 + [0.05] * 8 + [0.025] * 8
    assert all(torch.equal(a, b) for a, b in zip(by_hand.model.parameters(), scheduled.model.parameters()))


def test_without_a_scheduler_every_iteration_has_the_rate_its_step_used_a_callbacks_change_included():
    trainer = make(max_epochs=3, log_period=5, callbacks=[_halve_lr], output_dir=None)
    history = trainer.train()
    assert history["lr"] == [0.1] * 8 + [0.05] * 8 + [0.025] * 8


def test_without_a_scheduler_a_float_rate_a_callback_makes_a_tensor_is_published_too():
    def to_tensor(trainer, epoch, metrics):
        for group in trainer.optimizer.param_groups:
            group["lr"] = group["lr"] * 0.5 if isinstance(group["lr"], torch.Tensor) else torch.tensor(group["lr"] * 0.5)

    history = make(max_epochs=2, callbacks=[to_tensor]).train()
    assert history["lr"] == pytest.approx([0.1] * 8 + [0.05] * 8)
    assert all(type(lr) is float for lr in history["lr"])


def test_without_a_scheduler_a_tensor_rate_changed_in_place_is_published_and_its_start_kept():
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))
    halve = lambda t, epoch, m: [g["lr"].mul_(0.5) for g in t.optimizer.param_groups]  # noqa: E731
    history = make(model=model, optimizer=optimizer, lr=None, max_epochs=2, callbacks=[halve]).train()
    assert history["lr"] == pytest.approx([0.01] * 8 + [0.005] * 8)
    # The starting rate a resume compares with is a copy, not the tensor halved since.
    assert optimizer.param_groups[0]["initial_lr"].item() == pytest.approx(0.01)


def test_without_a_scheduler_a_resume_goes_on_at_the_rate_a_callback_left(tmp_path, treadle_caplog):
    straight = make(max_epochs=3, callbacks=[_halve_lr], output_dir=str(tmp_path / "a"))
    straight.train()
    resumed = make(max_epochs=3, callbacks=[_halve_lr], output_dir=str(tmp_path / "b"))
    # Taken at the end of the second epoch, after its callback halved the rate twice.
    resumed.train(resume=str(tmp_path / "a" / "model_0000015.pth"))
    assert resumed.start_iter == 16
    assert resumed.history["lr"] == [0.1] * 8 + [0.05] * 8 + [0.025] * 8  # the restored history, then its own
    # The checkpoint's rate is where the run was, not a hyperparameter the trainer changed.
    assert "Resuming with" not in treadle_caplog.text
    a = torch.load(tmp_path / "a" / "model_final.pth", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "model_final.pth", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_callback_may_stop_training():
    trainer = make(max_epochs=10, callbacks=[lambda t, epoch, m: t.request_stop("enough") if epoch == 1 else None])
    history = trainer.train()
    assert len(history.epochs) == 2 and trainer.iter == 16


def test_history_after_a_resume_holds_every_epoch_and_calls_back_each_epoch_once(tmp_path):
    from treadle.hooks import CallbackHook

    def run(out, stop_at=None, resume=False):
        seen = []
        trainer = make(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_epochs=3,
                       output_dir=str(out), checkpoint_period=3, callbacks=[lambda t, e, m: seen.append(e)])
        if stop_at is not None:  # cut in epoch 1 (iterations 8..15), after the checkpoint of iteration 11
            trainer.register_hooks([CallbackHook(
                after_step=lambda t: t.request_stop("cut", interrupted=True) if t.iter == stop_at else None)])
        return trainer.train(resume=resume), seen

    straight, _ = run(tmp_path / "a")
    first, seen_first = run(tmp_path / "b", stop_at=12)
    assert [row["epoch"] for row in first.epochs] == [0] and seen_first == [0]
    resumed, seen_resumed = run(tmp_path / "b", resume=True)
    # Epoch 0's row comes from the checkpoint; its callback ran in the first process only.
    assert seen_resumed == [1, 2]
    assert len(resumed.epochs) == 3
    def values(rows):  # the timings differ from run to run
        return [{k: v for k, v in row.items() if k not in ("time", "data_time")} for row in rows]

    assert values(resumed.epochs) == values(straight.epochs)
    assert set(resumed.epochs[0]) == set(straight.epochs[0]) >= {"train_loss", "accuracy", "lr", "time"}
    # By hand: epoch 1's train_loss is the mean of its 8 iterations' losses.
    losses = straight["total_loss"]
    assert resumed.epochs[1]["train_loss"] == pytest.approx(sum(losses[8:16]) / 8, rel=1e-12)
    assert resumed.to_dict()["accuracy"] == [row["accuracy"] for row in straight.epochs]


def test_train_epoch_trains_the_next_epoch_and_returns_its_row_as_one_train_would(tmp_path):
    options = dict(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_epochs=3, scheduler="cosine")
    whole = make(output_dir=str(tmp_path / "a"), **options)
    history = whole.train()
    by_epoch = make(output_dir=str(tmp_path / "b"), **options)
    rows = [by_epoch.train_epoch() for _ in range(3)]

    def values(rows):  # the timings differ from run to run
        return [{k: v for k, v in row.items() if k not in ("time", "data_time")} for row in rows]

    assert [row["epoch"] for row in rows] == [0, 1, 2] and "accuracy" in rows[0]
    assert values(rows) == values(history.epochs) == values(by_epoch.history.epochs)
    # By hand: epoch 1's train_loss is the mean of its 8 iterations' losses.
    losses = by_epoch.history["total_loss"]
    assert len(losses) == 24
    assert rows[1]["train_loss"] == pytest.approx(sum(losses[8:16]) / 8, rel=1e-12)
    for p, q in zip(whole.model.parameters(), by_epoch.model.parameters()):
        assert torch.equal(p, q)
    # Paused between calls as a preempted run (no model_final), ended by the last one.
    assert (tmp_path / "b" / "model_final.pth").exists()
    with pytest.raises(RuntimeError, match="every iteration of the run"):
        by_epoch.train_epoch()


def test_a_run_preempted_at_its_last_iteration_resumes_with_every_epochs_row(tmp_path):
    """The last epoch ends in its last iteration, before the preemption's
    checkpoint (taken when the iteration ends): the resumed run, which only
    finishes, has that epoch's row, the final evaluation in it, as an
    uninterrupted run has."""
    import os
    import signal

    from treadle.hooks import CallbackHook, PreemptionHandler

    options = dict(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_epochs=3)
    straight = make(output_dir=str(tmp_path / "straight"), **options).train()
    signal_at_the_end = CallbackHook(after_step=lambda t: t.iter == t.max_iter - 1 and os.kill(os.getpid(), signal.SIGUSR1))
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        preempted = make(output_dir=str(tmp_path / "run"), hooks=[PreemptionHandler(exit_code=None), signal_at_the_end], **options)
        preempted.train()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert preempted.interrupted and not (tmp_path / "run" / "model_final.pth").exists()
    resumed = make(output_dir=str(tmp_path / "run"), **options)
    history = resumed.train(resume=True)
    assert resumed.start_iter == resumed.max_iter == 24 and resumed.finished

    def values(rows):  # the timings differ from run to run
        return [{k: v for k, v in row.items() if k not in ("time", "data_time")} for row in rows]

    assert [row["epoch"] for row in history.epochs] == [0, 1, 2]
    assert values(history.epochs) == values(straight.epochs)


def test_train_epoch_pauses_without_the_end_of_training():
    trainer = make(max_epochs=2)
    row = trainer.train_epoch()
    assert row["epoch"] == 0 and trainer.interrupted and not trainer.finished
    assert trainer.train_epoch()["epoch"] == 1 and trainer.finished


# ---------------------------------------------------------------------- checkpoints
def test_resume_from_a_given_checkpoint(tmp_path):
    straight = make(max_iter=24, checkpoint_period=8, output_dir=str(tmp_path / "a"))
    straight.train()
    resumed = make(max_iter=24, output_dir=str(tmp_path / "b"))
    resumed.train(resume=str(tmp_path / "a" / "model_0000015.pth"))
    assert resumed.start_iter == 16
    a = torch.load(tmp_path / "a" / "model_final.pth", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "model_final.pth", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_from_a_folder_names_the_checkpoint_file_to_give(tmp_path):
    """It said the checkpoint was "truncated or corrupt: IsADirectoryError"."""
    from treadle.checkpoint import CheckpointError

    make(max_iter=8, output_dir=str(tmp_path / "a")).train()
    trainer = make(max_iter=8, output_dir=str(tmp_path / "b"))
    with pytest.raises(CheckpointError) as error:
        trainer.train(resume=str(tmp_path / "a"))
    assert str(error.value) == (
        f"'{tmp_path / 'a'}' is a run folder, not a checkpoint file: give the checkpoint file inside it "
        f"('{tmp_path / 'a' / 'model_final.pth'}' is its last), or resume the run from its folder (resume=True "
        "with it as the output folder)"
    )
    assert not (tmp_path / "b").exists()  # refused before the run's folder is claimed
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"is a folder, not a checkpoint file .*: give a checkpoint file \(\.pth\)$"):
        trainer.load_checkpoint(str(tmp_path / "empty"))


def test_save_and_load_checkpoint_without_an_output_dir(tmp_path):
    trainer = make(max_iter=10, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, 0.5))
    trainer.train()
    path = tmp_path / "ckpt" / "my.pt"
    assert trainer.save_checkpoint(str(path), note="qurious") == str(path)
    other = make(max_iter=10, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, 0.5))
    extra = other.load_checkpoint(str(path))
    assert extra["note"] == "qurious" and extra["iteration"] == 9
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), other.model.parameters()))
    assert other.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()
    lr_hook = next(h for h in other.hooks if type(h).__name__ == "LRScheduler")
    assert lr_hook.state_dict()["last_epoch"] == 10  # the schedule's position came back
    weights_only = make(max_iter=10)
    weights_only.load_checkpoint(str(path), load_optimizer=False, load_scheduler=False)
    assert weights_only.optimizer.state_dict()["state"] == {}


# ---------------------------------------------------------------------- one batch at a time
def test_train_step_and_eval_step_return_floats_outside_train():
    trainer = make(eval_loader=classification(64, seed=1), metrics=["accuracy"], max_iter=1)
    batch = next(iter(torch.utils.data.DataLoader(classification(), batch_size=32)))
    before = trainer.eval_step(batch)
    for _ in range(30):
        step = trainer.train_step(batch)
    after = trainer.eval_step(batch)
    assert isinstance(step["loss"], float) and set(after) == {"loss", "accuracy"}
    assert after["loss"] < before["loss"] and after["accuracy"] >= before["accuracy"]
    assert trainer.model.training  # eval_step restored the mode


def test_compute_loss_overridden_in_a_trainer_subclass():
    class Regularized(Trainer):
        def compute_loss(self, batch):
            x, y = batch
            return {"ce": nn.functional.cross_entropy(self.model(x), y), "l2": 1e-3 * self.model[0].weight.pow(2).sum()}

    trainer = Regularized(mlp(), "sgd", classification(), batch_size=32, lr=0.1, max_iter=5, grad_accum_steps=2,
                          clip_grad_norm=1.0, progress_bar=False)
    history = trainer.train()
    assert {"ce", "l2", "total_loss"} <= set(history.iterations)



class LoggingTrainer(Trainer):
    """docs/coming_from/lightning.md's port of self.log in training_step: a training-only scalar."""

    modes = None

    def compute_loss(self, batch):
        x, y = batch
        logits = self.model(x)
        self.modes.append(self.model.training)
        if self.model.training:  # training_step's self.log: evaluation calls compute_loss too
            get_event_storage().put_scalar("train_acc", (logits.argmax(-1) == y).float().mean())
        return nn.functional.cross_entropy(logits, y)


def test_compute_loss_tells_training_from_evaluation_by_the_models_mode():
    """Evaluation calls compute_loss too (the eval_loss); self.model.training is False there, in eval_loader's
    evaluations, evaluate() and eval_step(): the epoch's train_acc is the mean over its training batches only."""
    train_loader = torch.utils.data.DataLoader(classification(), batch_size=32)
    eval_loader = torch.utils.data.DataLoader(classification(64, seed=1), batch_size=32)
    trainer = LoggingTrainer(mlp(), "sgd", train_loader, lr=0.5, max_epochs=2, eval_loader=eval_loader,
                             progress_bar=False)
    trainer.modes = []
    history = trainer.train().to_dict()
    # Each epoch: 8 training batches, then 2 evaluation batches (the evaluation after training is the last epoch's).
    assert trainer.modes == ([True] * 8 + [False] * 2) * 2
    trainer.modes = []
    trainer.evaluate()
    assert trainer.modes == [False, False]
    trainer.modes = []
    trainer.eval_step(next(iter(eval_loader)))
    assert trainer.modes and not any(trainer.modes)

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_acc = []
    for _ in range(2):
        accuracies = []
        for x, y in train_loader:
            logits = model(x)
            accuracies.append((logits.argmax(-1) == y).float().mean().item())
            optimizer.zero_grad()
            nn.functional.cross_entropy(logits, y).backward()
            optimizer.step()
        train_acc.append(sum(accuracies) / len(accuracies))
    assert history["train_acc"] == pytest.approx(train_acc)


class SmoothedTrainer(Trainer):
    """A loss of its own, without loss_fn: label-smoothed cross-entropy."""

    def compute_loss(self, batch):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y, label_smoothing=0.2)


def _smoothed_ce(model, x, y):
    """SmoothedTrainer's loss by hand, over all of (x, y) at once: the mean per sample."""
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x), y, label_smoothing=0.2).item()


def test_an_overridden_compute_loss_is_the_loss_of_eval_step_evaluate_and_the_best_checkpoint(tmp_path):
    # Before, evaluate() and eval_step took the model's logits for the loss and
    # reported their mean; a best checkpoint on the loss followed that number.
    eval_set = classification(96, seed=1)
    x, y = eval_set.tensors
    trainer = SmoothedTrainer(mlp(), "sgd", classification(), batch_size=32, lr=0.5, max_iter=12, eval_loader=eval_set,
                              eval_batch_size=40, eval_period=3, best_metric="eval/loss", output_dir=str(tmp_path),
                              progress_bar=False, seed=0)
    # Batches of 40, 40 and 16, weighted by their size: the mean over the 96 samples.
    assert trainer.evaluate()["loss"] == pytest.approx(_smoothed_ce(trainer.model, x, y), rel=1e-6)
    assert trainer.eval_step((x[:10], y[:10]))["loss"] == pytest.approx(_smoothed_ce(trainer.model, x[:10], y[:10]), rel=1e-6)
    assert trainer.model.training  # evaluation ran in eval mode and restored it

    trainer.train()
    assert trainer.evaluate()["loss"] == pytest.approx(_smoothed_ce(trainer.model, x, y), rel=1e-6)
    best = next(h for h in trainer.hooks if type(h).__name__ == "BestCheckpointer")
    scored = mlp()
    scored.load_state_dict(torch.load(tmp_path / "model_best.pth", weights_only=True)["model"])
    # model_best holds the weights whose smoothed loss is the best value kept, at an evaluation iteration
    # (12: the evaluation after training).
    assert best.best_metric == pytest.approx(_smoothed_ce(scored, x, y), rel=1e-6)
    assert best.best_iter in (2, 5, 8, 11, 12)


class _PredictionsOfTheWholeBatch(nn.Module):
    """A model that takes the whole (inputs, targets) batch and returns logits, not a loss."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, batch):
        return self.net(batch[0])


class PerSampleTrainer(Trainer):
    def compute_loss(self, batch):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y, reduction="none")


@pytest.mark.parametrize(
    "source, message",
    [
        ("loss_fn", r"^loss_fn returned loss 'total_loss' of shape \(32,\); a loss must be a scalar \(reduce it, e\.g\. with \.mean\(\)\)"),
        ("model", r"^the model returned loss 'total_loss' of shape \(32, 2\); a loss must be a scalar .*needs a loss_fn"),
        ("compute_loss", r"^PerSampleTrainer\.compute_loss returned loss 'total_loss' of shape \(32,\); a loss must be a scalar"),
    ],
)
def test_a_loss_that_is_not_a_scalar_is_refused_in_one_line_naming_its_source(source, message):
    options = dict(batch_size=32, lr=0.1, max_iter=2, progress_bar=False, seed=0)
    cls, model = Trainer, mlp
    if source == "loss_fn":
        options["loss_fn"] = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    elif source == "model":
        model = _PredictionsOfTheWholeBatch
    else:
        cls = PerSampleTrainer
    batch = next(iter(torch.utils.data.DataLoader(classification(), batch_size=32)))
    # train_step, train() (one update each) and, but for a loss_fn's per-sample
    # losses that LossEvaluator averages, eval_step.
    runs = [lambda t: t.train_step(batch), lambda t: t.train()] + ([lambda t: t.eval_step(batch)] if source != "loss_fn" else [])
    for run in runs:
        trainer = cls(model(), "sgd", classification(), **options)
        with pytest.raises(ValueError, match=message) as error:
            run(trainer)
        assert "\n" not in str(error.value)  # one line (the loop may add a note naming the iteration)


# ---------------------------------------------------------------------- layout
def test_hezar_layout_and_csv_logs(tmp_path):
    trainer = make(max_epochs=2, output_dir=str(tmp_path), checkpoints_dir="checkpoints", logs_dir="logs",
                   loggers=["csv", "tensorboard"])
    trainer.train()
    assert (tmp_path / "checkpoints" / "model_final.pth").exists()
    assert (tmp_path / "checkpoints" / "last_checkpoint").exists()
    assert list((tmp_path / "logs").glob("events.out.tfevents.*")) and (tmp_path / "logs" / "log.txt").exists()
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert rows and "total_loss" in rows[0]
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "logs" / "metrics.json").exists()
    with pytest.raises(Exception, match="holds an earlier run"):
        make(max_epochs=1, output_dir=str(tmp_path), checkpoints_dir="checkpoints", logs_dir="logs").train()
    make(max_epochs=3, output_dir=str(tmp_path), checkpoints_dir="checkpoints", logs_dir="logs",
         loggers=["csv"]).train(resume=True)
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert [int(r["iteration"]) for r in rows if r.get("total_loss")] == [7, 15, 19, 23]  # continued to epoch 3
