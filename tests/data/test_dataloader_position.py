"""Putting a torch ``DataLoader`` back inside a pass (:mod:`treadle.data.dataloader_position`)."""

import pytest
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from treadle.data.dataloader_position import generator_states, order_generators, restore_pass


def dataset():
    return TensorDataset(torch.arange(10))


def test_a_shuffled_pass_is_put_back_at_its_third_batch_and_the_next_pass_is_the_uninterrupted_one():
    loader = DataLoader(dataset(), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
    list(loader)
    start = generator_states(order_generators(loader))  # where the second pass starts
    second = [b[0].tolist() for b in loader]
    third = [b[0].tolist() for b in loader]

    # A new process: the user's generator seeded again, the global one elsewhere.
    again = DataLoader(dataset(), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(123)
    global_state = torch.get_rng_state()
    rest = restore_pass(again, start, 2)
    assert [b[0].tolist() for b in rest] == second[2:]
    assert [b[0].tolist() for b in again] == third
    assert torch.equal(torch.get_rng_state(), global_state)  # the training loop's generator is left alone


def test_a_pass_not_started_only_sets_the_loaders_generators():
    loader = DataLoader(dataset(), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(5))
    start = generator_states(order_generators(loader))
    first = [b[0].tolist() for b in loader]
    assert restore_pass(loader, start, 0) is None
    assert [b[0].tolist() for b in loader] == first


class Backwards(Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


def test_a_users_sampler_cannot_be_put_back_and_restore_pass_says_why():
    loader = DataLoader(dataset(), batch_size=2, sampler=Backwards(10))
    assert order_generators(loader) is None
    with pytest.raises(ValueError, match=r"^restore_pass: the DataLoader cannot be put back at batch 2: treadle "
                                         r"cannot restore the order of its sampler, Backwards$"):
        restore_pass(loader, [torch.get_rng_state()], 2)
