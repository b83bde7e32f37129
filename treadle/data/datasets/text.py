"""A character-level language-modelling corpus that needs no download.

The default text is the Python standard library's own ``.py`` sources, which
every Python installation has: a corpus of a few megabytes of real, structured
text for language-model examples, tests and benchmarks that must run offline.

The vocabulary is fixed (it does not depend on the text), so a checkpoint
trained on one machine's corpus decodes the same way on another's:

======  =========================================================
id      character
======  =========================================================
0       ``"\\t"``
1       ``"\\n"``
2..96   printable ASCII, ``" "`` (32) to ``"~"`` (126), in code order
97      unknown: every other character (``"\\r"``, non-ASCII, ...);
        decoded as ``"\\ufffd"`` (the Unicode replacement character)
======  =========================================================

``vocab_size`` is 98.
"""

from __future__ import annotations

import math
import os
import sysconfig
from typing import List, Literal, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from treadle.utils.file_io import PathManager

__all__ = [
    "CharCorpusDataset",
    "VOCAB",
    "VOCAB_SIZE",
    "UNK_ID",
    "UNK_CHAR",
    "encode_text",
    "decode_ids",
    "stdlib_source_files",
]

VOCAB: str = "\t\n" + "".join(chr(c) for c in range(32, 127))
"""The characters of ids ``0 .. len(VOCAB) - 1``; id ``len(VOCAB)`` is the unknown token."""

#: The id of a character outside :data:`VOCAB` (the last id).
UNK_ID: int = len(VOCAB)
#: The character :func:`decode_ids` writes for :data:`UNK_ID`.
UNK_CHAR: str = "\ufffd"
#: How many ids there are: a text model's embedding and output size.
VOCAB_SIZE: int = len(VOCAB) + 1

# Code point -> id for ASCII; everything else maps to UNK_ID.
_ASCII_TO_ID = np.full(128, UNK_ID, dtype=np.int64)
for _i, _ch in enumerate(VOCAB):
    _ASCII_TO_ID[ord(_ch)] = _i
del _i, _ch
_ID_TO_CHAR: Tuple[str, ...] = tuple(VOCAB) + (UNK_CHAR,)

PathLike = Union[str, "os.PathLike[str]"]
Split = Literal["train", "val"]

# Directories of the standard library tree that are not the standard library,
# or not on every installation of the same Python version: installed
# packages, the test suite (Debian ships it separately), build configuration.
_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
_EXCLUDED_DIR_PREFIXES = ("config-",)
# The build's sysconfig data: machine-specific paths and compiler flags.
_EXCLUDED_FILE_PREFIXES = ("_sysconfigdata",)


def encode_text(text: str) -> torch.Tensor:
    """Encodes ``text`` as an int64 tensor of ids of the fixed vocabulary (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"encode_text expects a str, got {type(text).__name__}")
    # One vectorized lookup: the corpus is millions of characters.
    # surrogatepass: a str with lone surrogates still encodes (to UNK).
    codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    ids = np.where(codes < 128, _ASCII_TO_ID[np.minimum(codes, 127)], UNK_ID)
    return torch.from_numpy(ids.astype(np.int64, copy=False))


def decode_ids(ids: Union[torch.Tensor, Sequence[int]]) -> str:
    """Decodes a 1-D tensor or sequence of ids to text; the unknown id becomes ``"\\ufffd"``."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"decode_ids expects a 1-D tensor of ids, got shape {tuple(ids.shape)}")
        values = ids.tolist()
    else:
        values = [int(i) for i in ids]
    # Checked, not caught from the lookup: a negative id would silently
    # index the table from its end.
    bad = next((i for i in values if not 0 <= i < VOCAB_SIZE), None)
    if bad is not None:
        raise ValueError(f"decode_ids: id {bad} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
    return "".join(_ID_TO_CHAR[i] for i in values)


def stdlib_source_files() -> List[str]:
    """The standard library's ``.py`` files, sorted by path relative to its root.

    The root is ``sysconfig.get_paths()["stdlib"]``. Installed packages
    (``site-packages``), the test suite (``test``, ``tests``, ``idle_test``),
    the build configuration (``config-*``) and ``_sysconfigdata*.py`` are left
    out so that two installations of one Python version give the same list.
    """
    root = sysconfig.get_paths()["stdlib"]
    found: List[Tuple[str, str]] = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith(_EXCLUDED_DIR_PREFIXES)
        ]
        for name in filenames:
            if name.endswith(".py") and not name.startswith(_EXCLUDED_FILE_PREFIXES):
                path = os.path.join(directory, name)
                # Sort on the relative POSIX path: the order is the same
                # wherever Python is installed and whatever os.walk's order.
                found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    found.sort()
    return [path for _, path in found]


