import collections
import enum
import errno
import io
import logging
import os
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib

import numpy as np
import pytest
import torch
from torch import nn

import treadle
from iopath.common.file_io import PathHandler
from treadle.checkpoint import (
    CheckpointError,
    Checkpointer,
    UnsafeCheckpointError,
    canonical_keys,
    check_weights_only_loadable,
    init_weights_from,
    is_local_path,
    load_checkpoint_file,
    unwrap_model,
)
from treadle.utils.file_io import PathManager
from tests.zip_records import flip_bit, record_span, tensor_record


# ---------------------------------------------------------------- helpers
class Net(nn.Module):
    """A backbone and a head, like a classifier being fine-tuned."""

    def __init__(self, num_classes: int = 3, width: int = 4):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(2, width), nn.BatchNorm1d(width))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


class Counter:
    """A custom checkpointable (an EMA, a hook, a data position...)."""

    def __init__(self, value: int = 0):
        self.value = value
        self.history = [float(value)]

    def state_dict(self):
        return {"value": self.value, "history": list(self.history)}

    def load_state_dict(self, state):
        self.value = state["value"]
        self.history = list(state["history"])


class StateOf:
    """A checkpointable whose state is whatever the test puts in it."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def trained(seed: int = 0, num_classes: int = 3):
    """A model and an Adam optimizer after one step, so that the optimizer has state."""
    torch.manual_seed(seed)
    model = Net(num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 2)).sum().backward()
    opt.step()
    return model, opt


def assert_same_weights(a: nn.Module, b: nn.Module):
    sa, sb = unwrap_model(a).state_dict(), unwrap_model(b).state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def messages(caplog, level=None):
    """Distinct log messages (the 'treadle' handler and the root one both see each record)."""
    return list(dict.fromkeys(r.getMessage() for r in caplog.records if level is None or r.levelno == level))


def read_pointer(d) -> str:
    return (d / "last_checkpoint").read_text()


def visible_and_hidden(d):
    return sorted(os.listdir(d))


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


# ---------------------------------------------------------------- atomicity
def test_failed_rename_keeps_previous_checkpoint_and_pointer(tmp_path, monkeypatch):
    model, opt = trained(0)
    ckpt = Checkpointer(model, str(tmp_path), optimizer=opt)
    ckpt.save("model_0000001", iteration=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.head.weight.add_(1.0)

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(CheckpointError, match=re.escape(f"in directory '{tmp_path}'") + ".*No space left"):
        ckpt.save("model_0000002", iteration=2)
    monkeypatch.undo()

    # No partial final file, no temporary file, the pointer still names the old file.
    assert visible_and_hidden(tmp_path) == ["last_checkpoint", "model_0000001.pth"]
    assert read_pointer(tmp_path) == "model_0000001.pth"
    fresh = Net()
    fresh_opt = torch.optim.Adam(fresh.parameters())
    assert Checkpointer(fresh, str(tmp_path), optimizer=fresh_opt).resume_or_load() == {"iteration": 1}
    for k, v in before.items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_crash_mid_write_keeps_old_file_of_same_name(tmp_path, monkeypatch):
    model = Net()
    ckpt = Checkpointer(model, str(tmp_path))
    ckpt.save("model_final", iteration=9)
    good = (tmp_path / "model_final.pth").read_bytes()
    with torch.no_grad():
        model.head.bias.fill_(123.0)

    def half_then_die(obj, f):
        f.write(good[: len(good) // 2])  # some bytes reach the temporary file...
        raise KeyboardInterrupt  # ...then the process is interrupted

    monkeypatch.setattr(torch, "save", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save("model_final", iteration=10)
    monkeypatch.undo()

    assert (tmp_path / "model_final.pth").read_bytes() == good
    assert visible_and_hidden(tmp_path) == ["last_checkpoint", "model_final.pth"]
    fresh = Net()
    extra = Checkpointer(fresh, str(tmp_path)).resume_or_load()
    assert extra == {"iteration": 9}
    assert not torch.equal(fresh.head.bias, model.head.bias)


def test_crash_before_pointer_update_resumes_previous(tmp_path, monkeypatch):
    ckpt = Checkpointer(Net(), str(tmp_path))
    ckpt.save("model_0000001", iteration=1)
    real_replace = os.replace

    def replace_files_only(src, dst):
        if os.path.basename(dst) == "last_checkpoint":
            raise OSError(5, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_files_only)
    with pytest.raises(CheckpointError, match="still names the previous checkpoint"):
        ckpt.save("model_0000002", iteration=2)
    monkeypatch.undo()

    assert read_pointer(tmp_path) == "model_0000001.pth"
    assert visible_and_hidden(tmp_path) == ["last_checkpoint", "model_0000001.pth", "model_0000002.pth"]
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 1}


def test_kill_9_during_save_leaves_previous_usable(tmp_path):
    """A real SIGKILL in the middle of writing: the temporary file is left
    behind, nothing else changes, and prune removes the leftover."""
    script = textwrap.dedent(
        """
        import os, signal, sys, torch
        from torch import nn
        from treadle.checkpoint import Checkpointer
        torch.manual_seed(0)
        model = nn.Linear(16, 16)
        ckpt = Checkpointer(model, sys.argv[1], save_to_disk=True)
        ckpt.save("model_0000001", iteration=1)
        with torch.no_grad():
            model.weight.add_(1.0)
        def dying_save(obj, f):
            f.write(b"PK\\x03\\x04 half a checkpoint")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = dying_save
        ckpt.save("model_0000002", iteration=2)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(treadle.__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()

    names = visible_and_hidden(tmp_path)
    leftovers = [n for n in names if n.startswith(".model_0000002.pth.tmp.")]
    assert len(leftovers) == 1 and names == sorted(["last_checkpoint", "model_0000001.pth"] + leftovers)
    assert read_pointer(tmp_path) == "model_0000001.pth"

    torch.manual_seed(0)
    expected = nn.Linear(16, 16)
    loaded = nn.Linear(16, 16)
    ckpt = Checkpointer(loaded, str(tmp_path))
    assert ckpt.resume_or_load() == {"iteration": 1}
    assert_same_weights(loaded, expected)
    assert ckpt.prune(keep_last=3) == [str(tmp_path / leftovers[0])]
    assert visible_and_hidden(tmp_path) == ["last_checkpoint", "model_0000001.pth"]


# ---------------------------------------------------------------- unsafe files
def _plant_marker(path):
    with open(path, "w") as f:
        f.write("code from the checkpoint ran")


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (_plant_marker, (self.marker,))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, zip_format):
    marker = tmp_path / "marker"
    out = tmp_path / "out"
    out.mkdir()
    evil = out / "model_0000005.pth"
    torch.save(
        {"model": Net().state_dict(), "iteration": 5, "payload": _Payload(str(marker))},
        evil,
        _use_new_zipfile_serialization=zip_format,
    )
    (out / "last_checkpoint").write_text("model_0000005.pth")
    ckpt = Checkpointer(Net(), str(out))

    with pytest.raises(UnsafeCheckpointError) as info:
        ckpt.load(str(evil))
    message = str(info.value)
    assert f"'{evil}'" in message
    assert "would run code from the file" in message and "not loaded" in message
    assert "_plant_marker" in message
    assert not marker.exists()

    # Resuming does not fall back past it either: the file is intact, a person must decide.
    with pytest.raises(UnsafeCheckpointError):
        ckpt.resume_or_load()
    with pytest.raises(UnsafeCheckpointError):
        init_weights_from(Net(), str(evil))
    assert not marker.exists()

    # The payload is live: an unsafe load does run it (so the checks above mean something).
    torch.load(evil, weights_only=False)
    assert marker.read_text() == "code from the checkpoint ran"


