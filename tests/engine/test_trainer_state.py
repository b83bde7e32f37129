"""Each rank's step state in a checkpoint (``treadle.engine.trainer_state``):
saved by every rank, given back to its rank, in both checkpoint formats; a
resume on another number of processes is refused where the ranks' differ.

The 2-process runs use the gloo harness of ``test_distributed.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.engine.test_distributed import _process_group, _Regression, _spawn
from treadle.checkpoint import Checkpointer, ResumeRefusedError, sharded
from treadle.data import DataStream, build_train_loader
from treadle.engine import StepBase, TrainerBase, Update
from treadle.engine.trainer_state import same_state, step_state_of_this_rank


class _QueueStep(StepBase):
    """A MoCo-like step: a queue of the inputs of its rank's last batches,
    state of its rank's own."""

    def __init__(self, model: nn.Module, loader, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.data = DataStream(loader)
        self.update = Update(optimizer, model=model)
        self.queue = torch.zeros(6, 4)

    def run_step(self) -> None:
        x, y = next(self.data)
        self.update.apply(nn.functional.mse_loss(self.model(x), y))
        self.queue = torch.cat([x[:2], self.queue])[:6]

    def state_dict(self):
        return {**super().state_dict(), "queue": self.queue.clone()}

    def load_state_dict(self, state) -> None:
        state = dict(state)
        self.queue = state.pop("queue").clone()
        super().load_state_dict(state)


def _queue_trainer(folder: str, fmt: str = "file", ddp: bool = True):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    wrapped = nn.parallel.DistributedDataParallel(model) if ddp else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = TrainerBase(_QueueStep(wrapped, build_train_loader(_Regression(), total_batch_size=8), optimizer))
    return trainer, Checkpointer(model, folder, format=fmt, optimizer=optimizer, trainer=trainer)


def _per_rank_worker(rank: int, tmp: str) -> None:
    with _process_group(rank, 2, tmp):
        out = {}
        for fmt in ("file", "dcp"):
            folder = os.path.join(tmp, fmt)
            trainer, checkpointer = _queue_trainer(folder, fmt)
            trainer.train(0, 3)
            checkpointer.save("model_0000002", iteration=2)
            saved = trainer.step.queue.clone()
            trainer.train(3, 5)  # on, uninterrupted

            resumed, resumed_checkpointer = _queue_trainer(folder, fmt)
            start = resumed_checkpointer.resume_or_load()["iteration"] + 1
            loaded = resumed.step.queue.clone()
            resumed.train(start, 5)
            out[fmt] = {"saved": saved, "loaded": loaded, "straight": trainer.step.queue, "resumed": resumed.step.queue}
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))


def test_each_rank_resumes_its_own_step_state_in_both_formats(tmp_path):
    """2 gloo processes, each with a queue of its own batches: a checkpoint
    keeps both queues, each rank gets its own back, and the resumed run ends
    with the queues of the uninterrupted one ("file" and "dcp")."""
    _spawn(_per_rank_worker, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    files = {
        "file": torch.load(tmp_path / "file" / "model_0000002.pth", weights_only=True),
        "dcp": sharded.dcp_to_file_state(sharded.read_dcp(str(tmp_path / "dcp" / "model_0000002.dcp"))),
    }
    for fmt, content in files.items():
        r0, r1 = ranks[0][fmt], ranks[1][fmt]
        assert not torch.equal(r0["saved"], r1["saved"])  # the ranks' data differ: so do their queues
        for r in (r0, r1):
            assert torch.equal(r["loaded"], r["saved"]), fmt
            assert torch.equal(r["resumed"], r["straight"]), fmt
        state = content["trainer"]
        assert [torch.equal(s["queue"], r["saved"]) for s, r in zip(state["step_per_rank"], (r0, r1))] == [True, True]
        assert torch.equal(state["step"]["queue"], r0["saved"])  # rank 0's, for readers without step_per_rank


def _saved_by_two_ranks(queues):
    trainer, _ = _queue_trainer("", ddp=False)
    state = trainer.state_dict()
    state["iteration"] = 2
    state["step_per_rank"] = [{**state.get("step", {}), "queue": q} for q in queues]
    return state


class _SavedState:
    """A trainer state as a checkpointable, to write a crafted one."""

    def __init__(self, state) -> None:
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state) -> None:
        self.state = state


def test_a_resume_on_another_world_size_is_refused_where_the_ranks_step_states_differ(tmp_path):
    folder = str(tmp_path / "run")
    model = nn.Linear(4, 1)
    state = _saved_by_two_ranks([torch.zeros(6, 4), torch.ones(6, 4)])
    Checkpointer(model, folder, trainer=_SavedState(state)).save("model_0000002", iteration=2)
    trainer, checkpointer = _queue_trainer(folder, ddp=False)
    before = trainer.step.queue.clone()
    with pytest.raises(ResumeRefusedError) as refused:
        checkpointer.resume_or_load()
    assert str(refused.value) == (
        "Cannot resume on 1 process(es) from a checkpoint saved by 2: the step's state ('queue') differs between "
        "those 2 ranks, so none of them is this run's. Resume with 2 processes, or start a new run from its "
        "weights (train.init_checkpoint)."
    )
    assert trainer.iter == 0 and torch.equal(trainer.step.queue, before)  # nothing of the trainer loaded


def test_equal_step_states_of_another_world_size_resume_as_one():
    same = _saved_by_two_ranks([torch.ones(6, 4), torch.ones(6, 4)])
    assert torch.equal(step_state_of_this_rank(same)["queue"], torch.ones(6, 4))
    old = {"iteration": 2, "step": {"queue": torch.full((6, 4), 2.0)}}  # a checkpoint before step_per_rank
    assert step_state_of_this_rank(old) is old["step"]


def test_same_state_compares_tensors_and_containers_exactly():
    a = {"queue": torch.ones(2), "pos": 3, "gen": [torch.tensor([1], dtype=torch.uint8)]}
    assert same_state(a, {"queue": torch.ones(2), "pos": 3, "gen": [torch.tensor([1], dtype=torch.uint8)]})
    assert not same_state(a, {**a, "queue": torch.ones(2, dtype=torch.float64)})
    assert not same_state(a, {**a, "pos": 4})
    assert not same_state({"x": torch.tensor([float("nan")])}, {"x": torch.tensor([float("nan")])})
    assert not same_state(Path("a"), "a")
