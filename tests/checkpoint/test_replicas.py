"""A second model on several processes (``treadle.checkpoint.replicas``): a
``DefaultTrainer`` subclass whose step trains ``cfg.model`` and a ``G`` of its
own, LiBai's way (``checkpointer.add_checkpointable("G", G)``), on 2 gloo
processes seeded ``seed + rank``. Unwrapped, ``G`` differs between the ranks
and the first checkpoint refuses it; wrapped with ``self.wrap_model``, it
trains alike on both ranks and the checkpoint holds it.

The 2-process runs use the gloo harness of ``tests/engine/test_distributed.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.engine.test_defaults import digits_cfg
from tests.engine.test_distributed import _dump, _load_ranks, _process_group, _spawn
from treadle.checkpoint import Checkpointer, ReplicasDifferError, weights_fingerprint
from treadle.data import DataStream
from treadle.engine import StepBase, Update
from treadle.engine.defaults import DefaultTrainer
from treadle.events import ScalarKind
from treadle.hooks import BestCheckpointer, EvalHook
from treadle.utils import comm


class _TwoModelStep(StepBase):
    """Trains the model and G on the same batches, each with its own optimizer."""

    def __init__(self, model, g, loader, optimizer, g_optimizer) -> None:
        self.model, self.g = model, g
        self.data = DataStream(loader)
        self.update = Update(optimizer, model=model)
        self.g_update = Update(g_optimizer, model=g)

    def run_step(self) -> None:
        x, y = next(self.data)
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.update.apply(loss)
        self.g_update.apply(nn.functional.cross_entropy(self.g(x), y))
        self.storage.put_scalar("total_loss", loss.detach(), kind=ScalarKind.LOSS)


class _TwoModels(DefaultTrainer):
    def __init__(self, cfg, wrap: bool) -> None:
        super().__init__(cfg)
        torch.manual_seed(comm.get_rank())  # as default_setup seeds each rank: seed + rank
        G = nn.Linear(64, 10)
        # The documented call: G wrapped as the main model is (DDP broadcasts rank 0's weights).
        self.G = self.wrap_model(cfg, G) if wrap else G
        self.g_optimizer = torch.optim.SGD(G.parameters(), lr=0.1)
        self.checkpointer.add_checkpointable("G", G)
        self.step = _TwoModelStep(self.model, self.G, self.train_loader, self.optimizer, self.g_optimizer)

    def build_hooks(self):
        return [h for h in super().build_hooks() if not isinstance(h, (EvalHook, BestCheckpointer))]


def _second_model_worker(rank: int, tmp: str) -> None:
    with _process_group(rank, 2, tmp):
        out = {}
        for wrap in (False, True):
            name = "wrapped" if wrap else "unwrapped"
            cfg = digits_cfg(Path(tmp) / name, "train.max_iter=4", "train.checkpointer.period=2", "train.log_period=2",
                             "train.eval_period=0", "model.dropout=0.0")
            trainer = _TwoModels(cfg, wrap)
            try:
                trainer.train()
                out[name] = None
            except ReplicasDifferError as e:
                out[name] = str(e)
            torch.save(trainer.checkpointer.checkpointables["G"].state_dict(), os.path.join(tmp, f"{name}-G{rank}.pt"))
        _dump(tmp, rank, out)


def test_a_second_model_is_wrapped_with_wrap_model_and_refused_unwrapped(tmp_path):
    _spawn(_second_model_worker, 2, str(tmp_path))
    r0, r1 = _load_ranks(tmp_path, 2)
    message = (
        "The weights of 'G' differ between rank 0 and rank 1 at the first checkpoint, which would keep rank 0's: "
        "wrap it for data-parallel training as the model is (self.wrap_model(cfg, G) in a DefaultTrainer, "
        "treadle.engine.create_ddp_model(G) elsewhere), so that every rank starts from rank 0's weights and "
        "averages its gradients."
    )
    assert r0["unwrapped"] == r1["unwrapped"] == message
    assert not [n for n in os.listdir(tmp_path / "unwrapped") if n.startswith(("model_", "last_checkpoint"))]

    assert r0["wrapped"] is r1["wrapped"] is None
    g = [torch.load(tmp_path / f"wrapped-G{r}.pt", weights_only=True) for r in range(2)]
    saved = torch.load(tmp_path / "wrapped" / "model_final.pth", weights_only=True)
    for key in ("weight", "bias"):
        assert torch.equal(g[0][key], g[1][key]) and torch.equal(saved["G"][key], g[0][key])
    assert not torch.equal(g[0]["weight"], nn.Linear(64, 10).weight)  # trained
    # The ranks' step states (the data position) are equal: saved once, as before.
    assert "step_per_rank" not in saved["trainer"] and "step" in saved["trainer"]
    rows = [json.loads(line) for line in (tmp_path / "wrapped" / "metrics.json").read_text().splitlines()]
    assert [row["iteration"] for row in rows if "total_loss" in row] == [1, 3]


def test_the_fingerprint_reads_whole_parameters_only():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.fill_(3.0)
    assert weights_fingerprint(model) == (2.0, 14.0)
    assert weights_fingerprint(nn.ReLU()) is None
    assert weights_fingerprint(nn.Linear(2, 1, device="meta")) is None


def _two_ranks(monkeypatch, rank1=lambda mine: mine):
    """One process taken for rank 0 of two, whose gathers return its own
    object and ``rank1(object)`` for rank 1; returns the gathers made."""
    gathers = []
    monkeypatch.setattr(comm, "get_world_size", lambda: 2)

    def all_gather(data, group=None):
        gathers.append(data)
        return [data, rank1(data)]

    monkeypatch.setattr(comm, "all_gather", all_gather)
    return gathers


def test_the_weights_are_compared_at_the_first_save_only(tmp_path, monkeypatch):
    gathers = _two_ranks(monkeypatch)
    checkpointer = Checkpointer(nn.Linear(2, 1), str(tmp_path), G=nn.Linear(3, 1), extra=_Stateless())
    checkpointer.save("model_0000001")
    checkpointer.save("model_0000003")
    assert [sorted(g) for g in gathers] == [["G", "model"]]  # one gather, of the modules only
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "model_0000001.pth", "model_0000003.pth"]


def test_a_module_that_differs_on_another_rank_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    _two_ranks(monkeypatch, rank1=lambda mine: {**mine, "G": (0.5, 0.25)})
    checkpointer = Checkpointer(nn.Linear(2, 1), str(tmp_path / "run"), G=nn.Linear(3, 1))
    with pytest.raises(ReplicasDifferError, match=r"^The weights of 'G' differ between rank 0 and rank 1 at the first"):
        checkpointer.save("model_0000001")
    assert not (tmp_path / "run").exists()


class _Stateless:
    def state_dict(self):
        return {}

    def load_state_dict(self, state) -> None:
        pass
