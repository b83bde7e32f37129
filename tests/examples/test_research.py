"""The research gallery (docs/research.md): each example against a hand-written
PyTorch loop (the same seed, data order and math: final weights
``torch.equal``) and killed with SIGKILL then resumed (bit-exact to an
uninterrupted run), on 2 gloo processes where it applies."""

from __future__ import annotations

import torch
import pytest
from torch.nn.functional import binary_cross_entropy_with_logits as bce

from tests.examples.research_harness import (
    assert_weights_equal,
    final_weights,
    kill_and_resume,
    run_here,
)
from treadle.examples.research import gan


def batches(loader):
    """A loader's batches without end, ``sampler.set_epoch`` per pass: the hand loop's data."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


# ---------------------------------------------------------------------------- GAN
def gan_by_hand(max_iter: int):
    torch.manual_seed(gan.SEED)
    g, d = gan.build_models()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-3, betas=(0.5, 0.999))
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=10, gamma=0.5)
    # Pending LRScheduler(name=): the discriminator's schedule (ExponentialLR(opt_d, 0.97)) stepped here too.
    data = batches(gan.build_data())
    for _ in range(max_iter):
        (real,) = next(data)
        fake = g(torch.randn(real.shape[0], gan.LATENT))
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        d_loss = bce(d(torch.cat([real, fake.detach()])), torch.cat([ones, zeros]))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(d(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        sched_g.step()
    return g, d


def test_gan_trains_as_the_hand_written_loop(tmp_path):
    run = run_here("gan", tmp_path, 12)
    g, d = gan_by_hand(12)
    assert_weights_equal(final_weights(run, "model"), g)
    assert_weights_equal(final_weights(run, "d"), d)
    assert [row["iteration"] for row in run.rows] == list(range(12))
    assert {"d_loss", "g_loss", "lr"} <= set(run.rows[0])


def test_gan_resumes_bit_exact_after_kill_9(tmp_path):
    """The gallery's quick proof: killed at iteration 7 (after the checkpoint at 4), resumed to 12."""
    kill_and_resume("gan", tmp_path, 12, 7)


@pytest.mark.slow
def test_gan_on_two_processes_resumes_bit_exact_after_kill_9(tmp_path):
    resumed = kill_and_resume("gan", tmp_path, 12, 7, num_gpus=2)
    assert resumed.state is not None