# ---------------------------------------------------------------- corrupt files
def test_truncated_newest_falls_back_to_previous_with_warning(tmp_path, treadle_caplog):
    first, _ = trained(0)
    ckpt = Checkpointer(first, str(tmp_path))
    ckpt.save("model_0000001", iteration=1)
    second, _ = trained(1)
    Checkpointer(second, str(tmp_path)).save("model_0000002", iteration=2)
    newest = tmp_path / "model_0000002.pth"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])

    fresh = Net()
    extra = Checkpointer(fresh, str(tmp_path)).resume_or_load()

    assert extra == {"iteration": 1}
    assert_same_weights(fresh, first)
    warnings = messages(treadle_caplog, logging.WARNING)
    assert any(str(newest) in w and "truncated or corrupt" in w for w in warnings), warnings
    assert any("older checkpoint" in w and "model_0000001.pth" in w for w in warnings), warnings


def test_pointer_to_missing_file_falls_back_by_iteration_number(tmp_path, treadle_caplog):
    ckpt = Checkpointer(Net(), str(tmp_path))
    for it in (3, 10, 7):  # saved out of order: the number in the name decides, not the save order
        ckpt.save(f"model_{it:07d}", iteration=it)
    ckpt.save("model_best", tag_last_checkpoint=False, iteration=5)
    (tmp_path / "last_checkpoint").write_text("model_0000099.pth")
    treadle_caplog.clear()
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 10}
    assert messages(treadle_caplog, logging.WARNING) == [
        f"The checkpoint pointer '{tmp_path / 'last_checkpoint'}' is unusable: it names model_0000099.pth, which "
        f"does not exist in '{tmp_path}'. Resuming from {tmp_path / 'model_0000010.pth'}, the newest checkpoint "
        "file, instead."
    ]


_GARBAGE_POINTERS = {
    "binary": (b"\x00\x9f\x92\x96PK\x03\x04\xff", repr(b"\x00\x9f\x92\x96PK\x03\x04\xff")),
    "absolute_path": (b"/etc/passwd\n", "'/etc/passwd'"),
    "relative_path": (b"../other_run/model_0000010.pth", "'../other_run/model_0000010.pth'"),
    "two_lines": (b"model_0000003.pth\nmodel_0000010.pth\n", "'model_0000003.pth\\nmodel_0000010.pth'"),
    "hidden_file": (b".model_0000011.pth.tmp.4242.0badf00d", "'.model_0000011.pth.tmp.4242.0badf00d'"),
    "huge": (b"model_" * 1000, "'model_model_model_model_model_model_mode'..."),
    "empty": (b"  \n", None),
}


