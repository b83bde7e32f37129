"""Seed derivation and CPU generator re-seeding."""

import random

import numpy as np
import pytest
import torch

from treadle.data.seeding import (
    WorkerSeeder,
    derive_seed,
    preserve_cpu_rngs,
    sample_seed,
    seed_cpu_rngs,
)


def draws():
    return (random.random(), float(np.random.rand()), torch.rand(1).item())


def test_derive_seed_is_deterministic_order_sensitive_and_64_bit():
    assert derive_seed(1, 2) == derive_seed(1, 2)
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(0) != derive_seed(0, 0)
    # Values wider than 64 bits are not truncated.
    assert derive_seed(2**64) != derive_seed(0)
    seeds = {sample_seed(0, p) for p in range(10_000)}
    assert len(seeds) == 10_000
    assert all(0 <= s < 2**64 for s in seeds)
    with pytest.raises(ValueError, match="non-negative ints, got -1"):
        derive_seed(-1)


def test_seed_cpu_rngs_fixes_python_numpy_and_torch():
    seed_cpu_rngs(sample_seed(3, 17))
    first = draws()
    seed_cpu_rngs(sample_seed(3, 17))
    assert draws() == first
    seed_cpu_rngs(sample_seed(3, 18))
    assert draws() != first


def test_preserve_cpu_rngs_restores_states():
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = draws()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    with preserve_cpu_rngs():
        seed_cpu_rngs(123)
        draws()
    assert draws() == expected


def test_worker_seeder_depends_on_worker_and_chains_user_fn():
    calls = []
    seeder = WorkerSeeder(5, rank=1, start=0, then=calls.append)
    seeder(0)
    a = draws()
    seeder(1)
    b = draws()
    seeder(0)
    assert draws() == a != b
    assert calls == [0, 1, 0]


def test_per_sample_seeds_are_derived_where_samples_are_loaded(monkeypatch):
    """The batch sampler (run by the training process) tags indices with
    stream positions only; the dataset wrapper (run by the workers) turns each
    into sample_seed(seed, position) and draws with it."""
    from itertools import islice

    from treadle.data import SeededMapDataset, StreamBatchSampler
    from treadle.data import per_sample
    from treadle.data.samplers import TrainingSampler

    calls = []
    monkeypatch.setattr(per_sample, "sample_seed", lambda seed, position: calls.append(position) or sample_seed(seed, position))
    batches = StreamBatchSampler(TrainingSampler(10, shuffle=True, seed=3), 4, sample_seeds=True)
    first, second = islice(iter(batches), 2)
    assert [position for _, position in first + second] == list(range(8))
    assert calls == []  # nothing derived while sampling

    class Draw:
        def __len__(self):
            return 10

        def __getitem__(self, index):
            return (index, torch.rand(()).item())

    samples = SeededMapDataset(Draw(), seed=3).__getitems__(second)
    assert calls == [4, 5, 6, 7]
    assert [index for index, _ in samples] == [index for index, _ in second]
    seed_cpu_rngs(sample_seed(3, 5))
    assert samples[1][1] == torch.rand(()).item()
