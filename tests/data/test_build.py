"""build_test_loader for map-style datasets (iterables: test_iterable.py)."""

import pytest
import torch

from treadle.data import build_test_loader


def test_map_style_test_loader_gives_each_sample_once_over_ranks():
    data = list(range(10))
    shards = [
        [b.tolist() for b in build_test_loader(data, batch_size=2, rank=r, world_size=3)]
        for r in range(3)
    ]
    assert shards == [[[0, 1], [2, 3]], [[4, 5], [6]], [[7, 8], [9]]]


def test_test_loader_defaults_and_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    loader = build_test_loader([torch.tensor([1.0]), torch.tensor([2.0])])
    assert [b.tolist() for b in loader] == [[[1.0]], [[2.0]]]
    assert list(loader) and torch.equal(torch.rand(1), expected)


def test_test_loader_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        build_test_loader([1], batch_size=0)
    with pytest.raises(ValueError, match="timeout only apply to worker processes"):
        build_test_loader([1], timeout=5)