@pytest.mark.parametrize("kind", sorted(_GARBAGE_POINTERS))
def test_garbage_pointer_says_so_and_resumes_from_the_newest_file(tmp_path, treadle_caplog, kind):
    content, shown = _GARBAGE_POINTERS[kind]
    ckpt = Checkpointer(Net(), str(tmp_path))
    for it in (3, 10, 7):
        ckpt.save(f"model_{it:07d}", iteration=it)
    (tmp_path / "last_checkpoint").write_bytes(content)
    treadle_caplog.clear()

    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 10}

    (warning,) = messages(treadle_caplog, logging.WARNING)
    problem = "it is empty" if shown is None else f"it holds {shown}, not the name of a file in '{tmp_path}'"
    assert warning == (
        f"The checkpoint pointer '{tmp_path / 'last_checkpoint'}' is unusable: {problem}. "
        f"Resuming from {tmp_path / 'model_0000010.pth'}, the newest checkpoint file, instead."
    )
    assert "older" not in warning and len(warning.splitlines()) == 1
    # Nothing else trusts it either.
    assert Checkpointer(Net(), str(tmp_path)).get_checkpoint_file() == ""


def test_garbage_pointer_and_unreadable_newest_file_resume_from_an_older_one(tmp_path, treadle_caplog):
    ckpt = Checkpointer(Net(), str(tmp_path))
    for it in (3, 7, 10):
        ckpt.save(f"model_{it:07d}", iteration=it)
    (tmp_path / "model_0000010.pth").write_bytes(b"")
    (tmp_path / "last_checkpoint").write_bytes(b"\xff\xfe")
    treadle_caplog.clear()
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 7}
    warnings = messages(treadle_caplog, logging.WARNING)
    assert warnings[0].startswith(f"Cannot resume from {tmp_path / 'model_0000010.pth'} (")
    assert warnings[0].endswith("; trying model_0000007.pth.")
    assert warnings[1] == (
        f"The checkpoint pointer '{tmp_path / 'last_checkpoint'}' is unusable: it holds b'\\xff\\xfe', not the name "
        f"of a file in '{tmp_path}'. Resuming from {tmp_path / 'model_0000007.pth'}, an older checkpoint than the "
        "newest one: model_0000010.pth could not be read."
    )


def test_unreadable_pointed_file_with_a_newer_one_beside_it_is_not_called_older(tmp_path, treadle_caplog):
    """The pointer lags behind (a crash between a file's rename and the pointer's): model_10 is newer than model_5."""
    ckpt = Checkpointer(Net(), str(tmp_path))
    ckpt.save("model_0000005", iteration=5)
    ckpt.save("model_0000010", iteration=10, tag_last_checkpoint=False)
    (tmp_path / "model_0000005.pth").write_bytes(b"PK\x03\x04 damaged")
    treadle_caplog.clear()
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 10}
    assert messages(treadle_caplog, logging.WARNING)[-1] == (
        f"Resuming from {tmp_path / 'model_0000010.pth'} instead of model_0000005.pth, which last_checkpoint names "
        "and could not be read."
    )


def test_unreadable_final_checkpoint_falls_back_to_an_older_numbered_one(tmp_path, treadle_caplog):
    ckpt = Checkpointer(Net(), str(tmp_path))
    ckpt.save("model_0000019", iteration=19)
    ckpt.save("model_final", iteration=29)
    (tmp_path / "model_final.pth").write_bytes(b"")
    treadle_caplog.clear()
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load() == {"iteration": 19}
    assert messages(treadle_caplog, logging.WARNING)[-1] == (
        f"Resuming from {tmp_path / 'model_0000019.pth'}, an older checkpoint than the newest one: "
        "model_final.pth could not be read."
    )


@pytest.mark.parametrize("content", [b"model_0000004.pth", b"\x00\x01"], ids=["missing_file", "binary"])
def test_unusable_pointer_without_checkpoint_files_is_an_error(tmp_path, content):
    """The run saved checkpoints here: starting over silently could throw its progress away."""
    (tmp_path / "last_checkpoint").write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        Checkpointer(Net(), str(tmp_path)).resume_or_load()
    message = str(info.value)
    assert message.startswith(f"Cannot resume: the checkpoint pointer '{tmp_path / 'last_checkpoint'}' is unusable (")
    assert "no model_*.pth file to resume from instead" in message and len(message.splitlines()) == 1
    # Without resume, the pointer does not matter.
    assert Checkpointer(Net(), str(tmp_path)).resume_or_load(resume=False) == {}


def test_no_readable_checkpoint_lists_what_was_tried(tmp_path):
    (tmp_path / "model_0000001.pth").write_bytes(b"")
    (tmp_path / "model_0000002.pth").write_bytes(os.urandom(200))
    with pytest.raises(CheckpointError) as info:
        Checkpointer(Net(), str(tmp_path)).resume_or_load()
    message = str(info.value)
    assert f"checkpoints in '{tmp_path}'" in message
    assert message.index("model_0000002.pth") < message.index("model_0000001.pth")  # newest first


def test_load_corrupt_and_missing_files_name_them(tmp_path):
    ckpt = Checkpointer(Net(), str(tmp_path))
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"PK\x03\x04 not a checkpoint at all")
    with pytest.raises(CheckpointError, match=re.escape(f"'{garbage}' is truncated or corrupt")):
        ckpt.load(str(garbage))
    with pytest.raises(CheckpointError, match="'.*nope.pth' does not exist"):
        ckpt.load(str(tmp_path / "nope.pth"))
    torch.save([1, 2], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="holds a list, not the dict"):
        ckpt.load(str(tmp_path / "list.pth"))


