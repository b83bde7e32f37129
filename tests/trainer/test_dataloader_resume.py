"""The plain ``Trainer`` resumed inside an epoch of a user's torch ``DataLoader``.

A ``DataLoader`` keeps no position; the step records the generator states
each pass began with and, at a resume, starts the pass again from them and
drops the batches already trained (:mod:`treadle.data.dataloader_position`).
Where the order cannot be restored, the resume says so in one line; so it
does for a user's own re-iterable of batches (not a ``DataLoader``).
"""

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

from treadle.trainer import Trainer

# 10 samples in batches of 2: 5 iterations an epoch, 3 epochs.
BATCHES, EPOCHS = 5, 3


def dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(10, 3, generator=g), torch.randn(10, 1, generator=g))


def net():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


LOADERS = {
    "in order": lambda: DataLoader(dataset(), batch_size=2),
    "shuffled, seeded generator": lambda: DataLoader(dataset(), batch_size=2, shuffle=True,
                                                     generator=torch.Generator().manual_seed(0)),
    "shuffled, global generator": lambda: DataLoader(dataset(), batch_size=2, shuffle=True),
    "shuffled, 2 workers": lambda: DataLoader(dataset(), batch_size=2, shuffle=True, num_workers=2,
                                              generator=torch.Generator().manual_seed(0)),
}


def plain_pytorch(make_loader):
    """The run, as a hand-written loop over the same DataLoader."""
    torch.manual_seed(2)
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = make_loader()
    for _ in range(EPOCHS):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return model


def trainer(make_loader, out, **kwargs):
    torch.manual_seed(2)
    model = net()
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), make_loader(),
                   loss_fn=nn.MSELoss(), max_epochs=EPOCHS, output_dir=str(out), checkpoint_period=1,
                   max_to_keep=None, device="cpu", progress_bar=False, **kwargs)


def same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("kind", LOADERS)
def test_a_resume_two_batches_into_an_epoch_trains_what_an_uninterrupted_run_does(kind, tmp_path):
    make_loader = LOADERS[kind]
    straight = trainer(make_loader, tmp_path / "a")
    straight.train()
    assert same_weights(straight.model, plain_pytorch(make_loader))
    # Iteration 6 is the second batch of epoch 1; iteration 9 ends it.
    for checkpoint in ("model_0000006.pth", "model_0000009.pth"):
        resumed = trainer(make_loader, tmp_path / checkpoint)
        resumed.train(resume=str(tmp_path / "a" / checkpoint))
        assert same_weights(resumed.model, straight.model), checkpoint


class EveryOtherFirst(Sampler):
    """A user's sampler: treadle cannot know that its order is the same every pass."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter([*range(0, self.n, 2), *range(1, self.n, 2)])

    def __len__(self):
        return self.n


class Stream(IterableDataset):
    def __iter__(self):
        yield from dataset()

    def __len__(self):
        return 10


@pytest.mark.parametrize("make_loader, why", [
    (lambda: DataLoader(dataset(), batch_size=2, sampler=EveryOtherFirst(10)), "treadle cannot restore the order of its sampler, EveryOtherFirst"),
    (lambda: DataLoader(Stream(), batch_size=2), "its dataset is an IterableDataset"),
])
def test_a_dataloader_whose_order_cannot_be_restored_is_named_in_one_line_at_resume(make_loader, why, tmp_path,
                                                                                     treadle_caplog):
    trainer(make_loader, tmp_path / "a").train()
    treadle_caplog.clear()
    trainer(make_loader, tmp_path / "b").train(resume=str(tmp_path / "a" / "model_0000006.pth"))
    warnings = [r.getMessage() for r in treadle_caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"Resuming at iteration 7, batch 2 of epoch 1: this DataLoader cannot be put back at that batch ({why}), "
        "so it starts again at its first batch; give the dataset with batch_size= "
        "(treadle.data.build_train_loader) for an exact resume"
    ]


class EpochEnds:
    """pytorch-accelerated's callback: the epoch index at each epoch's end."""

    def __init__(self):
        self.seen = []

    def on_train_epoch_end(self, trainer):
        self.seen.append(trainer.epoch)


def test_a_run_resumed_inside_an_epoch_ends_it_with_its_index(tmp_path):
    """pytorch-accelerated's on_train_epoch_end sees the epoch's index after a
    resume inside it (it saw None), as the uninterrupted run does."""
    make_loader = LOADERS["in order"]
    straight = EpochEnds()
    trainer(make_loader, tmp_path / "a", callbacks=[straight]).train()
    assert straight.seen == [0, 1, 2]
    resumed = EpochEnds()
    trainer(make_loader, tmp_path / "b", callbacks=[resumed]).train(resume=str(tmp_path / "a" / "model_0000006.pth"))
    assert resumed.seen == [1, 2]


class OwnBatches:
    """A user's own re-iterable of batches, with a length: not a DataLoader."""

    def __init__(self):
        self.batches = list(DataLoader(dataset(), batch_size=2))

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def test_a_re_iterable_of_its_own_resumed_inside_an_epoch_is_named_in_one_line(tmp_path, treadle_caplog):
    """Before: it started the epoch again at its first batch and said nothing."""
    straight = trainer(OwnBatches, tmp_path / "a")
    straight.train()
    treadle_caplog.clear()
    trainer(OwnBatches, tmp_path / "b").train(resume=str(tmp_path / "a" / "model_0000006.pth"))
    warnings = [r.getMessage() for r in treadle_caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "Resuming at iteration 7, batch 2 of epoch 1: OwnBatches is not a DataLoader and has no state_dict(), so it "
        "cannot be put back at that batch and starts again at its first batch; batch the dataset with "
        "treadle.data.build_train_loader (the Trainer's batch_size=), or give OwnBatches state_dict() and "
        "load_state_dict(), for an exact resume"
    ]
    # At an epoch's end the next pass starts at its first batch, as in the uninterrupted run: exact.
    treadle_caplog.clear()
    resumed = trainer(OwnBatches, tmp_path / "c")
    resumed.train(resume=str(tmp_path / "a" / "model_0000009.pth"))
    assert [r for r in treadle_caplog.records if r.levelno == logging.WARNING] == []
    assert same_weights(resumed.model, straight.model)
