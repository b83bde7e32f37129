"""Asynchronous checkpoints: the same files and weights as synchronous ones,
at most one save in flight, and a background failure that stops training
with one line while the previous checkpoint stays the resume point."""

from __future__ import annotations

import errno
import os
import threading

import pytest
import torch
from torch import nn

from tests.tiny_models import classification
from treadle.checkpoint import CheckpointError, Checkpointer, load_checkpoint_file
from treadle.checkpoint import file_writer
from treadle.engine import EagerStep, TrainerBase
from treadle.hooks import PeriodicCheckpointer


def build(output_dir, async_save: bool, max_to_keep=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(classification(), batch_size=16, shuffle=False)
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy))
    checkpointer = Checkpointer(model, str(output_dir), optimizer=optimizer, trainer=trainer)
    hook = PeriodicCheckpointer(checkpointer, 5, max_to_keep=max_to_keep, async_save=async_save)
    trainer.register_hooks([hook])
    return trainer, checkpointer


def test_async_saves_write_the_same_checkpoints_as_sync_ones(tmp_path):
    sync_trainer, _ = build(tmp_path / "sync", async_save=False)
    sync_trainer.train(0, 23)
    async_trainer, checkpointer = build(tmp_path / "async", async_save=True)
    async_trainer.train(0, 23)
    assert not checkpointer.saving
    names = sorted(os.listdir(tmp_path / "sync"))
    assert names == ["last_checkpoint", "model_0000014.pth", "model_0000019.pth", "model_final.pth"]
    assert sorted(os.listdir(tmp_path / "async")) == names
    for name in names[1:]:
        a = load_checkpoint_file(str(tmp_path / "sync" / name))
        b = load_checkpoint_file(str(tmp_path / "async" / name))
        assert a["iteration"] == b["iteration"]
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), (name, key)
        for s, t in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
            assert torch.equal(s["exp_avg"], t["exp_avg"])
    assert (tmp_path / "async" / "last_checkpoint").read_text() == "model_final.pth"


def test_the_snapshot_is_taken_at_the_save_not_when_the_thread_writes(tmp_path, monkeypatch):
    # The writer thread is held until training has moved on: the file must
    # still hold the weights of the iteration it names.
    release = threading.Event()
    real_write = file_writer.atomic_write

    def held_write(path, write, *args, **kwargs):
        if os.path.basename(path) == "model_0000004.pth":
            release.wait(timeout=30)
        return real_write(path, write, *args, **kwargs)

    monkeypatch.setattr(file_writer, "atomic_write", held_write)
    trainer, checkpointer = build(tmp_path / "async", async_save=True, max_to_keep=None)
    seen = {}

    from treadle.engine import HookBase

    class Release(HookBase):
        def after_step(self):
            if self.trainer.iter == 4:
                seen[4] = {k: v.detach().clone() for k, v in self.trainer.step.model.state_dict().items()}
            if self.trainer.iter == 8:
                assert checkpointer.saving  # still in flight, four iterations later
                release.set()

    trainer.register_hooks([Release()])
    trainer.train(0, 12)
    saved = load_checkpoint_file(str(tmp_path / "async" / "model_0000004.pth"))["model"]
    for key, value in seen[4].items():
        assert torch.equal(saved[key], value), key


def test_a_failed_background_save_stops_training_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    real_write = file_writer.atomic_write

    def full_disk(path, write, *args, **kwargs):
        if os.path.basename(path) == "model_0000009.pth":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_write(path, write, *args, **kwargs)

    monkeypatch.setattr(file_writer, "atomic_write", full_disk)
    trainer, checkpointer = build(tmp_path / "run", async_save=True)
    with pytest.raises(CheckpointError) as raised:
        trainer.train(0, 40)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("Background save failed: Cannot write checkpoint")
    assert "model_0000009.pth" in message and "No space left on device" in message
    assert 9 < trainer.iter < 39, "stopped soon after the failure, not at the end"
    assert (tmp_path / "run" / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "run" / "model_0000009.pth").exists()
    assert not (tmp_path / "run" / "model_final.pth").exists()


def test_at_most_one_save_in_flight(tmp_path, monkeypatch):
    in_flight, most = [0], [0]
    lock = threading.Lock()
    real_write = file_writer.atomic_write

    def counting_write(path, write, *args, **kwargs):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            threading.Event().wait(0.02)
            return real_write(path, write, *args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(file_writer, "atomic_write", counting_write)
    trainer, _ = build(tmp_path / "run", async_save=True, max_to_keep=None)
    trainer.hooks[0]._period = type(trainer.hooks[0]._period)(1)  # a save every iteration
    trainer.train(0, 10)
    assert most[0] == 1
    assert len([n for n in os.listdir(tmp_path / "run") if n.startswith("model_")]) == 10


def test_async_save_is_a_config_key(tmp_path):
    from treadle.tools.train_net import cli

    out = tmp_path / "run"
    code = cli([f"train.output_dir={out}", "train.max_iter=30", "train.eval_period=0",
                "train.checkpointer.period=10", "train.checkpointer.async_save=True"])
    assert code == 0
    assert sorted(n for n in os.listdir(out) if n.startswith("model_0") or n == "model_final.pth") == [
        "model_0000009.pth", "model_0000019.pth", "model_final.pth"
    ]
    bad = cli([f"train.output_dir={tmp_path / 'bad'}", "train.checkpointer.async_save=sometimes"])
    assert bad == 2


def test_in_flight_and_failed_say_what_the_background_save_is_doing(tmp_path, monkeypatch):
    release = threading.Event()
    real_write = file_writer.atomic_write

    def write(path, write_fn, *args, **kwargs):
        if os.path.basename(path) == "model_a.pth":
            release.wait(timeout=30)
        if os.path.basename(path) == "model_b.pth":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_write(path, write_fn, *args, **kwargs)

    monkeypatch.setattr(file_writer, "atomic_write", write)
    checkpointer = Checkpointer(nn.Linear(3, 2), str(tmp_path), async_save=True)
    assert not checkpointer.in_flight and checkpointer.failed is None

    checkpointer.save("model_a")
    assert checkpointer.in_flight and checkpointer.saving and checkpointer.failed is None
    release.set()
    checkpointer.wait()
    assert not checkpointer.in_flight and checkpointer.failed is None
    assert (tmp_path / "last_checkpoint").read_text() == "model_a.pth"

    checkpointer.save("model_b")
    finished = threading.Event()
    for _ in range(3000):  # until the thread finished (it fails at once)
        if not checkpointer.in_flight:
            finished.set()
            break
        threading.Event().wait(0.01)
    assert finished.is_set()
    error = checkpointer.failed
    assert isinstance(error, CheckpointError)
    assert str(error).startswith("Background save failed: Cannot write checkpoint")
    assert "model_b.pth" in str(error) and "No space left on device (ENOSPC)" in str(error)
    assert str(checkpointer.failed) == str(error), "asking does not clear the failure"
    with pytest.raises(CheckpointError) as raised:
        checkpointer.raise_if_failed()
    assert str(raised.value) == str(error)
    assert checkpointer.failed is None and not checkpointer.in_flight, "raised once"
    checkpointer.wait()  # nothing left to raise
    assert (tmp_path / "last_checkpoint").read_text() == "model_a.pth"
    assert not (tmp_path / "model_b.pth").exists()