# ---------------------------------------------------------------- checksums
def test_flipped_bit_in_tensor_data_is_a_checksum_error_and_resume_falls_back(tmp_path, treadle_caplog):
    first, _ = trained(0)
    Checkpointer(first, str(tmp_path)).save("model_0000001", iteration=1)
    second, _ = trained(1)
    Checkpointer(second, str(tmp_path)).save("model_0000002", iteration=2)
    newest = tmp_path / "model_0000002.pth"
    offset, size = record_span(newest, tensor_record(newest, second.head.weight))
    flip_bit(newest, offset + size // 2, bit=3)

    # What torch alone does: loads the damaged weight without a word.
    raw = torch.load(newest, weights_only=True)
    assert not torch.equal(raw["model"]["head.weight"], second.head.weight)

    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(str(newest))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert f"'{newest}' is corrupt" in message and "checksum" in message and "/data/" in message

    fresh = Net()
    assert Checkpointer(fresh, str(tmp_path)).resume_or_load() == {"iteration": 1}
    assert_same_weights(fresh, first)
    warnings = messages(treadle_caplog, logging.WARNING)
    assert any(f"Cannot resume from {newest}" in w and "checksum" in w for w in warnings), warnings
    assert any("model_0000001.pth, an older checkpoint" in w for w in warnings), warnings


def test_flipped_bit_in_the_pickle_is_a_checksum_error(tmp_path):
    Checkpointer(Net(), str(tmp_path)).save("model_0000003", iteration=3)
    path = tmp_path / "model_0000003.pth"
    offset, size = record_span(path, "/data.pkl")
    with open(path, "rb") as f:
        f.seek(offset)
        pickle_bytes = f.read(size)
    # The last letter of the key "iteration": 'n' becomes 'o', still a valid pickle.
    flip_bit(path, offset + pickle_bytes.index(b"iteration") + len("iteratio"), bit=0)
    assert "iteratioo" in torch.load(path, weights_only=True)  # torch alone does not notice

    with pytest.raises(CheckpointError, match=r"is corrupt: the checksum \(CRC-32\) of its record '[^']*/data\.pkl'"):
        load_checkpoint_file(str(path))


def test_checksums_are_written_even_when_turned_off_globally(tmp_path, monkeypatch):
    torch.serialization.set_crc32_options(False)
    try:
        Checkpointer(Net(), str(tmp_path)).save("model_0000001")
        assert torch.serialization.get_crc32_options() is False  # the user's setting is back

        def failing_save(obj, f):
            assert torch.serialization.get_crc32_options() is True
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(torch, "save", failing_save)
        with pytest.raises(CheckpointError):
            Checkpointer(Net(), str(tmp_path)).save("model_0000002")
        assert torch.serialization.get_crc32_options() is False  # also after a failed save
    finally:
        torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(tmp_path / "model_0000001.pth") as archive:
        records = archive.infolist()
        assert all(r.CRC == zlib.crc32(archive.read(r)) for r in records)
        assert any(r.CRC for r in records)


@pytest.mark.parametrize("kind", ["crc32_off", "legacy"])
def test_files_without_checksums_load_unverified_with_a_note(tmp_path, kind, treadle_caplog):
    """Weights from other tools: a zip saved with CRC-32 off, or torch's legacy (non-zip) format."""
    source, _ = trained(2)
    path = tmp_path / "elsewhere.pth"
    if kind == "crc32_off":
        torch.serialization.set_crc32_options(False)
        try:
            torch.save({"model": source.state_dict()}, path)
        finally:
            torch.serialization.set_crc32_options(True)
        with zipfile.ZipFile(path) as archive:
            assert {r.CRC for r in archive.infolist()} == {0}
    else:
        torch.save({"model": source.state_dict()}, path, _use_new_zipfile_serialization=False)
        assert not zipfile.is_zipfile(path)

    target = Net()
    init_weights_from(target, str(path))
    assert_same_weights(target, source)
    assert any(
        f"'{path}' carries no checksums" in m and "without checking its content" in m for m in messages(treadle_caplog)
    )


def test_recompressed_archive_is_verified_too(tmp_path):
    """torch.load reads a zip whose records were deflated (re-zipped by some tool); its checksums still count."""
    source, _ = trained(3)
    Checkpointer(source, str(tmp_path)).save("model_0000001", iteration=1)
    deflated = tmp_path / "deflated.pth"
    with zipfile.ZipFile(tmp_path / "model_0000001.pth") as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for record in src.infolist():
            dst.writestr(record.filename, src.read(record))
    assert load_checkpoint_file(str(deflated))["iteration"] == 1

    with zipfile.ZipFile(deflated) as archive:
        (info,) = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
    with open(deflated, "rb") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
    flip_bit(deflated, info.header_offset + 30 + name_length + extra_length + info.compress_size // 2)
    with pytest.raises(CheckpointError, match=r"is corrupt: the checksum \(CRC-32\) of its record '[^']*/data\.pkl'"):
        load_checkpoint_file(str(deflated))


def test_checksum_verification_reads_through_handlers_without_readinto(tmp_path, remote_like):
    """iopath file objects of other backends may lack readinto; a damaged file is still caught."""
    source, _ = trained(4)
    ckpt = Checkpointer(source, remote_like + "run")
    ckpt.save("model_0000001", iteration=1)
    path = tmp_path / "run" / "model_0000001.pth"
    offset, size = record_span(path, tensor_record(path, source.head.weight))

    class NoReadinto:
        def __init__(self, f):
            self._f = f

        def __getattr__(self, name):
            if name == "readinto":
                raise AttributeError(name)
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    handler = PathManager._path_handlers[remote_like]
    real_open = handler._open
    handler._open = lambda p, mode="r", **kw: NoReadinto(real_open(p, mode, **kw))
    try:
        assert load_checkpoint_file(remote_like + "run/model_0000001.pth")["iteration"] == 1
        flip_bit(path, offset + size - 1, bit=7)
        with pytest.raises(CheckpointError, match="checksum"):
            load_checkpoint_file(remote_like + "run/model_0000001.pth")
    finally:
        handler._open = real_open


# ---------------------------------------------------------------- model key matching
def test_canonical_keys():
    assert canonical_keys(["module._orig_mod.a.weight", "module._orig_mod.b"]) == {
        "a.weight": "module._orig_mod.a.weight",
        "b": "module._orig_mod.b",
    }
    # A compiled submodule inside, and a lone child called "module" that must stay.
    assert canonical_keys(["backbone._orig_mod.conv.weight", "module.x", "y"]) == {
        "backbone.conv.weight": "backbone._orig_mod.conv.weight",
        "module.x": "module.x",
        "y": "y",
    }
    with pytest.raises(ValueError, match="'a' and '_orig_mod.a' are the same parameter"):
        canonical_keys(["a", "_orig_mod.a"])


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod.", "_orig_mod.module."])
def test_load_accepts_wrapper_prefixed_state_dicts(tmp_path, prefix):
    source, _ = trained(3)
    state = {prefix + k: v for k, v in source.state_dict().items()}
    torch.save({"model": state, "iteration": 4}, tmp_path / "wrapped.pth")
    target = Net()
    extra = Checkpointer(target, str(tmp_path)).load(str(tmp_path / "wrapped.pth"))
    assert extra == {"iteration": 4}
    assert_same_weights(target, source)


def test_load_into_wrapped_model(tmp_path):
    source, _ = trained(3)
    torch.save({"model": source.state_dict()}, tmp_path / "plain.pth")
    inner = Net()
    wrapped = torch.compile(nn.DataParallel(inner))
    Checkpointer(wrapped, str(tmp_path)).load(str(tmp_path / "plain.pth"))
    assert_same_weights(inner, source)


def test_shape_mismatch_is_skipped_and_tabulated(tmp_path, treadle_caplog):
    source, _ = trained(0, num_classes=10)
    source.extra = nn.Linear(1, 1)  # in the checkpoint, not in the target: unexpected
    torch.save({"model": source.state_dict()}, tmp_path / "ten.pth")
    target = Net(num_classes=5)
    target.neck = nn.Linear(4, 4)  # in the target, not in the checkpoint: missing
    head_before = target.head.weight.clone()

    Checkpointer(target, str(tmp_path)).load(str(tmp_path / "ten.pth"))

    for k, v in source.backbone.state_dict().items():
        assert torch.equal(target.backbone.state_dict()[k], v), k
    assert torch.equal(target.head.weight, head_before)
    (message,) = [m for m in messages(treadle_caplog, logging.WARNING) if "were not loaded" in m]
    rows = {
        line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
        for line in message.splitlines()
        if line.startswith("| ") and "status" not in line
    }
    assert rows == {
        "head.weight": ["shape mismatch", "head.weight", "(10, 4)", "(5, 4)"],
        "head.bias": ["shape mismatch", "head.bias", "(10,)", "(5,)"],
        "neck.weight": ["missing", "neck.weight", "-", "(4, 4)"],
        "neck.bias": ["missing", "neck.bias", "-", "(4,)"],
        "extra.weight": ["unexpected", "extra.weight", "(1, 1)", "-"],
        "extra.bias": ["unexpected", "extra.bias", "(1,)", "-"],
    }  # loaded keys are not listed on load, only what went wrong


def test_init_weights_from_backbone_into_new_head(tmp_path, treadle_caplog):
    pretrained, _ = trained(0, num_classes=1000)
    Checkpointer(pretrained, str(tmp_path)).save("pretrained")
    model = torch.compile(Net(num_classes=7))

    report = init_weights_from(model, str(tmp_path / "pretrained.pth"))

    backbone_keys = sorted(pretrained.backbone.state_dict())
    assert sorted(report.loaded) == ["backbone." + k for k in backbone_keys]
    assert [(m.key, m.checkpoint_shape, m.model_shape) for m in report.shape_mismatched] == [
        ("head.weight", (1000, 4), (7, 4)),
        ("head.bias", (1000,), (7,)),
    ]
    assert report.missing == [] and report.unexpected == [] and not report.complete
    assert torch.equal(unwrap_model(model).backbone[0].weight, pretrained.backbone[0].weight)
    (message,) = [m for m in messages(treadle_caplog) if "Initialized" in m]
    assert "Initialized 7 of 9 model keys" in message
    assert "| loaded         | backbone.0.{bias, weight}" in message
    assert "| shape mismatch | head.weight" in message and "(1000, 4)" in message


def test_init_weights_from_bare_backbone_with_prefix_map():
    torch.manual_seed(1)
    backbone = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4))
    model = Net()
    report = init_weights_from(model, backbone.state_dict(), prefix_map={"": "backbone."})
    assert report.missing == ["head.weight", "head.bias"]
    assert report.unexpected == []
    assert torch.equal(model.backbone[1].running_var, backbone[1].running_var)
    with pytest.raises(TypeError, match="a file path or a state dict"):
        init_weights_from(model, 3)


