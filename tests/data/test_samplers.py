"""TrainingSampler and InferenceSampler: determinism, O(1) start, sharding, exact cover."""

from itertools import islice

import numpy as np
import pytest

from treadle.data import InferenceSampler, TrainingSampler


def take(sampler, n, skip=0):
    return list(islice(iter(sampler), skip, skip + n))


def global_stream_at(sampler, positions):
    # The stream's definition: position p is epoch p // size, offset p % size.
    return [int(sampler.epoch_indices(p // sampler.size)[p % sampler.size]) for p in positions]


def test_same_seed_same_stream_and_each_epoch_is_a_permutation():
    a = take(TrainingSampler(7, seed=3, rank=0, world_size=1), 70)
    b = take(TrainingSampler(7, seed=3, rank=0, world_size=1), 70)
    c = take(TrainingSampler(7, seed=4, rank=0, world_size=1), 70)
    assert a == b
    assert a != c
    epochs = [a[i : i + 7] for i in range(0, 70, 7)]
    assert all(sorted(e) == list(range(7)) for e in epochs)
    # Epochs are drawn independently, not one permutation repeated.
    assert len({tuple(e) for e in epochs}) > 1


def test_epoch_permutation_depends_only_on_seed_and_epoch():
    sampler = TrainingSampler(50, seed=11, rank=0, world_size=1)
    stream = take(sampler, 150)
    assert stream[100:150] == sampler.epoch_indices(2).tolist()
    started_elsewhere = TrainingSampler(50, seed=11, rank=0, world_size=1, start=100)
    assert started_elsewhere.epoch_indices(2).tolist() == stream[100:150]


def test_no_shuffle_repeats_range():
    assert take(TrainingSampler(4, shuffle=False, rank=0, world_size=1), 10) == [
        0, 1, 2, 3, 0, 1, 2, 3, 0, 1
    ]


@pytest.mark.parametrize("k", [0, 1, 6, 7, 8, 20, 69])
@pytest.mark.parametrize("shuffle", [True, False])
def test_start_equals_skipping_k(k, shuffle):
    for rank in range(2):
        started = TrainingSampler(7, shuffle, seed=5, rank=rank, world_size=2, start=k)
        fresh = TrainingSampler(7, shuffle, seed=5, rank=0, world_size=1)
        # Rank r starting at global position k takes k + r, k + r + 2, ...
        expected = take(fresh, 60, skip=k)[rank::2][:30]
        assert take(started, 30) == expected


def test_start_at_a_huge_position_is_direct():
    size, start = 1000, 10**12 + 999 - 3  # crosses into the next epoch after 3 positions
    sampler = TrainingSampler(size, seed=2, rank=1, world_size=2, start=start)
    got = take(sampler, 6)
    positions = [start + 1 + 2 * i for i in range(6)]
    assert got == global_stream_at(sampler, positions)
    # The same formula is what plain iteration gives (at a small scale).
    small = TrainingSampler(size, seed=2, rank=0, world_size=1)
    assert take(small, 30, skip=1990) == global_stream_at(small, range(1990, 2020))


def test_set_start_applies_to_next_iteration():
    sampler = TrainingSampler(9, seed=0, rank=0, world_size=1)
    first = take(sampler, 30)
    sampler.set_start(13)
    assert take(sampler, 10) == first[13:23]
    with pytest.raises(ValueError, match="start must be >= 0, got -1"):
        sampler.set_start(-1)


@pytest.mark.parametrize("size", [6, 7])
def test_two_ranks_cover_each_epoch_exactly_once(size):
    ranks = [TrainingSampler(size, seed=8, rank=r, world_size=2) for r in range(2)]
    single = take(TrainingSampler(size, seed=8, rank=0, world_size=1), 4 * size)
    streams = [take(s, 2 * size) for s in ranks]
    # Interleaving the ranks gives the single-process stream back.
    interleaved = [streams[p % 2][p // 2] for p in range(4 * size)]
    assert interleaved == single
    for epoch in range(4):
        positions = range(epoch * size, (epoch + 1) * size)
        seen = [streams[p % 2][p // 2] for p in positions]
        assert sorted(seen) == list(range(size))
        assert seen == ranks[0].epoch_indices(epoch).tolist()


def test_training_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="TrainingSampler size must be >= 1, got 0"):
        TrainingSampler(0, rank=0, world_size=1)
    with pytest.raises(TypeError, match="TrainingSampler size must be an int, got bool"):
        TrainingSampler(True, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got rank=2"):
        TrainingSampler(5, rank=2, world_size=2)
    with pytest.raises(ValueError, match="seed must be >= 0, got -3"):
        TrainingSampler(5, seed=-3, rank=0, world_size=1)


def test_defaults_come_from_comm():
    sampler = TrainingSampler(5)
    assert (sampler.rank, sampler.world_size) == (0, 1)


@pytest.mark.parametrize("size", [0, 1, 5, 10, 11])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_inference_sampler_exact_cover(size, world):
    shards = [list(InferenceSampler(size, rank=r, world_size=world)) for r in range(world)]
    assert [i for shard in shards for i in shard] == list(range(size))
    lengths = [len(InferenceSampler(size, rank=r, world_size=world)) for r in range(world)]
    assert lengths == [len(s) for s in shards]
    assert max(lengths) - min(lengths) <= 1


def test_inference_sampler_shard_sizes():
    sizes = [len(InferenceSampler(10, rank=r, world_size=4)) for r in range(4)]
    assert sizes == [3, 3, 2, 2]
    assert list(InferenceSampler(10, rank=2, world_size=4)) == [6, 7]


def test_epoch_indices_are_numpy_permutations():
    perm = TrainingSampler(5, seed=1, rank=0, world_size=1).epoch_indices(0)
    assert isinstance(perm, np.ndarray) and sorted(perm.tolist()) == [0, 1, 2, 3, 4]
