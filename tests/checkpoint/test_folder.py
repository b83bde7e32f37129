"""The checkpoint folder (treadle/checkpoint/folder.py): the last_checkpoint pointer, the resume order past corrupt files, pruning."""

import logging
import os
import re

import pytest
import torch
from torch import nn

from treadle.checkpoint import (
    CheckpointError,
    Checkpointer,
)
from tests.checkpoint.helpers import Net, assert_same_weights, messages, trained


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
