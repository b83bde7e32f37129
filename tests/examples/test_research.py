"""The research gallery (docs/research.md): each example against a hand-written
PyTorch loop (the same seed, data order and math: final weights
``torch.equal``) and killed with SIGKILL then resumed (bit-exact to an
uninterrupted run), on 2 gloo processes where it applies."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.nn.functional import binary_cross_entropy_with_logits as bce
from torch.nn.functional import cross_entropy

from tests.engine.test_distributed import _process_group, _spawn
from tests.examples.research_harness import (
    Run,
    assert_same_run,
    assert_weights_equal,
    final_weights,
    kill_and_resume,
    run_here,
    run_subprocess,
)
from treadle.examples.research import gan, sam, wgan_gp


def test_the_harness_sees_one_bit_of_difference(tmp_path):
    """assert_same_run compares every tensor of the checkpoints (the trainer's state included) and every row."""
    state = {"model": {"w": torch.ones(2)}, "trainer": {"hooks": {}, "rng": {"torch": torch.zeros(3)}}}
    rows = [{"iteration": 0, "loss": 1.0, "time": 0.5}]
    same_but_timings = Run(tmp_path, copy.deepcopy(state), [{"iteration": 0, "loss": 1.0, "time": 0.7}])
    assert_same_run(same_but_timings, Run(tmp_path, state, rows))
    changed = copy.deepcopy(state)
    changed["trainer"]["rng"]["torch"][1] = torch.finfo(torch.float32).tiny
    with pytest.raises(AssertionError, match="checkpoint/trainer/rng/torch: tensors differ"):
        assert_same_run(Run(tmp_path, changed, rows), Run(tmp_path, state, rows))
    with pytest.raises(AssertionError):
        assert_same_run(Run(tmp_path, state, [{"iteration": 0, "loss": 1.5}]), Run(tmp_path, state, rows))


def batches(loader):
    """A loader's batches without end, ``sampler.set_epoch`` per pass: the hand loop's data."""
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):  # a DistributedSampler
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


