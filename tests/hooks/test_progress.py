"""ProgressBar: a bar that advances every iteration and shows the smoothed losses."""

import io

from torch import nn

from tests.engine.test_trainer import loader, model, problem
from treadle.engine import Trainer
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