def _read_corpus(files: Sequence[str], max_chars: Optional[int]) -> Tuple[str, int]:
    """``(text, number of files read)``.

    The text is ``files`` concatenated (UTF-8, undecodable bytes dropped),
    each made to end in a newline, cut to ``max_chars``.
    """
    parts: List[str] = []
    total = 0
    for path in files:
        if max_chars is not None and total >= max_chars:
            break  # the cap is reached: later files are not even opened
        with PathManager.open(path, "r", encoding="utf-8", errors="ignore") as f:
            text = f.read()
        if text and not text.endswith("\n"):
            text += "\n"  # a file's last line must not run into the next file's first
        parts.append(text)
        total += len(text)
    corpus = "".join(parts)
    return (corpus if max_chars is None else corpus[:max_chars]), len(parts)


def _resolve_files(source: str, files: Optional[Union[PathLike, Sequence[PathLike]]]) -> List[str]:
    if files is None:
        if source == "files":
            raise ValueError("CharCorpusDataset: source='files' needs the files argument")
        if source != "stdlib":
            raise ValueError(f"CharCorpusDataset: source must be 'stdlib' or 'files', got {source!r}")
        paths = stdlib_source_files()
        if not paths:
            raise FileNotFoundError(
                f"CharCorpusDataset: no .py files found under the standard library directory "
                f"{sysconfig.get_paths()['stdlib']!r}; pass files=[...] instead"
            )
        return paths
    # files= says where the text is; source keeps its default or says "files".
    if source not in ("stdlib", "files"):
        raise ValueError(f"CharCorpusDataset: source must be 'stdlib' or 'files', got {source!r}")
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [os.fspath(p) for p in files]
    if not paths:
        raise ValueError("CharCorpusDataset: files is empty; give at least one text file")
    for path in paths:
        if not PathManager.isfile(path):
            raise FileNotFoundError(f"CharCorpusDataset: no such file: {path!r}")
    return paths


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"CharCorpusDataset: {name} must be a positive int, got {value!r}")
    return value