# ---------------------------------------------------------------------------- GAN
def gan_by_hand(max_iter: int, rank: int = 0, world_size: int = 1):
    """The hand-written loop: on several processes both models in DDP, this
    rank's share of the data from a ``DistributedSampler``, its own noise.
    Returns the models and the rates each iteration trained with."""
    torch.manual_seed(gan.SEED + rank)
    g, d = gan.build_models()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-3, betas=(0.5, 0.999))
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=10, gamma=0.5)
    sched_d = torch.optim.lr_scheduler.ExponentialLR(opt_d, gamma=0.97)
    run_g, run_d = (DistributedDataParallel(g), DistributedDataParallel(d)) if world_size > 1 else (g, d)
    data = batches(gan.build_data(world_size, rank))
    rates = []
    for _ in range(max_iter):
        rates.append({"lr_g": opt_g.param_groups[0]["lr"], "lr_d": opt_d.param_groups[0]["lr"]})
        (real,) = next(data)
        fake = run_g(torch.randn(real.shape[0], gan.LATENT))
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        d_loss = bce(run_d(torch.cat([real, fake.detach()])), torch.cat([ones, zeros]))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(run_d(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        sched_g.step()
        sched_d.step()
    return g, d, rates


def test_gan_trains_as_the_hand_written_loop(tmp_path):
    run = run_here("gan", tmp_path, 12)
    g, d, rates = gan_by_hand(12)
    assert_weights_equal(final_weights(run, "model"), g)
    assert_weights_equal(final_weights(run, "d"), d)
    assert [row["iteration"] for row in run.rows] == list(range(12))
    assert {"d_loss", "g_loss"} <= set(run.rows[0]) and "lr" not in run.rows[0]
    # Both schedules, each rate under its own name, as the hand-written loop's optimizers had them.
    assert [{"lr_g": row["lr_g"], "lr_d": row["lr_d"]} for row in run.rows] == rates


def test_gan_resumes_bit_exact_after_kill_9(tmp_path):
    """The gallery's quick proof: killed at iteration 7 (after the checkpoint at 4), resumed to 12,
    against an uninterrupted run made in this process (one subprocess fewer)."""
    kill_and_resume("gan", tmp_path, 12, 7, reference=run_here("gan", tmp_path / "uninterrupted", 12))


def gan_by_hand_on_rank(rank: int, tmp: str, max_iter: int) -> None:
    """The hand-written loop on rank ``rank`` of 2, its models saved."""
    with _process_group(rank, 2, tmp):
        torch.set_num_threads(1)
        g, d, _ = gan_by_hand(max_iter, rank, 2)
        torch.save({"g": g.state_dict(), "d": d.state_dict()}, os.path.join(tmp, f"hand{rank}.pth"))


@pytest.mark.slow
def test_gan_on_two_processes_trains_as_the_hand_written_loop_and_resumes_bit_exact(tmp_path):
    reference = run_subprocess("gan", tmp_path / "uninterrupted", 12, num_gpus=2)
    _spawn(gan_by_hand_on_rank, 2, str(tmp_path), 12)
    for rank in range(2):
        hand = torch.load(tmp_path / f"hand{rank}.pth", weights_only=True)
        for key, name in (("g", "model"), ("d", "d")):
            weights = final_weights(reference, name)
            assert list(weights) == list(hand[key])
            for param in weights:
                assert torch.equal(weights[param], hand[key][param]), f"rank {rank}: {key}.{param}"
    kill_and_resume("gan", tmp_path, 12, 7, num_gpus=2, reference=reference)


# ---------------------------------------------------------------------------- WGAN-GP
def wgan_gp_by_hand(max_iter: int):
    torch.manual_seed(wgan_gp.SEED)
    g, critic = wgan_gp.build_models()
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3, betas=(0.0, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.0, 0.9))
    data = batches(wgan_gp.build_data())
    for _ in range(max_iter):
        for _ in range(wgan_gp.N_CRITIC):
            (real,) = next(data)
            with torch.no_grad():
                fake = g(torch.randn(real.shape[0], wgan_gp.LATENT))
            wasserstein = critic(real).mean() - critic(fake).mean()
            eps = torch.rand(real.shape[0], 1)
            mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
            (grad,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
            penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
            opt_c.zero_grad()
            (-wasserstein + wgan_gp.GP_WEIGHT * penalty).backward()
            opt_c.step()
        g_loss = -critic(g(torch.randn(wgan_gp.BATCH, wgan_gp.LATENT))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
    return g, critic


def test_wgan_gp_trains_as_the_hand_written_loop(tmp_path):
    """Three critic updates per iteration, each on its own batch: 6 iterations read 18 batches (over 2 passes)."""
    run = run_here("wgan_gp", tmp_path, 6)
    g, critic = wgan_gp_by_hand(6)
    assert_weights_equal(final_weights(run, "model"), g)
    assert_weights_equal(final_weights(run, "critic"), critic)
    assert run.state["trainer"]["step"]["data"]["data_pass"]["epoch"] == 2
    assert {"critic_loss", "gradient_penalty", "wasserstein", "g_loss"} <= set(run.rows[-1])


@pytest.mark.slow
def test_wgan_gp_resumes_bit_exact_after_kill_9(tmp_path):
    kill_and_resume("wgan_gp", tmp_path, 10, 7)


# ---------------------------------------------------------------------------- SAM + EMA
def sam_by_hand(max_iter: int):
    torch.manual_seed(sam.SEED)
    model = sam.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    average = {name: value.detach().clone() for name, value in model.state_dict().items()}
    data = batches(sam.build_data())
    for _ in range(max_iter):
        inputs, labels = next(data)
        optimizer.zero_grad()
        cross_entropy(model(inputs), labels).backward()
        params = list(model.parameters())
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        moves = [p.grad * (sam.RHO / (norm + 1e-12)) for p in params]
        with torch.no_grad():
            for p, move in zip(params, moves):
                p.add_(move)
        optimizer.zero_grad()
        cross_entropy(model(inputs), labels).backward()
        with torch.no_grad():
            for p, move in zip(params, moves):
                p.sub_(move)
        optimizer.step()
        with torch.no_grad():
            for name, value in model.state_dict().items():
                average[name].lerp_(value, 1 - sam.EMA_DECAY)
    return model, average


def test_sam_with_ema_trains_as_the_hand_written_loop(tmp_path):
    run = run_here("sam", tmp_path, 8)
    model, average = sam_by_hand(8)
    assert_weights_equal(final_weights(run, "model"), model)
    ema = run.state["trainer"]["hooks"]["EMA"]
    assert ema["num_updates"] == 8
    assert list(ema["weights"]) == list(average)
    for name, value in average.items():
        assert torch.equal(ema["weights"][name], value), name
    assert {"total_loss", "loss_perturbed"} <= set(run.rows[-1])


@pytest.mark.slow
def test_sam_with_ema_resumes_bit_exact_after_kill_9(tmp_path):
    kill_and_resume("sam", tmp_path, 12, 7)
