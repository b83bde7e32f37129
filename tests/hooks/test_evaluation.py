
import pytest

from tests.hooks.helpers import make_trainer, read_lines
from treadle.engine import HookOrderError
from treadle.events import JSONWriter
from treadle.hooks import (
    EMA,
    CallbackHook,
    EvalHook,
    PeriodicWriter,
)


def test_every_evaluation_reaches_metrics_json_whatever_the_writer_period(tmp_path):
    trainer, _ = make_trainer()
    calls = []

    def evaluate():
        calls.append(trainer.iter)
        return {"val": {"acc": trainer.iter / 100, "n": 3}}

    trainer.register_hooks([EvalHook(5, evaluate), PeriodicWriter([JSONWriter(str(tmp_path / "metrics.json"))], period=20)])
    trainer.train(0, 42)
    lines = read_lines(tmp_path / "metrics.json")
    evals = [(line["iteration"], line["val/acc"]) for line in lines if "val/acc" in line]
    # Every 5 iterations (4, 9, ..., 39) and the final one, in the last iteration (41),
    # put at 42 (iterations run).
    assert evals == [(i, pytest.approx(i / 100)) for i in range(4, 40, 5)] + [(42, pytest.approx(0.41))]
    assert calls == list(range(4, 40, 5)) + [41]
    assert [line["iteration"] for line in lines if "total_loss" in line] == [19, 39, 41]
    assert trainer.storage.kind("val/n") == "metric"


def test_eval_at_the_last_iteration_runs_once_and_not_after_an_error():
    trainer, _ = make_trainer()
    calls = []
    trainer.register_hooks([EvalHook(5, lambda: calls.append(trainer.iter) or {"a": 1.0})])
    trainer.train(0, 10)
    assert calls == [4, 9]
    assert trainer.storage.history("a").values()[-1] == (1.0, 10)

    failing, _ = make_trainer()
    calls.clear()
    boom = CallbackHook(after_step=lambda t: (_ for _ in ()).throw(RuntimeError("x")) if t.iter == 6 else None)
    failing.register_hooks([EvalHook(5, lambda: calls.append(failing.iter) or {"a": 1.0}), boom])
    with pytest.raises(RuntimeError):
        failing.train(0, 10)
    assert calls == [4]  # no final evaluation of a failed run


def test_a_stop_at_an_iteration_not_evaluated_is_evaluated_after_its_epoch_ends():
    # A stop request of a hook that is not early stopping, between two
    # evaluations: the final weights are evaluated once the run ends, put at
    # trainer.iter (iterations run); the epoch ended before, in the loop.
    trainer, _ = make_trainer()
    trainer.epoch_length = 4
    calls, epochs = [], []
    stop = CallbackHook(after_step=lambda t: t.request_stop("budget") if t.iter == 6 else None,
                        after_epoch=lambda t: epochs.append((t.epoch, t.iter)))
    trainer.register_hooks([EvalHook(5, lambda: calls.append(trainer.iter) or {"a": 1.0}), stop])
    trainer.train(0, 20)
    assert calls == [4, 7] and epochs == [(0, 3), (1, 6)]
    assert trainer.storage.history("a").values()[-1] == (1.0, 7)


def test_eval_results_must_be_numbers():
    trainer, _ = make_trainer()
    trainer.register_hooks([EvalHook(0, lambda: {"acc": "high"})])
    with pytest.raises(TypeError, match="'acc' is a str"):
        trainer.train(0, 2)


def test_wrong_order_of_evaluation_hooks_is_reported():
    trainer, model = make_trainer()
    with pytest.raises(HookOrderError, match="EvalHook must be registered after EMA"):
        trainer.register_hooks([EvalHook(5, dict), EMA(0.9)])




def test_no_final_evaluation_after_an_interrupted_stop_but_one_after_early_stop():
    for interrupted, expected in ((True, [4]), (False, [4, 7])):
        trainer, _ = make_trainer()
        calls = []
        stop = CallbackHook(after_step=lambda t, cut=interrupted: t.request_stop("cut", interrupted=cut) if t.iter == 6 else None)
        trainer.register_hooks([EvalHook(5, lambda calls=calls, t=trainer: calls.append(t.iter) or {"a": 1.0}), stop])
        trainer.train(0, 20)
        assert calls == expected, interrupted
        assert trainer.interrupted is interrupted


