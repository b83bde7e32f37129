"""Hezar's ``Trainer``/``TrainerConfig`` documentation, translated to treadle.

Source: ``shared/seeds/000_*.txt`` (and its earlier copy 001): a text
recognition model trained with ``metrics=["cer"]``,
``metric_for_best_model="cer"``, ``init_weights_from``, ``save_steps``,
mixed precision, gradient accumulation, TensorBoard and CSV logs in
``logs_dir``, checkpoints in ``checkpoints_dir``, and
``resume_from_checkpoint``. Names: ``docs/coming_from/hezar.md``.
"""

from __future__ import annotations

import csv

import torch
from torch import nn

from treadle.data.datasets import DigitsDataset
from treadle.trainer import Trainer


class Recognizer(nn.Module):
    """The CRNN's stand-in: an encoder and a classification head, one character per image."""

    def __init__(self, num_labels: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, num_labels)

    def forward(self, x):
        return self.head(self.encoder(x))


id2label = {i: str(i) for i in range(10)}


def decode(logits):
    """Predictions to text, as Hezar's image2text post-processing does."""
    return [id2label[int(i)] for i in logits.argmax(-1)]


def decode_targets(labels):
    return [id2label[int(i)] for i in labels]


def trainer_for(output_dir, base_model_path, **overrides):
    train_dataset, eval_dataset = DigitsDataset("train"), DigitsDataset("test")
    torch.manual_seed(0)
    model = Recognizer(len(id2label))
    config = dict(
        batch_size=8,
        max_epochs=2,  # num_epochs
        metrics=[("cer", {"decode": decode, "decode_targets": decode_targets})],
        best_metric="cer",  # metric_for_best_model; cer is lower-is-better, inferred
        checkpoint_period=50,  # save_steps (an epoch is 89 updates of 2 x 8 images)
        log_period=50,  # log_steps
        precision="bf16",  # mixed_precision
        grad_accum_steps=2,  # gradient_accumulation_steps
        checkpoints_dir="checkpoints",
        logs_dir="logs",
        loggers=["tensorboard", "csv"],
        init_weights_from=base_model_path,
        device="cpu",
        seed=42,
    )
    config.update(overrides)
    return Trainer(model, "adamw", train_dataset, lr=3e-3, loss_fn=nn.functional.cross_entropy,
                   eval_loader=eval_dataset, output_dir=str(output_dir), progress_bar=False, **config)


def base_model(tmp_path):
    """A "pretrained" model for another task (5 labels): its encoder is reused, its head is not."""
    torch.manual_seed(7)
    base = Recognizer(5)
    path = tmp_path / "base.pth"
    torch.save({"model": base.state_dict()}, path)
    return base, str(path)


def test_train_with_cer_best_model_and_hezar_layout(tmp_path):
    base, base_path = base_model(tmp_path)
    trainer = trainer_for(tmp_path / "crnn-plate-fa-v1", base_path)
    # init_weights_from: the encoder comes from the base model, the new head does not.
    assert torch.equal(trainer.model.encoder[0].weight, base.encoder[0].weight)
    history = trainer.train()

    cers = [row["cer"] for row in history.epochs]
    assert len(cers) == 2 and cers[-1] < 0.25
    out = tmp_path / "crnn-plate-fa-v1"
    best = torch.load(out / "checkpoints" / "model_best.pth", weights_only=True)
    assert best["trainer"]["hooks"]["BestCheckpointer"]["best_metric"] == min(cers)
    # model_best holds the weights that scored that cer.
    check = trainer_for(tmp_path / "check", None, max_epochs=1)
    check.model.load_state_dict(best["model"])
    assert check.evaluate()["cer"] == min(cers)
    rows = list(csv.DictReader((out / "logs" / "metrics.csv").open()))
    assert any(row.get("cer") for row in rows)
    assert list((out / "logs").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (out / "checkpoints").glob("model_0*.pth")) == [
        "model_0000049.pth", "model_0000099.pth", "model_0000149.pth"
    ]


def test_resume_from_checkpoint(tmp_path):
    _, base_path = base_model(tmp_path)
    straight = trainer_for(tmp_path / "a", base_path)
    straight.train()
    # Stopped after the first save (resume_from_checkpoint=True, then a path).
    interrupted = trainer_for(tmp_path / "b", base_path, max_iter=100)
    interrupted.train()
    resumed = trainer_for(tmp_path / "b", base_path)
    resumed.train(resume=True)
    a = torch.load(tmp_path / "a" / "checkpoints" / "model_final.pth", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "checkpoints" / "model_final.pth", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    from_path = trainer_for(tmp_path / "c", base_path)
    from_path.train(resume=str(tmp_path / "a" / "checkpoints" / "model_0000099.pth"))
    c = torch.load(tmp_path / "c" / "checkpoints" / "model_final.pth", weights_only=True)["model"]
    assert all(torch.equal(a[k], c[k]) for k in a)
