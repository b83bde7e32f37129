"""The research gallery's distillation, mean teacher and MoCo examples
(treadle/examples/research/): each against a hand-written PyTorch loop
(the same seed, data order and math: final weights ``torch.equal``) and
killed with SIGKILL then resumed (bit-exact), MoCo also on 2 gloo processes."""

from __future__ import annotations

import copy
import inspect
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.docs.examples import ROOT, page_blocks
from tests.examples.research_harness import assert_weights_equal, final_weights, kill_and_resume, run_here
from treadle.examples.research import distillation, mean_teacher, moco

# Three passes over the 64 samples in batches of 8.
PASSES, ITERS = 3, 24


def loader_of(*tensors: torch.Tensor, sampler=None) -> torch.utils.data.DataLoader:
    """The examples' loader: batches of 8, shuffled by a generator of its own seeded 0."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*tensors), batch_size=8,
                                       shuffle=sampler is None, sampler=sampler,
                                       generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- distillation
def test_distillation_equals_a_hand_written_loop(tmp_path):
    run = run_here("distillation", tmp_path, ITERS)
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.0), nn.Linear(64, 4)).eval()
    inputs = torch.randn(64, 8)
    with torch.no_grad():
        labels = teacher(inputs).argmax(dim=1)
    student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
    loader, t, alpha = loader_of(inputs, labels), 4.0, 0.7
    for _ in range(PASSES):
        for x, y in loader:
            with torch.no_grad():
                soft_targets = F.log_softmax(teacher(x) / t, dim=1)
            logits = student(x)
            kd = F.kl_div(F.log_softmax(logits / t, dim=1), soft_targets, reduction="batchmean", log_target=True)
            loss = alpha * kd * t * t + (1 - alpha) * F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert_weights_equal(final_weights(run), student)
    assert_weights_equal(final_weights(run, "teacher"), teacher)  # saved, never trained
    assert [row["iteration"] for row in run.rows] == list(range(ITERS))
    assert {"total_loss", "loss_kd", "loss_ce"} <= set(run.rows[-1])


@pytest.mark.slow
def test_distillation_resumes_exactly_after_kill_9(tmp_path):
    """Killed at 13 (its checkpoint at 9), resumed to 24 (the gallery's quick proof is the GAN's)."""
    resumed = kill_and_resume("distillation", tmp_path, ITERS, 13)
    assert "teacher" in resumed.state


# ---------------------------------------------------------------- mean teacher
def test_mean_teacher_equals_a_hand_written_loop(tmp_path):
    run = run_here("mean_teacher", tmp_path, ITERS)
    torch.manual_seed(0)
    inputs = torch.randn(64, 8)
    labels = (inputs @ torch.randn(8, 4)).argmax(dim=1)
    online = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    target = copy.deepcopy(online)
    optimizer = torch.optim.SGD(online.parameters(), lr=0.1, momentum=0.9)
    loader = loader_of(inputs, labels)
    for _ in range(PASSES):
        for x, y in loader:
            view_a, view_b = x + 0.2 * torch.randn_like(x), x + 0.2 * torch.randn_like(x)
            logits = online(view_a)
            with torch.no_grad():
                target_probs = target(view_b).softmax(dim=1)
            loss = F.cross_entropy(logits, y) + 1.0 * F.mse_loss(logits.softmax(dim=1), target_probs)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for t, o in zip(target.parameters(), online.parameters()):
                    t.lerp_(o, 1 - 0.9)
    assert_weights_equal(final_weights(run), online)
    assert_weights_equal(final_weights(run, "target"), target)
    assert not any(torch.equal(a, b) for a, b in zip(target.parameters(), online.parameters()))


@pytest.mark.slow
def test_mean_teacher_resumes_exactly_after_kill_9(tmp_path):
    resumed = kill_and_resume("mean_teacher", tmp_path, ITERS, 13)
    assert "target" in resumed.state


# ---------------------------------------------------------------- MoCo
def test_moco_on_one_process_equals_a_hand_written_loop(tmp_path):
    run = run_here("moco", tmp_path, ITERS)
    torch.manual_seed(0)
    dataset_inputs = torch.randn(64, 8)
    encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    key = copy.deepcopy(encoder)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1, momentum=0.9)
    sampler = torch.utils.data.DistributedSampler(range(64), num_replicas=1, rank=0, seed=0)
    loader = loader_of(dataset_inputs, sampler=sampler)
    torch.manual_seed(0)
    queue, pointer = F.normalize(torch.randn(32, 8), dim=1), 0
    for epoch in range(PASSES):
        sampler.set_epoch(epoch)
        for (x,) in loader:
            q = F.normalize(encoder(x + 0.2 * torch.randn_like(x)), dim=1)
            with torch.no_grad():
                for k_param, q_param in zip(key.parameters(), encoder.parameters()):
                    k_param.lerp_(q_param, 1 - 0.9)
                k = F.normalize(key(x + 0.2 * torch.randn_like(x)), dim=1)
            logits = torch.cat([(q * k).sum(dim=1, keepdim=True), q @ queue.T], dim=1) / 0.2
            loss = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            queue[pointer:pointer + 8] = k
            pointer = (pointer + 8) % 32
    assert_weights_equal(final_weights(run), encoder)
    assert_weights_equal(final_weights(run, "key"), key)
    step_state = run.state["trainer"]["step"]
    assert torch.equal(step_state["queue"], queue) and step_state["pointer"] == pointer == 0


@pytest.mark.slow
def test_moco_resumes_exactly_after_kill_9(tmp_path):
    """Killed at 13 (the queue's pointer at 16 of 32 in the checkpoint of 9), resumed to 24."""
    kill_and_resume("moco", tmp_path, ITERS, 13)


@pytest.mark.slow
def test_moco_on_two_processes_resumes_exactly_after_kill_9(tmp_path):
    """Each rank's queue is its own (its keys, its noise): the resume must
    give each rank its own queue back, with its data position and RNG."""
    resumed = kill_and_resume("moco", tmp_path, ITERS, 13, num_gpus=2)
    assert resumed.rows[-1]["iteration"] == ITERS - 1


# ---------------------------------------------------------------- the page
def test_the_steps_on_the_research_page_are_the_examples_own():
    """A step class that docs/research.md shows whole (a block the docs tests
    run) is the example file's class, character for character."""
    shown = {}
    for block in page_blocks(ROOT / "docs" / "research.md"):
        if block.skipped is not None:  # an excerpt, marked as one
            continue
        for match in re.finditer(r"^class (\w+)\(.*?(?=\n\S|\Z)", block.code, flags=re.M | re.S):
            shown[match.group(1)] = match.group(0).rstrip()
    for module in (distillation, mean_teacher, moco):
        for name in module.__all__:
            if name in shown:
                assert shown.pop(name) == inspect.getsource(getattr(module, name)).rstrip(), name
    assert not shown, f"classes on the page that no example of this file defines: {sorted(shown)}"
