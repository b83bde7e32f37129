"""ProgressBar: a bar that advances every iteration and shows the smoothed losses."""

import io

from torch import nn

from tests.trainer.test_trainer import loader, model, problem
from treadle.trainer import Trainer
from treadle.hooks import ProgressBar


def test_progress_bar_shows_smoothed_loss_and_advances_every_iteration():
    stream = io.StringIO()
    m = model()
    trainer = Trainer(m, "sgd", loader(problem()), lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=8, log_period=4, progress_bar=False)
    bar = ProgressBar(4, file=stream, disable=False)
    trainer.register_hooks([bar])
    trainer.train()
    text = stream.getvalue()
    assert "8/8" in text and "total_loss=" in text


def test_progress_bar_declares_its_period_and_reaches_the_end():
    # The loss readout refreshes at the declared period and the last
    # iteration, where the trainer calls after_step (and nowhere else); the
    # bar still advances every iteration, in before_step.
    calls, positions = [], []

    class Counting(ProgressBar):
        def before_step(self):
            super().before_step()
            positions.append(self._bar.n)

        def after_step(self):
            calls.append(self.trainer.iter)
            super().after_step()

    stream = io.StringIO()
    trainer = Trainer(model(), "sgd", loader(problem()), lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=8,
                      log_period=3, progress_bar=False)
    trainer.register_hooks([Counting(3, file=stream, disable=False)])
    trainer.train()
    assert calls == [2, 5, 7]
    assert positions == list(range(8))
    assert "8/8" in stream.getvalue() and "total_loss=" in stream.getvalue()