# ---------------------------------------------------------------- pruning
def _names(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".pth"))


def test_prune_counts_files_on_disk_across_restarts(tmp_path):
    first = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    for it in range(4):
        first.save(f"model_{it:07d}", iteration=it)
        first.prune(keep_last=2)
    first.save("model_best", tag_last_checkpoint=False)
    assert _names(tmp_path) == ["model_0000002.pth", "model_0000003.pth", "model_best.pth"]

    # A restarted run: a new Checkpointer that has saved nothing yet still sees the old files.
    second = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    second.save("model_0000004", iteration=4)
    deleted = second.prune(keep_last=2)
    assert deleted == [str(tmp_path / "model_0000002.pth")]
    second.save("model_final")
    second.prune(keep_last=2)
    assert _names(tmp_path) == ["model_0000003.pth", "model_0000004.pth", "model_best.pth", "model_final.pth"]


def test_prune_never_deletes_the_pointed_to_file(tmp_path):
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    for it in (10, 20, 30):
        ckpt.save(f"model_{it:07d}", iteration=it)
    ckpt.tag_last_checkpoint("model_0000010.pth")  # e.g. resumed from an older file
    ckpt.prune(keep_last=1)
    assert _names(tmp_path) == ["model_0000010.pth", "model_0000030.pth"]
    ckpt.tag_last_checkpoint("model_0000030.pth")
    ckpt.save("ckpt_0000001", tag_last_checkpoint=False)
    # model_0000010 is protected by name now; other prefixes are not touched.
    assert ckpt.prune(keep_last=1, protect=("model_0000010",)) == []
    assert _names(tmp_path) == ["ckpt_0000001.pth", "model_0000010.pth", "model_0000030.pth"]
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        ckpt.prune(keep_last=0)


