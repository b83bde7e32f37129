"""Sharded (DCP) checkpoints of FSDP2 jobs with gloo processes on the CPU,
through ``tools/train_net.py``: each rank writes its own shard file, and a
checkpoint saved by 2 processes resumes with 1, 2 or 3 (bit-identical with 2)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.engine.test_distributed_jobs import OVERRIDES, _assert_close, _assert_equal, _train_net, _weights
from treadle.checkpoint import sharded

# A batch that 1, 2 and 3 processes divide evenly; no dropout (ranks draw different masks).
JOB = ["model.dropout=0.0", *OVERRIDES, "dataloader.train.total_batch_size=48"]
FSDP = "train.ddp.kind=fsdp"


@pytest.fixture(scope="module")
def fsdp_dcp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dcp") / "fsdp"
    _train_net(out, "--num-gpus", "2", *JOB, FSDP)  # no format given: "dcp" under FSDP
    return out


def _resume_from(source: Path, name: str, dest: Path) -> Path:
    dest.mkdir()
    shutil.copytree(source / name, dest / name)
    (dest / "last_checkpoint").write_text(name)
    return dest


def test_each_rank_writes_its_own_shards(fsdp_dcp_run):
    names = sorted(os.listdir(fsdp_dcp_run))
    assert [n for n in names if n.startswith("model_")] == [
        "model_0000019.dcp", "model_best.pth", "model_final.dcp", "model_final.pth"
    ]
    assert (fsdp_dcp_run / "last_checkpoint").read_text() == "model_final.dcp"
    directory = fsdp_dcp_run / "model_0000019.dcp"
    assert sorted(os.listdir(directory)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "checksums.json"]
    # Each rank's file holds its half of the sharded tensors: neither holds the whole model.
    sizes = json.loads((directory / "checksums.json").read_text())["files"]
    model_bytes = sum(v.numel() * v.element_size() for v in _weights(fsdp_dcp_run / "model_final.pth").values())
    # The full state is the weights and SGD's momentum, 2 x model_bytes; each rank wrote its half
    # (plus DCP's per-tensor framing and, on rank 0, the 45 kB trainer record).
    for shard in ("__0_0.distcp", "__1_0.distcp"):
        assert 0.9 * model_bytes < sizes[shard]["bytes"] < 1.5 * model_bytes, (shard, sizes[shard], model_bytes)
    content = sharded.dcp_to_file_state(sharded.read_dcp(str(directory)))
    assert content["iteration"] == 19 and content["trainer"]["iteration"] == 19
    assert len(content["trainer"]["rng_per_rank"]) == 2  # every rank's random state


def test_resuming_with_two_processes_is_bit_identical(fsdp_dcp_run, tmp_path):
    run = _resume_from(fsdp_dcp_run, "model_0000019.dcp", tmp_path / "two")
    _train_net(run, "--num-gpus", "2", "--resume", *JOB, FSDP)
    _assert_equal(_weights(run / "model_final.pth"), _weights(fsdp_dcp_run / "model_final.pth"))
    resumed = sharded.dcp_to_file_state(sharded.read_dcp(str(run / "model_final.dcp")))
    straight = sharded.dcp_to_file_state(sharded.read_dcp(str(fsdp_dcp_run / "model_final.dcp")))
    for index, state in straight["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"])


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 3])
def test_a_two_process_checkpoint_resumes_on_another_world_size(fsdp_dcp_run, tmp_path, processes):
    run = _resume_from(fsdp_dcp_run, "model_0000019.dcp", tmp_path / f"on{processes}")
    launch = ["--num-gpus", str(processes), FSDP] if processes > 1 else []  # one process: a plain model
    result = _train_net(run, "--resume", *launch, *JOB)
    assert "Resuming from" in result.stdout + result.stderr or "Resuming from" in (run / "log.txt").read_text()
    # The same weights up to the order of float sums (and the RNG, which is per rank).
    _assert_close(_weights(run / "model_final.pth"), _weights(fsdp_dcp_run / "model_final.pth"))
    lines = [json.loads(line) for line in (run / "metrics.json").read_text().splitlines()]
    assert [line["iteration"] for line in lines if "total_loss" in line][0] == 29  # continued after 19


def test_an_async_sharded_run_ends_with_the_weights_of_a_sync_one(fsdp_dcp_run, tmp_path):
    run = tmp_path / "async"
    _train_net(run, "--num-gpus", "2", *JOB, FSDP, "train.checkpointer.async_save=True")
    _assert_equal(_weights(run / "model_final.pth"), _weights(fsdp_dcp_run / "model_final.pth"))
    a = sharded.dcp_to_file_state(sharded.read_dcp(str(run / "model_0000019.dcp")))
    b = sharded.dcp_to_file_state(sharded.read_dcp(str(fsdp_dcp_run / "model_0000019.dcp")))
    _assert_equal(a["model"], b["model"])


@pytest.mark.slow
def test_sharded_checkpoints_move_between_fsdp_ddp_and_one_process(fsdp_dcp_run, tmp_path):
    """FSDP (2) -> DDP (2), and one process -> FSDP (2): the saved weights load
    and training continues to the weights of the uninterrupted run."""
    as_ddp = _resume_from(fsdp_dcp_run, "model_0000019.dcp", tmp_path / "as_ddp")
    _train_net(as_ddp, "--num-gpus", "2", "--resume", *JOB, "train.checkpointer.format=dcp")
    _assert_close(_weights(as_ddp / "model_final.pth"), _weights(fsdp_dcp_run / "model_final.pth"))
    assert (as_ddp / "model_final.dcp").is_dir()

    single = tmp_path / "single"
    _train_net(single, *JOB, "train.checkpointer.format=dcp")
    assert sorted(os.listdir(single / "model_0000019.dcp")) == [".metadata", "__0_0.distcp", "checksums.json"]
    on_two = _resume_from(single, "model_0000019.dcp", tmp_path / "on_two")
    _train_net(on_two, "--num-gpus", "2", "--resume", *JOB, FSDP)
    _assert_close(_weights(on_two / "model_final.pth"), _weights(single / "model_final.pth"))
