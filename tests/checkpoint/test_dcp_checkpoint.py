"""The "dcp" checkpoint format in one process: what is written, resume,
damage, unfinished saves, asynchronous saves and their failures, the
converter, and the config key. Several processes: test_dcp_distributed.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from tests.tiny_models import classification
from treadle.checkpoint import CheckpointError, Checkpointer, load_checkpoint_file
from treadle.checkpoint import sharded
from treadle.data import build_train_loader
from treadle.engine import EagerStep, TrainerBase
from treadle.hooks import PeriodicCheckpointer

REPO = Path(__file__).resolve().parents[2]
CONVERT = str(REPO / "tools" / "convert_checkpoint.py")


def build(output_dir, *, async_save=False, max_to_keep=2, fmt="dcp", seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    # A resumable loader: a resume continues from the saved position in the data.
    loader = build_train_loader(classification(), total_batch_size=16, shuffle=True, seed=0)
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy))
    checkpointer = Checkpointer(model, str(output_dir), format=fmt, optimizer=optimizer, trainer=trainer)
    trainer.register_hooks([PeriodicCheckpointer(checkpointer, 5, max_to_keep=max_to_keep, async_save=async_save)])
    return trainer, checkpointer


def resumed(output_dir, max_iter, **kwargs):
    trainer, checkpointer = build(output_dir, seed=1, **kwargs)  # other initial weights: all must come from the checkpoint
    extra = checkpointer.resume_or_load("", resume=True)
    trainer.train(int(extra["iteration"]) + 1, max_iter)
    return trainer


def as_file(directory) -> dict:
    return sharded.dcp_to_file_state(sharded.read_dcp(str(directory)))


def assert_same_state(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    for index, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][name]), (index, name)
    assert a["iteration"] == b["iteration"]


def test_a_dcp_checkpoint_is_a_published_directory_and_resumes_exactly(tmp_path):
    run = tmp_path / "run"
    trainer, _ = build(run)
    trainer.train(0, 23)
    assert sorted(os.listdir(run)) == [
        "last_checkpoint", "model_0000014.dcp", "model_0000019.dcp", "model_final.dcp", "model_final.pth"
    ]
    assert (run / "last_checkpoint").read_text() == "model_final.dcp"
    assert sorted(os.listdir(run / "model_0000019.dcp")) == [".metadata", "__0_0.distcp", "checksums.json"]
    sums = json.loads((run / "model_0000019.dcp" / "checksums.json").read_text())["files"]
    assert sorted(sums) == [".metadata", "__0_0.distcp"]
    # model_final.pth: the plain weights, for evaluation and other tools.
    final = torch.load(run / "model_final.pth", weights_only=True)
    assert sorted(final) == ["iteration", "model"] and final["iteration"] == 22
    for key, value in trainer.step.model.state_dict().items():
        assert torch.equal(final["model"][key], value)

    # Resume from model_0000014.dcp alone: the same final state as the uninterrupted run.
    again = tmp_path / "again"
    again.mkdir()
    shutil.copytree(run / "model_0000014.dcp", again / "model_0000014.dcp")
    (again / "last_checkpoint").write_text("model_0000014.dcp")
    resumed(again, 23)
    assert_same_state(as_file(again / "model_final.dcp"), as_file(run / "model_final.dcp"))
    assert as_file(run / "model_final.dcp")["trainer"]["iteration"] == 22


def test_an_async_dcp_run_writes_the_same_checkpoints_as_a_sync_one(tmp_path):
    build(tmp_path / "sync")[0].train(0, 23)
    trainer, checkpointer = build(tmp_path / "async", async_save=True)
    trainer.train(0, 23)
    assert not checkpointer.saving
    assert sorted(os.listdir(tmp_path / "async")) == sorted(os.listdir(tmp_path / "sync"))
    for name in ("model_0000014.dcp", "model_0000019.dcp", "model_final.dcp"):
        assert_same_state(as_file(tmp_path / "async" / name), as_file(tmp_path / "sync" / name))


def test_async_dcp_saves_survive_a_torch_that_closes_the_stager_after_each_save(tmp_path, monkeypatch):
    """torch 2.11's DefaultStager closes its copier after every save (seen on
    a GPU machine): the checkpointer kept its stager, and the second save
    failed with KeyError: <class 'type'>. Closed stagers are replaced."""
    real_async_save = dcp.async_save

    def closing_async_save(*args, async_stager=None, **kwargs):
        future = real_async_save(*args, async_stager=async_stager, **kwargs)
        future.result()
        async_stager.close()
        return future

    monkeypatch.setattr(dcp, "async_save", closing_async_save)
    trainer, checkpointer = build(tmp_path / "async", async_save=True, max_to_keep=None)
    trainer.train(0, 17)
    build(tmp_path / "sync", max_to_keep=None)[0].train(0, 17)
    assert not checkpointer.saving
    assert sorted(os.listdir(tmp_path / "async")) == sorted(os.listdir(tmp_path / "sync"))
    assert {"model_0000004.dcp", "model_0000009.dcp", "model_0000014.dcp"} <= set(os.listdir(tmp_path / "async"))
    assert_same_state(as_file(tmp_path / "async" / "model_0000014.dcp"), as_file(tmp_path / "sync" / "model_0000014.dcp"))


def test_a_damaged_dcp_checkpoint_is_reported_and_the_previous_one_resumed(tmp_path, caplog):
    run = tmp_path / "run"
    build(run, max_to_keep=None)[0].train(0, 17)  # model_0000004, _0009, _0014, final
    (run / "last_checkpoint").write_text("model_0000014.dcp")
    shutil.rmtree(run / "model_final.dcp")
    shard = run / "model_0000014.dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    trainer, checkpointer = build(run, seed=1, max_to_keep=None)
    extra = checkpointer.resume_or_load("", resume=True)
    assert extra["iteration"] == 9
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("model_0000014.dcp" in m and "CRC-32" in m for m in warned), warned
    assert any("Resuming from" in m and "model_0000009.dcp" in m and "older" in m for m in warned), warned


def test_a_truncated_shard_and_a_missing_checksum_file_are_refused(tmp_path):
    run = tmp_path / "run"
    build(run)[0].train(0, 12)
    directory = run / "model_0000009.dcp"
    shard = directory / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    model = build(tmp_path / "other")[1]
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        model.load(str(directory))
    (directory / "checksums.json").unlink()
    with pytest.raises(CheckpointError, match="has no checksums.json: it is not a complete treadle checkpoint"):
        model.load(str(directory))


def test_an_unfinished_save_is_never_resumed_and_is_removed(tmp_path):
    run = tmp_path / "run"
    build(run, max_to_keep=None)[0].train(0, 12)
    # What a kill -9 during a save leaves: a .partial directory (no rename).
    shutil.copytree(run / "model_0000009.dcp", run / ".model_0000014.dcp.partial")
    (run / "model_final.dcp").rename(run / "spare")
    (run / "last_checkpoint").write_text("model_0000009.dcp")
    trainer, checkpointer = build(run, seed=1, max_to_keep=None)
    assert checkpointer.resume_or_load("", resume=True)["iteration"] == 9
    trainer.train(10, 17)
    assert not (run / ".model_0000014.dcp.partial").exists()  # the same name's next save cleared it
    assert (run / "last_checkpoint").read_text() == "model_final.dcp"
    (run / ".model_0000099.dcp.partial").mkdir()
    checkpointer.prune(keep_last=1)
    assert not (run / ".model_0000099.dcp.partial").exists()
    assert sorted(n for n in os.listdir(run) if n.endswith(".dcp")) == ["model_0000014.dcp", "model_final.dcp"]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_failed_dcp_save_stops_training_in_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, async_save):
    run = tmp_path / "run"
    trainer, checkpointer = build(run, async_save=async_save)
    failed_at = []

    class FullDiskWriter(dcp.FileSystemWriter):
        """DCP's writer, failing like a full disk for one checkpoint."""

        def write_data(self, plan, planner):
            if "model_0000009" in str(self.path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            return super().write_data(plan, planner)

    finish = Checkpointer._finish_async_dcp

    def finish_noting_the_failure(self, *args, **kwargs):
        try:
            return finish(self, *args, **kwargs)
        except CheckpointError:
            failed_at.append(trainer.iter)  # where training was when the background save failed
            raise

    monkeypatch.setattr(dcp, "FileSystemWriter", FullDiskWriter)
    monkeypatch.setattr(Checkpointer, "_finish_async_dcp", finish_noting_the_failure)
    with pytest.raises(CheckpointError) as raised:
        trainer.train(0, 40)
    message = str(raised.value)
    assert "\n" not in message
    assert "model_0000009.dcp" in message and "No space left on device" in message, message
    if async_save:
        assert message.startswith("Background save failed: ")
        assert trainer.iter <= failed_at[0] + 1, "stopped within one iteration of the failure"
    else:
        assert trainer.iter == 9
    assert message.endswith("The previous checkpoints and last_checkpoint are untouched."), message
    assert (run / "last_checkpoint").read_text() == "model_0000004.dcp"
    assert not (run / "model_0000009.dcp").exists()
    assert not (run / "model_final.dcp").exists()
    # The previous checkpoint is intact and resumes.
    assert build(run, seed=1)[1].resume_or_load("", resume=True)["iteration"] == 4


def test_the_converter_turns_a_dcp_directory_into_a_plain_file_and_back(tmp_path):
    run = tmp_path / "run"
    trainer, _ = build(run)
    trainer.train(0, 17)
    pth = tmp_path / "model_0000014.pth"
    done = subprocess.run([sys.executable, CONVERT, str(run / "model_0000014.dcp"), str(pth)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    plain = torch.load(pth, weights_only=True)
    assert plain["iteration"] == 14
    # The optimizer state is torch's own: it loads into a plain optimizer.
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    model.load_state_dict(plain["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    optimizer.load_state_dict(plain["optimizer"])
    assert sorted(optimizer.state_dict()["state"]) == [0, 1, 2, 3]
    assert load_checkpoint_file(str(pth))["iteration"] == 14  # its checksums verify

    back = tmp_path / "back" / "model_0000014.dcp"
    back.parent.mkdir()
    done = subprocess.run([sys.executable, CONVERT, str(pth), str(back)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (back.parent / "last_checkpoint").write_text("model_0000014.dcp")
    resumed(back.parent, 23)
    straight = tmp_path / "straight"
    build(straight)[0].train(0, 23)
    assert_same_state(as_file(back.parent / "model_final.dcp"), as_file(straight / "model_final.dcp"))

    again = subprocess.run([sys.executable, CONVERT, str(pth), str(back)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [f"convert_checkpoint.py: error: '{back}' already exists; remove it or choose another name."]


def test_initial_weights_from_a_dcp_directory_load_with_the_mismatch_table(tmp_path, caplog):
    from treadle.checkpoint import init_weights_from

    build(tmp_path / "run")[0].train(0, 5)
    torch.manual_seed(3)
    other = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5))  # a new head
    report = init_weights_from(other, str(tmp_path / "run" / "model_final.dcp"))
    assert sorted(report.loaded) == ["0.bias", "0.weight"]
    assert sorted(m.key for m in report.shape_mismatched) == ["2.bias", "2.weight"]
    saved = as_file(tmp_path / "run" / "model_final.dcp")["model"]
    assert torch.equal(other[0].weight, saved["0.weight"])


def test_the_format_is_a_config_key(tmp_path):
    from treadle.tools.train_net import cli

    out = tmp_path / "run"
    code = cli([f"train.output_dir={out}", "train.max_iter=20", "train.eval_period=0",
                "train.checkpointer.period=10", "train.checkpointer.format=dcp"])
    assert code == 0
    # model_best.pth (the digits config keeps the best accuracy) holds weights only, like model_final.pth.
    assert sorted(n for n in os.listdir(out) if n.startswith("model_")) == [
        "model_0000009.dcp", "model_best.pth", "model_final.dcp", "model_final.pth"
    ]
    assert sorted(torch.load(out / "model_best.pth", weights_only=True)) == ["iteration", "model"]
    # Evaluation loads the directory, and the plain file.
    assert cli(["--eval-only", f"train.output_dir={tmp_path / 'eval1'}", f"train.init_checkpoint={out / 'model_final.dcp'}"]) == 0
    assert cli(["--eval-only", f"train.output_dir={tmp_path / 'eval2'}", f"train.init_checkpoint={out / 'model_final.pth'}"]) == 0
    bad = cli([f"train.output_dir={tmp_path / 'bad'}", "train.checkpointer.format=zip"])
    assert bad == 2
    assert not (tmp_path / "bad").exists()


def test_importing_treadle_does_not_import_torch_distributed_checkpoint():
    """DCP (and the DTensor machinery under it) costs ~0.5 s and ~60 MB to
    import: only a run that reads or writes a .dcp checkpoint pays for it."""
    code = (
        "import sys, treadle, treadle.engine, treadle.hooks, treadle.checkpoint, treadle.tools.train_net; "
        "print('torch.distributed.checkpoint' in sys.modules, 'torch.distributed.tensor' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["False", "False"]
