"""What only a CUDA device can show: fp16 with a GradScaler against the
hand-written recipe, CompiledStep replaying CUDA graphs, no host
synchronisation between flushes (``torch.cuda.set_sync_debug_mode("error")``),
and asynchronous checkpoints taken while the GPU keeps training.

Every test here is skipped without CUDA; ``benchmarks/gpu.py`` gives the
figures for the same device."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from treadle.checkpoint import Checkpointer, load_checkpoint_file
from treadle.data import build_train_loader
from treadle.engine import CompiledStep, EagerStep, TrainerBase
from treadle.trainer import Trainer
from treadle.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter
from treadle.hooks import EMA, HookBase, IterationTimer, LRScheduler, PeriodicCheckpointer, PeriodicWriter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PERIOD = 10


def make_model(seed: int = 0, width: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4)).cuda()


def make_data(n: int = 8, batch: int = 32, device: str = "cuda"):
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 16, generator=generator).to(device), torch.randint(0, 4, (batch,), generator=generator).to(device))
        for _ in range(n)
    ]


def cycle(data, iters):
    return [data[i % len(data)] for i in range(iters)]


class SyncGuard(HookBase):
    """Makes every CUDA synchronisation an error from one ``before_step`` to
    the next, except in the iterations listed as allowed (flushes, saves) and
    the first (lazy CUDA and cuBLAS set-up). Register it first."""

    def __init__(self, allowed=lambda it: False):
        self.allowed = allowed
        self.guarded = 0

    def before_step(self):
        it = self.trainer.iter
        free = it == self.trainer.start_iter or self.allowed(it)
        torch.cuda.set_sync_debug_mode("default" if free else "error")
        self.guarded += not free

    def after_train(self):
        torch.cuda.set_sync_debug_mode("default")


def flush_iteration(it: int, period: int = PERIOD) -> bool:
    return (it + 1) % period == 0


@pytest.fixture(autouse=True)
def _sync_mode_restored():
    yield
    torch.cuda.set_sync_debug_mode("default")


def test_the_sync_guard_catches_a_host_read():
    """The guard is real: an ``.item()`` in a guarded iteration raises."""

    class Reads(HookBase):
        def after_step(self):
            torch.ones((), device="cuda").item()

    model = make_model()
    trainer = TrainerBase(EagerStep(model, make_data(), torch.optim.SGD(model.parameters(), lr=0.1),
                                    loss_fn=nn.functional.cross_entropy))
    trainer.register_hooks([SyncGuard(), Reads()])
    with pytest.raises(RuntimeError, match="synchroniz"):
        trainer.train(0, 3)


def hand_written_fp16(model, optimizer, scaler, batches):
    """The recipe of the torch.amp documentation, with the unscale that
    treadle does so that hooks and clipping see true gradients."""
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()


def test_fp16_with_grad_scaler_matches_the_hand_written_recipe_through_skipped_steps():
    """A huge initial scale overflows the fp16 gradients: the first updates
    are skipped and the scale halves; treadle must skip the same steps and
    end with the same weights and scale, bit for bit."""
    data, iters = make_data(), 40
    reference = make_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    ref_scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40, growth_interval=5)
    hand_written_fp16(reference, ref_opt, ref_scaler, cycle(data, iters))

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40, growth_interval=5)
    step = EagerStep(model, data, optimizer, loss_fn=nn.functional.cross_entropy, precision="fp16", grad_scaler=scaler)
    TrainerBase(step).train(0, iters)

    assert scaler.get_scale() == ref_scaler.get_scale() < 2.0**40  # steps were skipped
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


def _deferred_run(tmp_path, defer, guard=None):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = EagerStep(model, make_data(), optimizer, loss_fn=nn.functional.cross_entropy)
    trainer = TrainerBase(step)
    writers = [JSONWriter(str(tmp_path / "metrics.json")), CommonMetricPrinter(3 * PERIOD),
               TensorboardXWriter(str(tmp_path / "tb"))]
    trainer.register_hooks([
        guard, IterationTimer(), LRScheduler(scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 30)),
        PeriodicWriter(writers, period=PERIOD, defer=defer),
    ])
    trainer.train(0, 3 * PERIOD + 3)
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    return [(line["iteration"], line["total_loss"], line["lr"]) for line in lines]


def test_the_deferred_flush_never_waits_for_the_device_and_writes_the_waiting_flushs_rows(tmp_path):
    """On CUDA a periodic flush only starts the copy of its values: with
    every iteration but the first guarded, flushes included, nothing
    synchronises until the end of training, and metrics.json holds the
    rows of a flush that waits."""
    (tmp_path / "deferred").mkdir()
    (tmp_path / "waiting").mkdir()
    guard = SyncGuard()
    deferred = _deferred_run(tmp_path / "deferred", None, guard)
    assert guard.guarded == 3 * PERIOD + 3 - 1
    waiting = _deferred_run(tmp_path / "waiting", False)
    assert [row[0] for row in deferred] == [9, 19, 29, 32]
    assert deferred == waiting


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_no_host_sync_between_flushes_with_the_standard_hooks_and_writers(tmp_path, precision):
    """IterationTimer, LRScheduler, EMA, clipping and the three writers every
    PERIOD iterations: a synchronisation anywhere else raises. fp16 uses a
    fused AdamW, which takes the scaler's inf check on the device."""
    model = make_model()
    fused = precision == "fp16"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    dataset = torch.utils.data.TensorDataset(*[torch.cat(t) for t in zip(*make_data(device="cpu"))])
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True, pin_memory=True,
                                         generator=torch.Generator().manual_seed(0))
    step = EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy, precision=precision, clip_grad_norm=1.0)
    trainer = TrainerBase(step)
    guard = SyncGuard(flush_iteration)
    writers = [JSONWriter(str(tmp_path / "metrics.json")), CommonMetricPrinter(3 * PERIOD),
               TensorboardXWriter(str(tmp_path / "tb"))]
    trainer.register_hooks([
        guard, IterationTimer(), LRScheduler(scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 30)), EMA(0.99),
        PeriodicWriter(writers, period=PERIOD),
    ])
    trainer.train(0, 3 * PERIOD)
    assert guard.guarded == 3 * PERIOD - 4  # all but the first and the three flushes
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [9, 19, 29]
    assert all(0 < line["total_loss"] < 10 and line["grad_norm"] > 0 for line in lines)


