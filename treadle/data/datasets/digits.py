"""The UCI hand-written digits (8×8 images, 10 classes), shipped with treadle.

A classification set small enough to train on in seconds on a CPU, for
examples, tests and benchmarks that must run offline. The data file is package
data (``files/digits.csv.gz``, see ``files/README.md`` for its source and
licence); nothing is downloaded.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import io
import math
from typing import Literal, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from treadle.utils.file_io import PathManager

__all__ = ["DigitsDataset", "load_digits_arrays"]

# Package data: located through importlib.resources so that it is found
# wherever the package is installed (site-packages, editable checkout, zip).
_DATA_PACKAGE = "treadle.data.datasets"
_DATA_FILE = ("files", "digits.csv.gz")

_NUM_SAMPLES = 1797
_INPUT_DIM = 64
_NUM_CLASSES = 10
_MAX_PIXEL = 16  # pixels count the "on" bits of a 4×4 block: 0..16

Split = Literal["train", "test"]


@functools.lru_cache(maxsize=1)
def _load_cached() -> Tuple[torch.Tensor, torch.Tensor]:
    resource = importlib.resources.files(_DATA_PACKAGE)
    for part in _DATA_FILE:  # one part at a time: Python 3.10's joinpath takes one
        resource = resource.joinpath(part)
    with importlib.resources.as_file(resource) as path:
        if not path.is_file():
            raise FileNotFoundError(
                f"The digits data file is missing from the installed package: {path} "
                "(reinstall treadle; setup.py must list it in package_data)."
            )
        with PathManager.open(str(path), "rb") as f:
            raw = f.read()
    text = gzip.decompress(raw).decode("ascii")
    table = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64, ndmin=2)
    # A damaged file must fail loudly here, not train on garbage later.
    if table.shape != (_NUM_SAMPLES, _INPUT_DIM + 1):
        raise ValueError(
            f"{path}: expected {_NUM_SAMPLES} rows of {_INPUT_DIM + 1} columns, got shape {table.shape}"
        )
    pixels, labels = table[:, :_INPUT_DIM], table[:, _INPUT_DIM]
    if pixels.min() < 0 or pixels.max() > _MAX_PIXEL or labels.min() < 0 or labels.max() >= _NUM_CLASSES:
        raise ValueError(f"{path}: pixel values outside 0..{_MAX_PIXEL} or labels outside 0..9")
    images = torch.from_numpy(pixels.astype(np.uint8))
    targets = torch.from_numpy(labels)
    # Read-only by convention: callers get copies (see load_digits_arrays).
    return images, targets


def load_digits_arrays() -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns all 1797 digits as ``(images uint8 (1797, 64) in 0..16, labels int64 (1797,))``.

    For users who want the raw table (a custom split, a plot of the images).
    The file is parsed once per process; each call returns fresh copies.
    """
    images, targets = _load_cached()
    return images.clone(), targets.clone()


def _stratified_split(
    targets: torch.Tensor, test_fraction: float, seed: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(train indices, test indices)``, both sorted, disjoint, covering every sample.

    Each class of ``n_c`` samples gives ``n_c * test_fraction`` of them
    (rounded, halves up) to the test split, drawn by a permutation seeded by
    ``(seed, class)``: the split depends on nothing but ``seed`` and
    ``test_fraction``, and the class proportions of both splits match the
    whole set's.
    """
    train_parts, test_parts = [], []
    for c in range(_NUM_CLASSES):
        members = torch.nonzero(targets == c).flatten()
        # One generator per class: the draw of class c does not depend on the
        # other classes' sizes, so the split is stable if the code iterates
        # classes differently.
        gen = torch.Generator().manual_seed(seed * _NUM_CLASSES + c)
        perm = members[torch.randperm(len(members), generator=gen)]
        # Halves round up (Python's round() would round them to even).
        n_test = math.floor(len(members) * test_fraction + 0.5)
        test_parts.append(perm[:n_test])
        train_parts.append(perm[n_test:])
    train = torch.sort(torch.cat(train_parts)).values
    test = torch.sort(torch.cat(test_parts)).values
    return train, test


class DigitsDataset(Dataset):
    """One split of the UCI hand-written digits, for classification examples and tests.

    Item ``i`` is ``(image, label)``: ``image`` a float32 tensor of shape
    ``(64,)`` (the 8×8 image in row-major order), divided by 16 to lie in
    ``[0, 1]`` when ``normalize`` (else the raw counts 0..16 as floats), and
    ``label`` an int64 scalar tensor in ``0..9``.

    The split is stratified and seeded: each class of ``n_c`` images puts
    ``n_c * test_fraction`` of them (rounded, halves up), chosen by ``seed``,
    in ``"test"`` and the rest in ``"train"``. The same ``(seed,
    test_fraction)`` gives the same split on every machine, and the two splits
    never share an image. Items are in the order of the data file (shuffling
    is the sampler's job).

    Args:
        split: ``"train"`` or ``"test"``.
        test_fraction: share of each class held out for ``"test"``, in (0, 1).
        seed: chooses which images are held out.
        normalize: scale pixels to ``[0, 1]``.

    Attributes:
        num_classes: 10.
        input_dim: 64.
        indices: int64 tensor, the rows of the full table (1797 images) in this split.
        targets: int64 tensor of this split's labels, for samplers and evaluators.
    """

    num_classes: int = _NUM_CLASSES
    input_dim: int = _INPUT_DIM

    def __init__(
        self,
        split: Split = "train",
        *,
        test_fraction: float = 0.2,
        seed: int = 0,
        normalize: bool = True,
    ) -> None:
        if split not in ("train", "test"):
            raise ValueError(f"DigitsDataset: split must be 'train' or 'test', got {split!r}")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
            raise TypeError(f"DigitsDataset: test_fraction must be a float, got {test_fraction!r}")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"DigitsDataset: test_fraction must be in (0, 1), got {test_fraction!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"DigitsDataset: seed must be a non-negative int, got {seed!r}")

        images, targets = _load_cached()
        train_idx, test_idx = _stratified_split(targets, float(test_fraction), seed)
        indices = train_idx if split == "train" else test_idx
        if len(indices) == 0:
            raise ValueError(
                f"DigitsDataset: test_fraction={test_fraction} leaves the '{split}' split empty"
            )

        self.split: str = split
        self.test_fraction: float = float(test_fraction)
        self.seed: int = seed
        self.normalize: bool = normalize
        self.indices: torch.Tensor = indices
        # Converted once here: __getitem__ is then a row lookup, cheap enough
        # for the loader's main process.
        data = images.index_select(0, indices).to(torch.float32)
        self._images: torch.Tensor = data / _MAX_PIXEL if normalize else data
        self.targets: torch.Tensor = targets.index_select(0, indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        # Copies, so that a transform changing an item in place cannot
        # change the dataset.
        return self._images[index].clone(), self.targets[index].clone()

    def __repr__(self) -> str:
        return (
            f"DigitsDataset(split={self.split!r}, size={len(self)}, test_fraction={self.test_fraction}, "
            f"seed={self.seed}, normalize={self.normalize})"
        )
