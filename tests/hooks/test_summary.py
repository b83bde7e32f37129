"""The run summary: console and summary.json at the end of every run."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from tests.tiny_models import classification
from treadle.data import build_train_loader
from treadle.engine import EagerStep, HookBase, TrainerBase
from treadle.hooks import RunSummary


class Evaluations(HookBase):
    """Puts made-up evaluation results: a loss that is lowest at iteration 5
    and an accuracy that is highest at iteration 7."""

    results = {3: (0.9, 0.50), 5: (0.4, 0.70), 7: (0.6, 0.80), 9: (0.7, 0.75)}

    def after_step(self):
        if self.trainer.iter in self.results:
            loss, accuracy = self.results[self.trainer.iter]
            self.trainer.storage.put_scalars(**{"eval/loss": loss, "eval/accuracy": accuracy}, kind="metric")


class FailAt(HookBase):
    def after_step(self):
        if self.trainer.iter == 4:
            raise RuntimeError("the data went away\nsecond line")


def train(tmp_path, *hooks, max_iter=10):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = build_train_loader(classification(), total_batch_size=16, shuffle=True, seed=0)
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy))
    summary = RunSummary(str(tmp_path), samples_per_iter=16)
    trainer.register_hooks([*hooks, summary])
    trainer.train(0, max_iter)
    return trainer, json.loads((tmp_path / "summary.json").read_text())


def test_the_summary_holds_final_and_best_metrics_and_the_cost(tmp_path, treadle_caplog):
    trainer, summary = train(tmp_path, Evaluations())
    assert summary["status"] == "finished"
    assert summary["iterations"] == 10 and summary["last_iter"] == 9
    assert summary["iterations_per_second"] > 0
    assert summary["samples_per_second"] == pytest.approx(16 * summary["iterations_per_second"], rel=1e-6)
    assert summary["peak_host_memory_mib"] > 10
    assert summary["final"]["eval/accuracy"] == {"value": 0.75, "iteration": 9}
    assert summary["best"]["eval/accuracy"] == {"value": 0.80, "iteration": 7, "mode": "max"}
    assert summary["best"]["eval/loss"] == {"value": 0.4, "iteration": 5, "mode": "min"}
    assert summary["final"]["total_loss"]["iteration"] == 9
    text = treadle_caplog.text
    assert "Run summary:" in text and "best 0.8 at iteration 7" in text and "best 0.4 at iteration 5" in text


def test_a_failed_run_says_so_in_one_line(tmp_path):
    with pytest.raises(RuntimeError):
        train(tmp_path, FailAt())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == "RuntimeError: the data went away"
    assert summary["failed_at_iter"] == 4 and summary["last_iter"] == 3


def test_train_net_writes_the_summary_with_its_checkpoints(tmp_path):
    from treadle.tools.train_net import cli

    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", "train.max_iter=30", "train.eval_period=10", "train.checkpointer.period=10"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations"] == 30
    accuracy = [k for k in summary["best"] if k.endswith("accuracy")]
    assert accuracy, summary["best"]
    # The best accuracy is the highest of those metrics.json holds, at its iteration.
    evaluated = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    evaluated = [(row[accuracy[0]], row["iteration"]) for row in evaluated if accuracy[0] in row]
    assert len(evaluated) >= 3
    best_value, best_iter = max(evaluated, key=lambda p: p[0])
    assert summary["best"][accuracy[0]]["value"] == best_value
    assert summary["best"][accuracy[0]]["iteration"] == best_iter
    assert summary["checkpoints"]["last_checkpoint"] == str(out / "model_final.pth")
    assert "model_final.pth" in summary["checkpoints"]["files"]
    assert summary["samples_per_second"] > 0


def test_the_printed_summary_has_no_two_rows_with_the_same_name(tmp_path):
    from treadle.hooks import IterationTimer

    trainer, summary = train(tmp_path, IterationTimer(), Evaluations())
    assert "time" in summary["final"]  # the timer's scalar, next to the run's wall time
    table = RunSummary.describe(summary)
    names = [re.split(r"\s{2,}", line.strip())[0] for line in table.splitlines()]
    assert len(names) == len(set(names)), names
    assert "wall time" in names and "time" in names