class CharCorpusDataset(Dataset):
    """Windows of a character corpus for next-character prediction.

    Item ``i`` is ``(inputs, targets)``, two int64 tensors of shape
    ``(seq_len,)``: ``inputs`` the ids of characters ``[s, s + seq_len)`` of the
    split's text with ``s = i * stride``, and ``targets`` those of
    ``[s + 1, s + seq_len + 1)``, i.e. ``targets[t]`` is the character that
    follows ``inputs[t]``. ``len`` is the number of windows that fit,
    ``(n - seq_len - 1) // stride + 1`` for a split of ``n`` characters.

    The text is the concatenation, in order, of the files (each read as
    UTF-8 with undecodable bytes dropped and made to end in a newline), cut to
    ``max_chars`` characters. Its last ``val_fraction`` is the ``"val"`` split
    and the rest ``"train"``: the windows of the two splits, targets included,
    never share a character.

    Args:
        split: ``"train"`` or ``"val"``.
        seq_len: characters per window.
        source: ``"stdlib"``: the standard library's ``.py`` files (see
            :func:`stdlib_source_files`), the same text for every installation
            of one Python version; ``"files"``: the ``files`` argument.
            Passing ``files`` selects them, whatever ``source``'s default.
        max_chars: cap on the text's length, before the split; ``None`` for all of it.
        val_fraction: share of the text, at its end, that is the ``"val"`` split, in (0, 1).
        files: paths of text files (read through ``PathManager``).
        stride: characters between the starts of consecutive ``"train"``
            windows; default ``seq_len`` (no overlap). ``"val"`` windows never
            overlap, so that an evaluation scores each character once.

    Attributes:
        vocab_size: 98, the size of the fixed vocabulary.
        data: uint8 tensor, the ids of this split's text.
        files: the files the text was read from (the cap may leave later ones out).
        num_chars: characters of the whole text (both splits).
    """

    vocab_size: int = VOCAB_SIZE

    def __init__(
        self,
        split: Split = "train",
        *,
        seq_len: int = 128,
        source: str = "stdlib",
        max_chars: Optional[int] = 2_000_000,
        val_fraction: float = 0.1,
        files: Optional[Union[PathLike, Sequence[PathLike]]] = None,
        stride: Optional[int] = None,
    ) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"CharCorpusDataset: split must be 'train' or 'val', got {split!r}")
        seq_len = _check_positive_int("seq_len", seq_len)
        if max_chars is not None:
            max_chars = _check_positive_int("max_chars", max_chars)
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
            raise TypeError(f"CharCorpusDataset: val_fraction must be a float, got {val_fraction!r}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"CharCorpusDataset: val_fraction must be in (0, 1), got {val_fraction!r}")
        if stride is None:
            stride = seq_len
        stride = _check_positive_int("stride", stride)
        if split == "val" and stride != seq_len:
            raise ValueError(
                f"CharCorpusDataset: stride={stride} applies to the 'train' split only; "
                "'val' windows are always non-overlapping (stride = seq_len)"
            )

        paths = _resolve_files(source, files)
        text, files_read = _read_corpus(paths, max_chars)
        ids = encode_text(text)
        n_val = int(math.floor(len(ids) * val_fraction))
        boundary = len(ids) - n_val
        # uint8: the 98 ids fit, and the dataset (pickled to each worker under
        # the spawn start method) is 8x smaller than in int64.
        data = (ids[:boundary] if split == "train" else ids[boundary:]).to(torch.uint8)
        if len(data) < seq_len + 1:
            raise ValueError(
                f"CharCorpusDataset: the '{split}' split has {len(data)} characters, fewer than "
                f"seq_len + 1 = {seq_len + 1}; use more text (max_chars, files), a larger "
                f"{'val_fraction' if split == 'val' else '1 - val_fraction'} or a smaller seq_len"
            )

        self.split: str = split
        self.seq_len: int = seq_len
        self.stride: int = stride
        self.val_fraction: float = float(val_fraction)
        self.max_chars: Optional[int] = max_chars
        self.num_chars: int = len(ids)
        # The files whose text is in the corpus: the cap may stop early.
        self.files: List[str] = paths[:files_read]
        self.data: torch.Tensor = data
        # The position of this split's first character in the whole text.
        self.offset: int = 0 if split == "train" else boundary

    def __len__(self) -> int:
        return (len(self.data) - self.seq_len - 1) // self.stride + 1

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"CharCorpusDataset index {index} out of range for {n} windows")
        start = (index % n) * self.stride
        window = self.data[start : start + self.seq_len + 1]
        # .long() copies each: inputs and targets share no storage with each
        # other nor with the corpus, so in-place transforms are safe.
        return window[:-1].long(), window[1:].long()

    @staticmethod
    def encode(text: str) -> torch.Tensor:
        """Encodes text as int64 ids of the fixed vocabulary; see :func:`encode_text`."""
        return encode_text(text)

    @staticmethod
    def decode(ids: Union[torch.Tensor, Sequence[int]]) -> str:
        """Decodes 1-D ids to text; see :func:`decode_ids`."""
        return decode_ids(ids)

    def __repr__(self) -> str:
        return (
            f"CharCorpusDataset(split={self.split!r}, windows={len(self)}, seq_len={self.seq_len}, "
            f"stride={self.stride}, chars={len(self.data)} of {self.num_chars}, files={len(self.files)})"
        )