def test_prune_keeps_this_process_temporary_files(tmp_path):
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    ckpt.save("model_0000001")
    mine = tmp_path / f".model_0000002.pth.tmp.{os.getpid()}.0123abcd"
    other = tmp_path / ".model_0000002.pth.tmp.999999999.89abcdef"
    unrelated = tmp_path / ".notes.tmp"
    for p in (mine, other, unrelated):
        p.write_bytes(b"x")
    assert ckpt.prune(keep_last=5) == [str(other)]
    assert mine.exists() and unrelated.exists()


# ---------------------------------------------------------------- what may be saved
def test_unsupported_object_is_a_type_error_naming_its_key_path(tmp_path):
    trainer = StateOf({"iteration": 3, "hooks": {"EMA": {"decay": 0.99, "fn": lambda x: x}}})
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path / "out"), trainer=trainer)
    with pytest.raises(TypeError) as info:
        ckpt.save("model_0000003")
    message = str(info.value)
    assert "'trainer.hooks.EMA.fn'" in message and "builtins.function" in message
    assert "Nothing was written" in message
    assert not (tmp_path / "out").exists()

    trainer.state = {"lrs": [0.1, np.float64(0.2)]}
    with pytest.raises(TypeError, match=r"'trainer\.lrs\[1\]' is a numpy\.float64.*\.item\(\)"):
        ckpt.save("model_0000003")
    trainer.state = {"lrs": [0.1, 0.2]}
    with pytest.raises(TypeError, match=r"'scale' is a numpy\.ndarray"):
        ckpt.save("model_0000003", scale=np.ones(2))
    assert not (tmp_path / "out").exists()


class _Color(enum.Enum):
    RED = 1


_Point = collections.namedtuple("_Point", "x y")
_tagged = torch.ones(2)
_tagged.note = "kept"
_tagged_bad = torch.ones(2)
_tagged_bad.fn = len

def _with_attribute(mapping, value):
    mapping.extra = value
    return mapping


_VALUES = {
    "none_bool_int": [None, True, 2**70, -1],
    "float_complex": [float("nan"), 1.5, 2j],
    "str_bytes": ["a", b"b", bytearray(b"c")],
    "torch_types": [torch.float16, torch.device("cpu"), torch.Size([2, 3]), torch.strided],
    "containers": {"a": (1, [2, {3}]), 4: collections.OrderedDict(b=1), (5, 6): collections.Counter(c=2)},
    "tensors": [torch.ones(2, dtype=torch.bfloat16), nn.Parameter(torch.ones(1)), torch.arange(6)[2:4]],
    "tensor_with_attribute": _tagged,
    "tensor_with_function_attribute": _tagged_bad,
    "frozenset": frozenset([1]),
    "slice": slice(1, 2),
    "numpy_scalar": np.int64(3),
    "enum": _Color.RED,
    "defaultdict": collections.defaultdict(int),
    "namedtuple": _Point(1, 2),
    "function": len,
    "type": int,
    "enum_key": {_Color.RED: 1},
    "ordered_dict_attribute": _with_attribute(collections.OrderedDict(a=1), {"version": 2}),
    "ordered_dict_bad_attribute": _with_attribute(collections.OrderedDict(a=1), len),
}