def test_plain_trainer_on_cuda_syncs_only_to_flush_and_save(tmp_path):
    """The plain Trainer's defaults (device "auto" picks CUDA) with an
    output_dir and checkpoints: no synchronisation outside the flushes and
    the saves."""
    model = make_model().cpu()
    dataset = torch.utils.data.TensorDataset(*[torch.cat(t) for t in zip(*make_data(device="cpu"))])
    # Reads happen at flushes, saves and epoch ends (the epoch's row of the history, 8 batches).
    guard = SyncGuard(lambda it: flush_iteration(it) or flush_iteration(it, 15) or flush_iteration(it, 8))
    trainer = Trainer(model, "adamw", dataset, loss_fn=nn.functional.cross_entropy, lr=1e-3, batch_size=32,
                      max_iter=30, log_period=PERIOD, checkpoint_period=15, output_dir=str(tmp_path / "run"),
                      hooks=[guard], progress_bar=False, seed=0)
    assert trainer.device.type == "cuda"
    trainer.train()
    assert guard.guarded == 30 - 1 - 3 - 1 - 3  # first, flushes, the save at 14, epoch ends 7, 15, 23
    assert {"model_0000014.pth", "model_final.pth", "last_checkpoint"} <= set(os.listdir(tmp_path / "run"))
    assert len(trainer.history.epochs) == 4  # the last one partial


def train_compiled_or_eager(compiled: bool, tmp_path, iters: int = 12):
    model, data = make_model(), make_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    kwargs = dict(loss_fn=nn.functional.cross_entropy)
    step = CompiledStep(model, data, optimizer, mode="reduce-overhead", **kwargs) if compiled else \
        EagerStep(model, data, optimizer, **kwargs)
    trainer = TrainerBase(step)
    losses = []

    class History(HookBase):
        def after_train(self):
            losses.extend(value for value, _ in self.trainer.storage.history("total_loss").values())

    # The history holds every iteration's value (metrics.json holds medians over a window).
    trainer.register_hooks([History()])
    trainer.train(0, iters)
    return model, step, losses


