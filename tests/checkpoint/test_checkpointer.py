"""Checkpointer, the front (treadle/checkpoint/checkpointer.py): what a save holds, loading it back, resume_or_load."""

import collections
import logging
import os

import sys

import pytest
import torch
from torch import nn

from treadle.checkpoint import (
    CheckpointError,
    Checkpointer,
    init_weights_from,
)
from tests.checkpoint.helpers import Counter, Net, StateOf, assert_same_weights, messages, read_pointer, trained


# ---------------------------------------------------------------- round trip
def test_round_trip_model_optimizer_custom_and_extra(tmp_path):
    model, opt = trained(0)
    counter = Counter(5)
    ckpt = Checkpointer(model, str(tmp_path / "out" / "nested"), optimizer=opt, counter=counter)
    path = ckpt.save("model_0000007", iteration=7)

    # The directory was created; the file holds exactly these entries and loads weights-only.
    assert path == str(tmp_path / "out" / "nested" / "model_0000007.pth")
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"model", "optimizer", "counter", "iteration"}
    assert raw["iteration"] == 7
    assert raw["counter"] == {"value": 5, "history": [5.0]}
    assert set(raw["model"]) == set(model.state_dict())
    assert read_pointer(tmp_path / "out" / "nested") == "model_0000007.pth"

    model2, opt2 = trained(1)
    counter2 = Counter(0)
    ckpt2 = Checkpointer(model2, str(tmp_path / "out" / "nested"), optimizer=opt2, counter=counter2)
    assert ckpt2.has_checkpoint()
    assert ckpt2.get_checkpoint_file() == path
    extra = ckpt2.resume_or_load("", resume=True)

    assert extra == {"iteration": 7}
    assert_same_weights(model, model2)
    assert counter2.value == 5 and counter2.history == [5.0]
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for idx, st in s1["state"].items():
        for k, v in st.items():
            assert torch.equal(v, s2["state"][idx][k]), (idx, k)


def test_trainer_state_with_rng_is_weights_only_safe(tmp_path):
    from treadle.engine.train_loop import TrainerBase

    trainer = TrainerBase()
    trainer.load_state_dict({"iteration": 41})  # as if iteration 41 had just run
    model = nn.Linear(2, 2)
    Checkpointer(model, str(tmp_path), trainer=trainer).save("model_0000041")
    expected = torch.rand(3)  # the first draw after the save
    torch.rand(10)

    other = TrainerBase()
    Checkpointer(nn.Linear(2, 2), str(tmp_path), trainer=other).resume_or_load()
    assert other.iter == 41
    assert torch.equal(torch.rand(3), expected)  # the generator is back where it was saved


def test_save_strips_wrappers_from_saved_keys(tmp_path):
    model = Net()
    wrapped = torch.compile(nn.DataParallel(model))  # DataParallel on CPU is a plain `.module` wrapper
    assert all(k.startswith("_orig_mod.module.") for k in wrapped.state_dict())
    Checkpointer(wrapped, str(tmp_path)).save("m")
    saved = torch.load(tmp_path / "m.pth", weights_only=True)["model"]
    assert list(saved) == list(model.state_dict())


def test_ddp_model_saves_and_loads_plain_keys(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        source, _ = trained(2)
        ddp = nn.parallel.DistributedDataParallel(source)
        Checkpointer(ddp, str(tmp_path / "out")).save("model_final")  # rank 0 saves by default
        saved = torch.load(tmp_path / "out" / "model_final.pth", weights_only=True)["model"]
        assert list(saved) == list(source.state_dict())
        target = nn.parallel.DistributedDataParallel(Net())
        Checkpointer(target, str(tmp_path / "out")).resume_or_load()
        assert_same_weights(target, source)
    finally:
        dist.destroy_process_group()


def test_compiled_submodule_is_saved_under_plain_names(tmp_path):
    model = Net()
    model.backbone = torch.compile(model.backbone)
    assert "backbone._orig_mod.0.weight" in model.state_dict()
    Checkpointer(model, str(tmp_path)).save("m")
    saved = torch.load(tmp_path / "m.pth", weights_only=True)["model"]
    plain = Net()
    plain.load_state_dict(saved)  # strict: the file needs no treadle to be used
    assert saved._metadata["backbone.1"] == plain.state_dict()._metadata["backbone.1"]
    assert torch.equal(plain.backbone[0].weight, model.backbone._orig_mod[0].weight)


class Versioned(nn.Module):
    """Records the module version load_state_dict hands it (what legacy conversions key on)."""

    _version = 3

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2))
        self.seen_version = "not loaded"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        self.seen_version = local_metadata.get("version")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


