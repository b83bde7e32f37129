"""Reading a checkpoint without running code (treadle/checkpoint/serialization.py): unsafe pickles refused, checksums verified, what may be saved."""

import collections
import enum
import errno
import io
import logging
import struct
import zipfile
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from treadle.checkpoint import (
    CheckpointError,
    Checkpointer,
    UnsafeCheckpointError,
    check_weights_only_loadable,
    init_weights_from,
    load_checkpoint_file,
)
from treadle.utils.file_io import PathManager
from tests.zip_records import flip_bit, record_span, tensor_record
from tests.checkpoint.helpers import Net, StateOf, assert_same_weights, messages, trained


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
