"""Iterable datasets in the train and test loaders: cycling, sharding, O(n) resume."""

import logging
import random
from itertools import islice

import pytest
import torch
from torch.utils.data import IterableDataset

from treadle.data import build_test_loader, build_train_loader


class Count(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class ShuffleBuffer(IterableDataset):
    """Draws from the global generators at start and for every item; its state carries over."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        buffer = []
        for i in range(self.n):
            buffer.append(i + torch.rand(1).item())
            if len(buffer) == 3:
                yield buffer.pop(random.randrange(3))
        random.shuffle(buffer)
        yield from buffer


def take(loader, n):
    return [b.tolist() for b in islice(iter(loader), n)]


def test_iterable_is_cycled_and_cut_in_order():
    loader = build_train_loader(Count(5), total_batch_size=3, world_size=1)
    assert take(loader, 4) == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    assert loader.epoch_length is None
    assert loader.state_dict() == {"position": 12, "seed": 0, "total_batch_size": 3, "shuffle": 0}


def test_iterable_ranks_interleave_the_global_stream():
    r0 = take(build_train_loader(Count(5), total_batch_size=4, rank=0, world_size=2), 2)
    r1 = take(build_train_loader(Count(5), total_batch_size=4, rank=1, world_size=2), 2)
    assert r0 == [[0, 2], [4, 1]]
    assert r1 == [[1, 3], [0, 2]]


def test_iterable_resume_skips_consumed_items_and_says_it_is_linear(data_log):
    loader = build_train_loader(Count(5), total_batch_size=3, world_size=1)
    loader.load_state_dict({"position": 6})
    assert take(loader, 2) == [[1, 2, 3], [4, 0, 1]]
    infos = [r.getMessage() for r in data_log if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert "every data worker reads and discards the 6 samples before it (O(n)" in infos[0]


def test_stateful_random_iterable_same_for_any_workers_and_resume():
    kwargs = dict(total_batch_size=2, seed=1, world_size=1, per_sample_seed=True)
    in_process = take(build_train_loader(ShuffleBuffer(7), **kwargs), 6)
    workers = take(build_train_loader(ShuffleBuffer(7), num_workers=2, **kwargs), 6)
    assert workers == in_process
    resumed = build_train_loader(ShuffleBuffer(7), **kwargs)
    resumed.load_state_dict({"position": 6})
    assert take(resumed, 3) == in_process[3:6]
    # Each cycle of the buffer is seeded differently: epochs differ.
    flat = [x for b in in_process for x in b]
    assert flat[:7] != flat[7:]


def test_shuffle_is_rejected_for_iterables():
    with pytest.raises(ValueError, match=r"shuffle=True needs random access, but .* \(Count\)"):
        build_train_loader(Count(5), total_batch_size=2, shuffle=True, world_size=1)


def test_one_shot_generator_runs_once():
    def numbers():
        i = 0
        while True:
            yield i
            i += 1

    loader = build_train_loader(numbers(), total_batch_size=2, world_size=1)
    assert take(loader, 2) == [[0, 1], [2, 3]]
    with pytest.raises(RuntimeError, match="one-shot iterator and this loader was already"):
        next(iter(loader))


def test_finite_one_shot_iterator_cannot_be_cycled():
    loader = build_train_loader(iter(range(3)), total_batch_size=2, world_size=1)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(ValueError, match="yielded no items when iterated again"):
        next(it)


def test_empty_iterable_is_an_error():
    loader = build_train_loader(Count(0), total_batch_size=2, world_size=1)
    with pytest.raises(ValueError, match=r"dataset Count yielded no items when iterated:"):
        next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_test_loader_exact_cover(num_workers):
    loaders = [
        build_test_loader(Count(7), batch_size=2, num_workers=num_workers, rank=r, world_size=2)
        for r in range(2)
    ]
    shards = [take(loader, 99) for loader in loaders]
    assert shards == [[[0, 2], [4, 6]], [[1, 3], [5]]]
