"""Small datasets that ship with treadle or need no download, for examples and tests.

- :class:`DigitsDataset`: the UCI hand-written digits (8×8, 10 classes),
  shipped as package data.
- :class:`CharCorpusDataset`: next-character windows of the Python standard
  library's sources (or of given text files), with a fixed vocabulary.

See ``docs/examples_data.md``.
"""

from .digits import DigitsDataset, load_digits_arrays
from .text import (
    UNK_CHAR,
    UNK_ID,
    VOCAB,
    VOCAB_SIZE,
    CharCorpusDataset,
    decode_ids,
    encode_text,
    stdlib_source_files,
)

__all__ = [
    "DigitsDataset",
    "load_digits_arrays",
    "CharCorpusDataset",
    "VOCAB",
    "VOCAB_SIZE",
    "UNK_ID",
    "UNK_CHAR",
    "encode_text",
    "decode_ids",
    "stdlib_source_files",
]
