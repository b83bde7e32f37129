"""DataStream: a step's batches without end, each pass shuffled anew, put back exactly."""

import itertools
import logging

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from treadle.data import DataStream, build_train_loader


def dataset(n=20):
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


def shuffled_loader(seed=0):
    return DataLoader(dataset(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))


def take(stream, n):
    return [next(stream)[1].tolist() for _ in range(n)]


def test_passes_follow_each_other_each_shuffled_anew_as_a_hand_written_epoch_loop():
    stream = DataStream(shuffled_loader())
    got = take(stream, 13)  # 5 batches a pass: two passes and three batches of the third
    loader = shuffled_loader()
    hand = [targets.tolist() for _ in range(3) for _, targets in loader][:13]
    assert got == hand
    assert stream.passes == 2
    # itertools.cycle replays the first pass's order: the stream does not.
    cycled = [t.tolist() for _, t in itertools.islice(itertools.cycle(shuffled_loader()), 10)]
    assert cycled[5:] == cycled[:5] and got[5:10] != got[:5]


def test_a_distributed_sampler_is_given_each_passs_epoch():
    sampler = DistributedSampler(dataset(), num_replicas=2, rank=1, shuffle=True, seed=3)
    stream = DataStream(DataLoader(dataset(), batch_size=2, sampler=sampler))
    got = take(stream, 15)  # 5 batches a pass
    hand_sampler = DistributedSampler(dataset(), num_replicas=2, rank=1, shuffle=True, seed=3)
    hand_loader = DataLoader(dataset(), batch_size=2, sampler=hand_sampler)
    hand = []
    for epoch in range(3):
        hand_sampler.set_epoch(epoch)
        hand += [targets.tolist() for _, targets in hand_loader]
    assert got == hand
    assert got[:5] != got[5:10]


@pytest.mark.parametrize("make", [shuffled_loader, lambda: DataLoader(
    dataset(), batch_size=2, sampler=DistributedSampler(dataset(), num_replicas=2, rank=0, seed=1))],
    ids=["RandomSampler", "DistributedSampler"])
@pytest.mark.parametrize("taken", [3, 5, 7, 10])
def test_a_stream_loaded_from_a_state_continues_with_the_same_batches(make, taken):
    torch.manual_seed(0)
    stream = DataStream(make())
    take(stream, taken)
    state = stream.state_dict()
    expected = take(stream, 8)
    torch.manual_seed(1)  # the global generator moved on: the order comes from the saved states
    resumed = DataStream(make())
    resumed.load_state_dict(state)
    assert take(resumed, 8) == expected


def test_a_loader_with_its_own_state_keeps_its_position():
    loader = build_train_loader(dataset(), total_batch_size=4, seed=0)
    stream = DataStream(loader)
    take(stream, 3)
    state = stream.state_dict()
    assert set(state) == {"data"}
    expected = take(stream, 4)
    resumed = DataStream(build_train_loader(dataset(), total_batch_size=4, seed=0))
    resumed.load_state_dict(state)
    assert take(resumed, 4) == expected


def test_a_list_of_batches_is_put_back_at_its_batch(caplog):
    batches = [(torch.zeros(1, 1), torch.tensor([i])) for i in range(3)]
    stream = DataStream(batches)
    assert take(stream, 4) == [[0], [1], [2], [0]]
    assert stream.state_dict() == {"data_pass": {"epoch": 1, "batch": 1}}
    resumed = DataStream(batches)
    with caplog.at_level(logging.WARNING, logger="treadle.data.stream"):
        resumed.load_state_dict(stream.state_dict())
    assert take(resumed, 4) == take(stream, 4) == [[1], [2], [0], [1]]
    assert caplog.records == [] and resumed.passes == 2


class Batches:
    """A user's own re-iterable of batches: not a DataLoader, no state_dict."""

    def __init__(self, n=3):
        self.batches = [(torch.zeros(1, 1), torch.tensor([i])) for i in range(n)]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def test_a_re_iterable_of_its_own_keeps_its_pass_and_batch_and_a_resume_inside_a_pass_says_so(caplog):
    stream = DataStream(Batches())
    assert stream.state_dict() == {"data_pass": {"epoch": 0, "batch": 0}}
    assert take(stream, 4) == [[0], [1], [2], [0]]
    inside = stream.state_dict()
    assert inside == {"data_pass": {"epoch": 1, "batch": 1}}
    take(stream, 2)
    ended = stream.state_dict()  # a pass read to its end: the next one's start
    assert ended == {"data_pass": {"epoch": 2, "batch": 0}}
    with caplog.at_level(logging.WARNING, logger="treadle.data.stream"):
        at_the_end = DataStream(Batches())
        at_the_end.load_state_dict(ended)
        assert caplog.records == [] and at_the_end.passes == 2
        resumed = DataStream(Batches())
        resumed.load_state_dict(inside, where="iteration 4, ")
    assert [r.getMessage() for r in caplog.records] == [
        "Resuming at iteration 4, batch 1 of epoch 1: Batches is not a DataLoader and has no state_dict(), so it "
        "cannot be put back at that batch and starts again at its first batch; batch the dataset with "
        "treadle.data.build_train_loader (the Trainer's batch_size=), or give Batches state_dict() and "
        "load_state_dict(), for an exact resume"]
    assert take(resumed, 1) == [[0]] and resumed.passes == 1


def test_what_is_not_a_stream_of_batches_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"^DataStream takes an iterable of batches \(a DataLoader, a list...\), "
                                        r"got int$"):
        DataStream(5)
    with pytest.raises(RuntimeError, match=r"^The training data \(list\) yields no batches\.$"):
        next(DataStream([]))
    with pytest.raises(RuntimeError, match=r"^This DataStream has no loader \(None\): give it one"):
        next(DataStream(None))
