"""TrainLoader: batches, data position, exact resume, per-sample seeding, errors."""

import logging
import random
from itertools import islice

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from treadle.data import TrainingSampler, TrainLoader, build_train_loader


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class RandomPlusIndex(Dataset):
    """A sample is its index plus draws from torch, python and numpy: random augmentation."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        noise = torch.tensor([random.random(), float(np.random.rand())], dtype=torch.float32)
        return torch.cat([torch.rand(1), noise]) + i


def messages(records, level):
    return [r.getMessage() for r in records if r.levelno == level]


def take(loader, n):
    return list(islice(iter(loader), n))


def as_lists(batches):
    return [b.tolist() for b in batches]


def test_batches_are_the_sampler_stream_cut_in_order():
    loader = build_train_loader(Indices(10), total_batch_size=4, seed=7, rank=0, world_size=1)
    stream = list(islice(TrainingSampler(10, seed=7, rank=0, world_size=1), 20))
    assert as_lists(take(loader, 5)) == [stream[i : i + 4] for i in range(0, 20, 4)]
    assert loader.state_dict() == {
        "position": 20,
        "seed": 7,
        "total_batch_size": 4,
        "shuffle": 1,
        "dataset_size": 10,
    }
    assert all(type(v) is int for v in loader.state_dict().values())


def test_attributes():
    loader = build_train_loader(Indices(10), total_batch_size=4, rank=1, world_size=2)
    assert isinstance(loader, TrainLoader)
    assert (loader.batch_size, loader.total_batch_size, loader.epoch_length) == (2, 4, 2)
    assert loader.dataset.n == 10 and loader.position == 0


def test_global_step_batch_is_the_same_for_any_world_size():
    dataset = RandomPlusIndex(9)
    single = take(build_train_loader(dataset, total_batch_size=6, rank=0, world_size=1, per_sample_seed=True), 4)
    ranks = [
        take(build_train_loader(dataset, total_batch_size=6, rank=r, world_size=2, per_sample_seed=True), 4)
        for r in range(2)
    ]
    for step in range(4):
        merged = torch.empty_like(single[step])
        merged[0::2], merged[1::2] = ranks[0][step], ranks[1][step]
        # Same samples, and the same augmentation of each, split over the ranks.
        assert torch.equal(merged, single[step])


def test_per_sample_seed_same_batches_for_any_num_workers():
    dataset = RandomPlusIndex(11)
    in_process = take(build_train_loader(dataset, total_batch_size=3, seed=4, world_size=1, per_sample_seed=True), 6)
    workers = take(
        build_train_loader(dataset, total_batch_size=3, seed=4, num_workers=2, world_size=1), 6
    )
    assert all(torch.equal(a, b) for a, b in zip(in_process, workers))
    # Augmentation really is random: the fractional parts differ between samples.
    fractions = torch.cat(in_process)[:, 0].frac()
    assert len(set(fractions.tolist())) == fractions.numel()


def test_resume_with_workers_continues_the_uninterrupted_stream():
    dataset = RandomPlusIndex(7)
    kwargs = dict(total_batch_size=4, seed=3, shuffle=True, num_workers=2, world_size=1)
    uninterrupted = take(build_train_loader(dataset, **kwargs), 6)

    first = build_train_loader(dataset, **kwargs)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    # Workers have prefetched ahead; the position counts what was taken.
    state = first.state_dict()
    assert state["position"] == 3 * 4
    del it

    resumed = build_train_loader(dataset, **kwargs)
    resumed.load_state_dict(state)
    tail = take(resumed, 3)
    assert all(torch.equal(a, b) for a, b in zip(head + tail, uninterrupted))
    assert resumed.state_dict()["position"] == 6 * 4


def test_main_process_random_state_is_untouched():
    dataset = RandomPlusIndex(5)

    def draws():
        return (torch.rand(1).item(), random.random(), float(np.random.rand()))

    def reseed():
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)

    reseed()
    expected = draws()
    reseed()
    take(build_train_loader(dataset, total_batch_size=2, world_size=1, per_sample_seed=True), 3)
    assert draws() == expected


class RecordsGetitems(Indices):
    def __init__(self, n):
        super().__init__(n)
        self.calls = []

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return list(indices)


def test_per_sample_seed_off_uses_the_datasets_own_batched_fetch():
    dataset = RecordsGetitems(6)
    loader = build_train_loader(
        dataset, total_batch_size=3, shuffle=False, per_sample_seed=False, world_size=1
    )
    assert as_lists(take(loader, 2)) == [[0, 1, 2], [3, 4, 5]]
    assert dataset.calls == [[0, 1, 2], [3, 4, 5]]


def test_reiterating_continues_where_the_consumer_stopped():
    loader = build_train_loader(Indices(5), total_batch_size=2, world_size=1)
    whole = as_lists(take(build_train_loader(Indices(5), total_batch_size=2, world_size=1), 4))
    assert as_lists(take(loader, 1) + take(loader, 3)) == whole


def test_iterator_created_before_load_starts_at_loaded_position():
    reference = as_lists(take(build_train_loader(Indices(5), total_batch_size=2, world_size=1), 5))
    loader = build_train_loader(Indices(5), total_batch_size=2, world_size=1)
    it = iter(loader)
    loader.load_state_dict({"position": 6})
    assert next(it).tolist() == reference[3]


def test_resume_at_a_huge_position_is_direct():
    loader = build_train_loader(Indices(1000), total_batch_size=4, seed=2, rank=1, world_size=2)
    loader.load_state_dict({"position": 10**12 + 998})
    sampler = TrainingSampler(1000, seed=2, rank=0, world_size=1)
    # Rank 1 takes global positions 10**12 + 999 and 10**12 + 1001 (the next epoch).
    expected = [sampler.epoch_indices(10**9)[999], sampler.epoch_indices(10**9 + 1)[1]]
    assert next(iter(loader)).tolist() == [int(i) for i in expected]
    assert loader.position == 10**12 + 1002


def test_load_makes_a_running_iteration_stale():
    loader = build_train_loader(Indices(5), total_batch_size=2, world_size=1)
    it = iter(loader)
    next(it)
    loader.load_state_dict({"position": 0})
    with pytest.raises(RuntimeError, match="stale: a newer iter\\(\\) or load_state_dict"):
        next(it)


def test_load_with_different_batch_size_warns_and_keeps_sample_position(data_log):
    loader = build_train_loader(Indices(10), total_batch_size=4, world_size=1)
    loader.load_state_dict({"position": 6, "seed": 0, "total_batch_size": 2})
    warnings = messages(data_log, logging.WARNING)
    assert len(warnings) == 1
    assert "saved with total_batch_size=2, but this loader has total_batch_size=4" in warnings[0]
    stream = list(islice(TrainingSampler(10, seed=0, rank=0, world_size=1), 14))
    assert next(iter(loader)).tolist() == stream[6:10]


def test_load_with_different_seed_adopts_the_saved_one(data_log):
    reference = build_train_loader(Indices(10), total_batch_size=2, seed=9, world_size=1)
    expected = as_lists(take(reference, 3))[2]
    loader = build_train_loader(Indices(10), total_batch_size=2, seed=1, world_size=1)
    loader.load_state_dict({"position": 4, "seed": 9})
    assert loader.seed == 9 and next(iter(loader)).tolist() == expected
    assert messages(data_log, logging.WARNING) == [
        "Data loader state was saved with seed=9, but this loader has seed=1; "
        "continuing the saved stream with seed=9"
    ]


def test_load_rejects_malformed_state():
    loader = build_train_loader(Indices(4), total_batch_size=2, world_size=1)
    with pytest.raises(ValueError, match=r"unknown keys \['epoch'\] in TrainLoader state"):
        loader.load_state_dict({"position": 0, "epoch": 1})
    with pytest.raises(ValueError, match="TrainLoader state has no 'position'"):
        loader.load_state_dict({"seed": 0})
    with pytest.raises(ValueError, match="TrainLoader state 'position' must be >= 0, got -2"):
        loader.load_state_dict({"position": -2})


def test_total_batch_size_must_divide_by_world_size():
    with pytest.raises(
        ValueError, match="total_batch_size=10 is not divisible by the world size 4"
    ):
        build_train_loader(Indices(20), total_batch_size=10, rank=0, world_size=4)


def test_rejected_options():
    with pytest.raises(ValueError, match="drop_last=False is not supported"):
        build_train_loader(Indices(4), total_batch_size=2, drop_last=False, world_size=1)
    with pytest.raises(ValueError, match=r"the train dataset \(Indices\) is empty"):
        build_train_loader(Indices(0), total_batch_size=2, world_size=1)
    with pytest.raises(ValueError, match="prefetch_factor only apply to worker processes"):
        build_train_loader(Indices(4), total_batch_size=2, prefetch_factor=4, world_size=1)
    with pytest.raises(TypeError, match="neither map-style .* nor iterable"):
        build_train_loader(42, total_batch_size=2, world_size=1)
    with pytest.raises(ValueError, match="num_workers must be >= 0, got -1"):
        build_train_loader(Indices(4), total_batch_size=2, num_workers=-1, world_size=1)


def test_custom_collate_and_epoch_crossing():
    loader = build_train_loader(
        ["a", "b", "c"], total_batch_size=2, shuffle=False, collate_fn=list, world_size=1
    )
    assert take(loader, 3) == [["a", "b"], ["c", "a"], ["b", "c"]]
    assert loader.epoch_length == 1


def test_workers_are_seeded_deterministically_without_per_sample_seed():
    dataset = RandomPlusIndex(8)
    kwargs = dict(total_batch_size=2, num_workers=2, per_sample_seed=False, world_size=1)
    a = take(build_train_loader(dataset, **kwargs), 4)
    b = take(build_train_loader(dataset, **kwargs), 4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_per_sample_seed_defaults_to_on_with_workers_only():
    assert build_train_loader(Indices(10), total_batch_size=2, world_size=1).per_sample_seed is False
    assert build_train_loader(Indices(10), total_batch_size=2, world_size=1, num_workers=1).per_sample_seed is True
    assert build_train_loader(Indices(10), total_batch_size=2, world_size=1, per_sample_seed=True).per_sample_seed is True