@pytest.mark.parametrize("name", sorted(_VALUES))
def test_save_check_agrees_with_weights_only_load(name):
    value = {"x": _VALUES[name]}
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
        torch_accepts = True
    except Exception:
        torch_accepts = False
    try:
        check_weights_only_loadable(value)
        we_accept = True
    except TypeError as e:
        we_accept = False
        assert "'x" in str(e)  # the key path starts at the top-level key
    assert we_accept == torch_accepts


def test_graph_tensor_is_named():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(TypeError, match=r"'loss\.total' is part of an autograd graph.*\.detach\(\)"):
        check_weights_only_loadable({"loss": {"total": (x * 2).sum()}})
    check_weights_only_loadable({"loss": {"total": (x * 2).sum().detach(), "leaf": x}})


def test_self_referencing_state_terminates():
    loop = [1]
    loop.append(loop)
    check_weights_only_loadable({"loop": loop})


# ---------------------------------------------------------------- directories
def test_unwritable_directory_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    save_dir = blocker / "checkpoints"
    ckpt = Checkpointer(nn.Linear(1, 1), str(save_dir))
    with pytest.raises(CheckpointError, match=re.escape(f"Cannot create the checkpoint directory '{save_dir}'")):
        ckpt.save("model_0000001")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_directory_is_named(tmp_path):
    save_dir = tmp_path / "ro"
    save_dir.mkdir()
    save_dir.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match=re.escape(f"in directory '{save_dir}'")):
            Checkpointer(nn.Linear(1, 1), str(save_dir)).save("model_0000001")
    finally:
        save_dir.chmod(0o700)


def test_permission_denied_is_named(tmp_path, monkeypatch):
    """What a read-only directory gives a non-root user, simulated (these tests may run as root)."""
    ckpt = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    ckpt.save("model_0000001")
    real_open = PathManager.open

    def deny_new_files(path, mode="r", **kwargs):
        if "x" in mode or "w" in mode:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, mode, **kwargs)

    monkeypatch.setattr(PathManager, "open", deny_new_files)
    with pytest.raises(CheckpointError) as info:
        ckpt.save("model_0000002")
    monkeypatch.undo()
    assert str(info.value) == (
        f"Cannot write checkpoint '{tmp_path / 'model_0000002.pth'}' in directory '{tmp_path}': Permission denied "
        "(EACCES). The previous checkpoints and last_checkpoint are untouched."
    )
    assert visible_and_hidden(tmp_path) == ["last_checkpoint", "model_0000001.pth"]


class _FillsUp:
    """A file whose writes fail with ENOSPC once ``room`` bytes were written, like a disk filling up."""

    def __init__(self, f, room: int):
        self._f, self._room = f, room

    def write(self, data):
        n = len(memoryview(data))
        if n > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= n
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def assert_previous_checkpoint_intact(d, name="model_0000001.pth", iteration=1):
    assert visible_and_hidden(d) == ["last_checkpoint", name]  # no partial file, no temporary file
    assert read_pointer(d) == name
    assert load_checkpoint_file(str(d / name))["iteration"] == iteration


# Room for: nothing (the first write fails, an OSError from Python), part of
# the pickle, and most of the tensor data (torch's zip writer then raises a
# RuntimeError with the OSError as its context).
@pytest.mark.parametrize("room", [0, 100, 3000], ids=["first_write", "in_the_pickle", "in_tensor_data"])
def test_disk_full_during_a_save_is_one_line_naming_the_file_and_the_os_error(tmp_path, monkeypatch, room):
    model = nn.Linear(32, 32)
    ckpt = Checkpointer(model, str(tmp_path))
    ckpt.save("model_0000001", iteration=1)
    real_open = PathManager.open

    def open_filling_up(path, mode="r", **kwargs):
        f = real_open(path, mode, **kwargs)
        return _FillsUp(f, room) if "x" in mode else f

    monkeypatch.setattr(PathManager, "open", open_filling_up)
    with pytest.raises(CheckpointError) as info:
        ckpt.save("model_0000002", iteration=2)
    monkeypatch.undo()

    assert str(info.value) == (
        f"Cannot write checkpoint '{tmp_path / 'model_0000002.pth'}' in directory '{tmp_path}': No space left on "
        "device (ENOSPC). The previous checkpoints and last_checkpoint are untouched."
    )
    assert_previous_checkpoint_intact(tmp_path)


def test_torch_write_failure_without_an_os_error_is_one_line(tmp_path, monkeypatch):
    """torch.save to a path raises only its own message (errno is lost in C++): it is named, with the free space."""
    ckpt = Checkpointer(nn.Linear(2, 2), str(tmp_path))
    ckpt.save("model_0000001", iteration=1)

    def torch_fails(obj, f):
        f.write(b"PK\x03\x04")
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: "
            "file write failed\nException raised from ... (most recent call first):\nframe #0: ..."
        )

    monkeypatch.setattr(torch, "save", torch_fails)
    with pytest.raises(CheckpointError) as info:
        ckpt.save("model_0000002", iteration=2)
    monkeypatch.undo()
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(
        f"Cannot write checkpoint '{tmp_path / 'model_0000002.pth'}' in directory '{tmp_path}': torch.save failed "
        "([enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file write "
        "failed); "
    )
    assert re.search(r"; \d+\.\d MiB free on its filesystem\. The previous checkpoints and last_checkpoint are untouched\.$", message)
    assert_previous_checkpoint_intact(tmp_path)


