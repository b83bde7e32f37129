"""Finding and damaging the records of a ``torch.save`` archive, for the integrity tests.

A torch checkpoint is a zip archive: ``<archive>/data.pkl`` (the pickle) and
one ``<archive>/data/<key>`` record per tensor storage, stored uncompressed.
These helpers locate a record's bytes through the zip headers, so a test can
damage the payload itself rather than the headers around it.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Tuple, Union

import torch

__all__ = ["record_span", "tensor_record", "flip_bit"]

PathLike = Union[str, Path]


def record_span(path: PathLike, name_suffix: str) -> Tuple[int, int]:
    """``(offset, size)`` of the bytes of the one record whose name ends with ``name_suffix``."""
    with zipfile.ZipFile(path) as archive:
        (info,) = [i for i in archive.infolist() if i.filename.endswith(name_suffix)]
    assert info.compress_type == zipfile.ZIP_STORED
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    assert header[:4] == b"PK\x03\x04"
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def tensor_record(path: PathLike, tensor: torch.Tensor) -> str:
    """The name of the record that holds ``tensor``'s storage, found by its bytes."""
    wanted = tensor.detach().contiguous().numpy().tobytes()
    with zipfile.ZipFile(path) as archive:
        names = [i.filename for i in archive.infolist() if "/data/" in i.filename and archive.read(i) == wanted]
    assert len(names) == 1, names
    return names[0]


def flip_bit(path: PathLike, offset: int, bit: int = 0) -> None:
    """Inverts one bit of the file in place, as a failing disk or a bad copy would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
