"""Writing one checkpoint file (treadle/checkpoint/file_writer.py): atomically, kill -9 included, and a failed write named in one line."""

import errno
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import treadle
from treadle.checkpoint import (
    CheckpointError,
    Checkpointer,
    is_local_path,
    load_checkpoint_file,
)
from treadle.utils.file_io import PathManager
from tests.checkpoint.helpers import Net, assert_same_weights, messages, read_pointer, trained, visible_and_hidden


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