def test_other_runtime_errors_of_torch_save_are_not_disguised(tmp_path, monkeypatch):
    ckpt = Checkpointer(nn.Linear(2, 2), str(tmp_path))
    ckpt.save("model_0000001", iteration=1)

    def device_fails(obj, f):
        try:
            open(os.path.join(str(tmp_path), "no-such-cache"))  # an OSError handled on the way...
        except OSError:
            # ...is not the cause: raised as the context, as torch raises it
            raise RuntimeError("CUDA error: an illegal memory access was encountered")  # noqa: B904

    monkeypatch.setattr(torch, "save", device_fails)
    with pytest.raises(RuntimeError, match="illegal memory access") as info:
        ckpt.save("model_0000002", iteration=2)
    monkeypatch.undo()
    assert not isinstance(info.value, CheckpointError)
    assert_previous_checkpoint_intact(tmp_path)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 192 KiB tmpfs (needs root and a container that allows mounts; skipped otherwise)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=192k", "treadle-test", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs: {e}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def test_real_full_filesystem_keeps_the_previous_checkpoint(small_tmpfs):
    model = nn.Linear(64, 128)  # ~33 KiB a checkpoint: a few fit, then the disk is full
    ckpt = Checkpointer(model, str(small_tmpfs))
    saved = []
    with pytest.raises(CheckpointError) as info:
        for it in range(1, 20):
            with torch.no_grad():
                model.weight.add_(1.0)
            ckpt.save(f"model_{it:07d}", iteration=it)
            saved.append(it)
    message = str(info.value)
    failed = f"model_{saved[-1] + 1:07d}.pth"
    assert len(saved) >= 1 and len(message.splitlines()) == 1
    assert message.startswith(f"Cannot write checkpoint '{small_tmpfs / failed}' in directory '{small_tmpfs}': ")
    assert "No space left on device (ENOSPC)" in message or "MiB free on its filesystem" in message
    last = f"model_{saved[-1]:07d}.pth"
    assert read_pointer(small_tmpfs) == last
    assert not [n for n in os.listdir(small_tmpfs) if n.startswith(".")]  # the partial file was removed
    state = load_checkpoint_file(str(small_tmpfs / last))
    assert state["iteration"] == saved[-1] and torch.equal(state["model"]["weight"], model.weight.detach() - 1.0)


def test_save_without_save_dir_is_an_error():
    with pytest.raises(ValueError, match="needs a save_dir"):
        Checkpointer(nn.Linear(1, 1)).save("model_final")


class _RemoteLikeHandler(PathHandler):
    """An iopath handler that is not the native one (like s3://), backed by a local folder."""

    PREFIX = "treadle-test-remote://"

    def __init__(self, root):
        super().__init__()
        self.root = root

    def _get_supported_prefixes(self):
        return [self.PREFIX]

    def _local(self, path):
        return os.path.join(self.root, path[len(self.PREFIX):])

    def _open(self, path, mode="r", buffering=-1, **kwargs):
        return open(self._local(path), mode)

    def _exists(self, path, **kwargs):
        return os.path.exists(self._local(path))

    def _isfile(self, path, **kwargs):
        return os.path.isfile(self._local(path))

    def _isdir(self, path, **kwargs):
        return os.path.isdir(self._local(path))

    def _ls(self, path, **kwargs):
        return os.listdir(self._local(path))

    def _mkdirs(self, path, **kwargs):
        os.makedirs(self._local(path), exist_ok=True)

    def _rm(self, path, **kwargs):
        os.remove(self._local(path))


@pytest.fixture
def remote_like(tmp_path):
    PathManager.register_handler(_RemoteLikeHandler(str(tmp_path)), allow_override=True)
    try:
        yield _RemoteLikeHandler.PREFIX
    finally:
        # iopath has no public way to unregister a handler.
        PathManager._path_handlers.pop(_RemoteLikeHandler.PREFIX, None)


def test_non_local_backend_writes_in_place_and_resumes(tmp_path, remote_like, treadle_caplog):
    assert not is_local_path(remote_like + "run") and is_local_path(str(tmp_path))
    source, _ = trained(4)
    ckpt = Checkpointer(source, remote_like + "run")
    ckpt.save("model_0000003", iteration=3)
    ckpt.save("model_0000004", iteration=4)
    assert ckpt.prune(keep_last=1) == [remote_like + "run/model_0000003.pth"]
    assert sorted(os.listdir(tmp_path / "run")) == ["last_checkpoint", "model_0000004.pth"]
    notes = [m for m in messages(treadle_caplog) if "not on the local filesystem" in m]
    assert notes == [
        f"Checkpoints in '{remote_like}run' are not on the local filesystem: they are written in place, so "
        "whether a crash mid-write can leave a partial file depends on the storage backend."
    ]  # once per Checkpointer, not per save

    target = Net()
    assert Checkpointer(target, remote_like + "run").resume_or_load() == {"iteration": 4}
    assert_same_weights(target, source)


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
    with pytest.raises(ValueError) as info:
        Checkpointer(Net(), str(tmp_path), optimizer=wrong_opt).load(str(tmp_path / "m.pth"))
    assert f"while loading 'optimizer' from checkpoint '{tmp_path / 'm.pth'}'" in "\n".join(info.value.__notes__)


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
