"""Period: a period in epochs becomes iterations from the trainer's epoch length, or is an error without one."""

import pytest

from tests.hooks.helpers import make_run
from treadle.hooks import Period, PeriodicCheckpointer


def test_period_in_epochs_uses_the_trainer_epoch_length(tmp_path):
    run = make_run(tmp_path, lambda r: PeriodicCheckpointer(r.checkpointer, period=Period(1, "epoch")))
    assert run.trainer.epoch_length == 4
    run.trainer.train(0, 10)
    assert run.files() == ["last_checkpoint", "model_0000003.pth", "model_0000007.pth", "model_final.pth"]

    run = make_run(tmp_path / "two", lambda r: PeriodicCheckpointer(r.checkpointer, period=Period(2, "epoch")))
    run.trainer.train(0, 17)
    assert run.files() == ["last_checkpoint", "model_0000007.pth", "model_0000015.pth", "model_final.pth"]


def test_period_in_epochs_without_an_epoch_length_is_an_error(tmp_path):
    run = make_run(tmp_path, lambda r: PeriodicCheckpointer(r.checkpointer, period=Period(1, "epoch")))
    run.trainer.epoch_length = None
    with pytest.raises(ValueError, match=r"PeriodicCheckpointer has a period of 1 epoch\(s\), but the trainer does not know"):
        run.trainer.train(0, 4)
