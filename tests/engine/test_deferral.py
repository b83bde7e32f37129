"""Publishing never reads a tensor on the host between flushes."""

import itertools
import json
from collections import Counter

import pytest
import torch
from torch import nn

from treadle.engine import EagerStep, TrainerBase
from treadle.events import CommonMetricPrinter, JSONWriter, has_event_storage, get_event_storage
from treadle.hooks import EMA, HookBase, IterationTimer, LRScheduler, PeriodicWriter

HOST_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


@pytest.fixture
def host_reads(monkeypatch):
    """Counts host reads of tensors per training iteration."""
    counts: Counter = Counter()
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, __original=original, __name=name, **kwargs):
            if has_event_storage():
                counts[get_event_storage().iter] += 1
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counts


def test_no_host_reads_between_flushes(tmp_path, host_reads):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    data = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(5)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = EagerStep(model, itertools.cycle(data), opt, loss_fn=nn.functional.cross_entropy, clip_grad_norm=1.0, grad_accum_steps=2)
    trainer = TrainerBase(step)
    trainer.register_hooks(
        [
            IterationTimer(),
            LRScheduler(scheduler=torch.optim.lr_scheduler.StepLR(opt, 7)),
            EMA(0.9),
            PeriodicWriter([JSONWriter(str(tmp_path / "metrics.json")), CommonMetricPrinter(30)], period=10),
        ]
    )
    trainer.train(0, 30)
    flushes = {9, 19, 29}
    assert set(host_reads) <= flushes | {30}, f"host reads outside flushes at iterations {sorted(set(host_reads) - flushes)}"
    assert all(host_reads[it] > 0 for it in flushes)  # the counter does see the flushes' reads
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [9, 19, 29]
    assert {"total_loss", "grad_norm", "lr", "time", "data_time"} <= set(lines[0])


def test_a_cpu_run_without_writers_holds_at_most_max_pending_cpu_losses():
    """With no writer nothing flushes; on a CPU the step's pending losses are
    still read every ``max_pending_cpu`` iterations (no sync there), and every
    value reaches the history."""
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    data = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(7)]
    losses = []

    def loss_fn(outputs, targets):
        loss = nn.functional.cross_entropy(outputs, targets)
        losses.append(loss.detach().clone())
        return loss

    trainer = TrainerBase(EagerStep(model, itertools.cycle(data), torch.optim.SGD(model.parameters(), lr=0.1),
                                    loss_fn=loss_fn))
    held = []

    class Watch(HookBase):
        def after_step(self):
            held.append(len(self.trainer.step._series["total_loss"]))

    trainer.register_hooks([Watch()])
    trainer.train(0, 200)
    limit = trainer.storage.max_pending_cpu
    assert limit < 200 and max(held) == limit - 1
    assert trainer.storage.history("total_loss").values() == [(loss.item(), i) for i, loss in enumerate(losses)]