def test_module_versions_follow_renamed_keys():
    source = nn.Sequential(Versioned())
    state = source.state_dict()
    state._metadata["0"]["version"] = 1  # saved by an older version of the module
    prefixed = collections.OrderedDict(("module." + k, v) for k, v in state.items())
    prefixed._metadata = {("module." + k if k else "module"): v for k, v in state._metadata.items()}

    target = nn.Sequential(Versioned())
    init_weights_from(target, prefixed)
    assert target[0].seen_version == 1

    init_weights_from(target, {"0.weight": torch.ones(2)})  # no versions in the file: the model's own
    assert target[0].seen_version == 3
    assert torch.equal(target[0].weight.detach(), torch.ones(2))


def test_get_all_checkpoint_files_and_no_pointer(tmp_path):
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path / "missing"))
    assert not ckpt.has_checkpoint()
    assert ckpt.get_checkpoint_file() == ""
    assert ckpt.get_all_checkpoint_files() == []
    ckpt.save("model_0000002")
    ckpt.save("model_best", tag_last_checkpoint=False)
    d = tmp_path / "missing"
    assert ckpt.get_all_checkpoint_files() == [str(d / "model_0000002.pth"), str(d / "model_best.pth")]
    assert ckpt.get_checkpoint_file() == str(d / "model_0000002.pth")  # model_best did not move it


def test_save_to_disk_false_writes_nothing(tmp_path):
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path / "out"), save_to_disk=False)
    assert ckpt.save("model_0000001") is None
    assert not (tmp_path / "out").exists()


def test_save_rejects_bad_names_and_colliding_extras(tmp_path):
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path), optimizer=StateOf({}))
    with pytest.raises(ValueError, match="plain, non-hidden file name"):
        ckpt.save("sub/model")
    with pytest.raises(ValueError, match="collides with the checkpointable 'optimizer'"):
        ckpt.save("m", optimizer=1)
    with pytest.raises(TypeError, match="Checkpointable 'ema' .* has no state_dict"):
        ckpt.add_checkpointable("ema", object())
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- resume or load
def test_resume_without_checkpoint_warns_and_loads_weights_only(tmp_path, treadle_caplog):
    source, source_opt = trained(5)
    Checkpointer(source, str(tmp_path / "init"), optimizer=source_opt).save("weights", iteration=50)

    model, opt = trained(6)
    opt_before = opt.state_dict()["state"][0]["exp_avg"].clone()
    ckpt = Checkpointer(model, str(tmp_path / "run"), optimizer=opt)
    extra = ckpt.resume_or_load(str(tmp_path / "init" / "weights.pth"), resume=True)

    assert extra == {}
    assert_same_weights(model, source)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt_before)  # optimizer untouched
    warnings = messages(treadle_caplog, logging.WARNING)
    assert any(
        f"no checkpoint in '{tmp_path / 'run'}'" in w and "training starts fresh" in w and "weights.pth" in w
        for w in warnings
    ), warnings


def test_no_resume_loads_only_model_weights_even_with_checkpoints(tmp_path):
    source, source_opt = trained(5)
    Checkpointer(source, str(tmp_path), optimizer=source_opt, counter=Counter(9)).save("model_0000009", iteration=9)
    model, opt = trained(6)
    counter = Counter(1)
    ckpt = Checkpointer(model, str(tmp_path), optimizer=opt, counter=counter)
    assert ckpt.resume_or_load(str(tmp_path / "model_0000009.pth"), resume=False) == {}
    assert_same_weights(model, source)
    assert counter.value == 1
    assert ckpt.resume_or_load("", resume=False) == {}