def test_compiled_step_replays_cuda_graphs_and_publishes_every_iterations_loss(tmp_path):
    """mode="reduce-overhead": the graph's output buffer is overwritten by each
    replay, so the losses read when the storage is resolved must be the
    copies taken at each iteration, equal to the eager run's, none repeated."""
    from torch._dynamo.utils import counters

    counters.clear()
    eager_model, _, eager_losses = train_compiled_or_eager(False, tmp_path)
    model, step, losses = train_compiled_or_eager(True, tmp_path)
    assert step.compiled, step._fell_back_reason
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert len(set(losses)) == len(losses) == 12
    assert losses == pytest.approx(eager_losses, rel=1e-4)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_compiled_step_with_cuda_graphs_syncs_only_to_flush(tmp_path):
    model, data = make_model(), make_data()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    step = CompiledStep(model, data, optimizer, mode="reduce-overhead", loss_fn=nn.functional.cross_entropy)
    trainer = TrainerBase(step)
    # The first iterations compile and record the graphs: guarded from the third.
    guard = SyncGuard(lambda it: it < 3 or flush_iteration(it))
    trainer.register_hooks([guard, IterationTimer(), PeriodicWriter([JSONWriter(str(tmp_path / "m.json"))], period=PERIOD)])
    trainer.train(0, 3 * PERIOD)
    assert step.compiled and guard.guarded == 3 * PERIOD - 6


def build_async(output_dir, fmt: str):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = torch.utils.data.TensorDataset(*[torch.cat(t) for t in zip(*make_data(device="cpu"))])
    # A resumable loader: the resumed run must continue the data stream where the checkpoint left it.
    data = build_train_loader(dataset, total_batch_size=32, seed=0, pin_memory=True)
    trainer = TrainerBase(EagerStep(model, data, optimizer, loss_fn=nn.functional.cross_entropy, precision="bf16"))
    checkpointer = Checkpointer(model, str(output_dir), optimizer=optimizer, trainer=trainer, format=fmt)
    trainer.register_hooks([PeriodicCheckpointer(checkpointer, 5, max_to_keep=None, async_save=True)])
    return model, trainer, checkpointer


@pytest.mark.parametrize("fmt", ["file", "dcp"])
def test_async_checkpoints_hold_the_weights_of_their_iteration_and_resume_exactly(tmp_path, fmt):
    """Saves in the background while the GPU trains on: each checkpoint holds
    the weights of the iteration it names (compared with a synchronous run),
    and resuming from the middle one ends bit-identical to the whole run."""
    model, trainer, checkpointer = build_async(tmp_path / "whole", fmt)
    seen = {}

    class Snapshot(HookBase):
        def after_step(self):
            if (self.trainer.iter + 1) % 5 == 0:
                seen[self.trainer.iter] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    trainer.register_hooks([Snapshot()])
    trainer.train(0, 20)
    checkpointer.wait()
    if fmt == "file":
        saved = load_checkpoint_file(str(tmp_path / "whole" / "model_0000009.pth"))
        for key, value in seen[9].items():
            assert torch.equal(saved["model"][key].cpu(), value), key
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}

    resumed_model, resumed, resumed_ckpt = build_async(tmp_path / "whole", fmt)
    for name in os.listdir(tmp_path / "whole"):  # resume from iteration 9, as if killed after it
        if name.startswith("model_") and "0000009" not in name:
            path = tmp_path / "whole" / name
            os.rename(path, tmp_path / f"moved_{name}")
    (tmp_path / "whole" / "last_checkpoint").write_text(
        next(n for n in os.listdir(tmp_path / "whole") if "0000009" in n))
    extra = resumed_ckpt.resume_or_load("", resume=True)
    assert extra["iteration"] == 9
    resumed.train(extra["iteration"] + 1, 20)
    resumed_ckpt.wait()
    for key, value in resumed_model.state_dict().items():
        assert torch.equal(value, final[key]), key