def test_load_partial_checkpointables_and_missing_state(tmp_path, treadle_caplog):
    model, opt = trained(0)
    Checkpointer(model, str(tmp_path), optimizer=opt).save("m", iteration=1)
    counter = Counter(4)
    ckpt = Checkpointer(Net(), str(tmp_path), optimizer=torch.optim.SGD(Net().parameters(), lr=1.0), counter=counter)

    rest = ckpt.load(str(tmp_path / "m.pth"), checkpointables=[])
    assert set(rest) == {"optimizer", "iteration"}  # not consumed
    with pytest.raises(ValueError, match=r"Unknown checkpointables \['ema'\]"):
        ckpt.load(str(tmp_path / "m.pth"), checkpointables=["ema"])

    treadle_caplog.clear()
    ckpt.load(str(tmp_path / "m.pth"), checkpointables=["counter"])
    assert counter.value == 4
    assert any("has no state for 'counter'" in m for m in messages(treadle_caplog, logging.WARNING))


def test_checkpointable_load_error_names_file_and_entry(tmp_path):
    model, opt = trained(0)
    Checkpointer(model, str(tmp_path), optimizer=opt).save("m")
    other = nn.Linear(3, 3)
    wrong_opt = torch.optim.Adam([{"params": [other.weight]}, {"params": [other.bias]}])
    # Other parameter groups: refused in one line before anything is loaded.
    with pytest.raises(CheckpointError, match=rf"^The optimizer state \('optimizer'\) in '{tmp_path / 'm.pth'}' has 1 "
                                              r"parameter group\(s\) of \[\d+\] parameters, and this run's optimizer 2 of \[1, 1\]"):
        Checkpointer(Net(), str(tmp_path), optimizer=wrong_opt).load(str(tmp_path / "m.pth"))
    # Another checkpointable that refuses its state: its error carries the file and the entry.
    class Refusing:
        def state_dict(self):
            return {"n": 1}

        def load_state_dict(self, state):
            raise ValueError("not mine")

    Checkpointer(Net(), str(tmp_path), counter=Refusing()).save("c")
    with pytest.raises(ValueError, match="not mine") as info:
        Checkpointer(Net(), str(tmp_path), counter=Refusing()).load(str(tmp_path / "c.pth"))
    if sys.version_info >= (3, 11):  # exception notes (PEP 678); Python 3.10's error comes without the note
        assert f"while loading 'counter' from checkpoint '{tmp_path / 'c.pth'}'" in "\n".join(info.value.__notes__)


def test_garbage_pointer_of_a_finished_run_resumes_from_its_final_checkpoint(tmp_path):
    """model_final is written after the periodic files: it is the newest, and
    resuming from an older periodic one would train its iterations again."""
    ckpt = Checkpointer(Net(), str(tmp_path))
    for it in (3, 7):
        ckpt.save(f"model_{it:07d}", iteration=it)
    ckpt.save("model_best", tag_last_checkpoint=False, iteration=5)
    ckpt.save("model_final", iteration=9)
    (tmp_path / "last_checkpoint").write_bytes(b"\x00garbage")
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 9}
    (tmp_path / "model_final.pth").unlink()
    # Never model_best: it is a point in the past, not where the run stopped.
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 7}


def test_resume_with_every_checkpoint_unreadable_is_one_line_naming_each(tmp_path):
    """The command line shows an error's lines joined by "; ": the list of
    files tried is one line itself ("Tried:; ..." before)."""
    model = nn.Linear(2, 2)
    ckpt = Checkpointer(model, str(tmp_path))
    for it in (4, 9):
        ckpt.save(f"model_{it:07d}", iteration=it)
        path = tmp_path / f"model_{it:07d}.pth"
        path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError) as caught:
        Checkpointer(nn.Linear(2, 2), str(tmp_path)).resume_or_load()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"Cannot resume: none of the checkpoints in '{tmp_path}' could be read. Tried: ")
    tried = message.split(" Tried: ", 1)[1].split("; ")
    assert [t.split(": ", 1)[0] for t in tried if t.startswith(str(tmp_path))] == [
        str(tmp_path / "model_0000009.pth"), str(tmp_path / "model_0000004.pth")
    ]
