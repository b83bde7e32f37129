
import pytest
import torch
from torch import nn

from tests.hooks.helpers import make_trainer, read_lines
from treadle.engine import HookOrderError
from treadle.events import CommonMetricPrinter, JSONWriter
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




def _model_and_batches():
    """make_trainer's model and its 4 batches, made again the same way."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return model, [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]


def _mse(model, batches):
    with torch.no_grad():
        return sum(nn.functional.mse_loss(model(x), y).item() for x, y in batches) / len(batches)


def _hand_written_losses(steps):
    """The mean squared error over make_trainer's 4 batches after each of ``steps`` SGD steps, in plain PyTorch."""
    model, batches = _model_and_batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    after = {}
    for step in range(max(steps)):
        x, y = batches[step % 4]
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        after[step + 1] = _mse(model, batches)
    return [after[n] for n in steps]


def _evaluate_mse(model):
    batches = _model_and_batches()[1]
    return lambda: {"mse": _mse(model, batches)}


def _evaluation_lines(caplog):
    records = {id(r): r for r in caplog.records}  # one record can arrive twice (see tests/events/test_writers.py)
    return [r.getMessage() for r in records.values() if r.name in ("treadle.hooks.evaluation", "treadle.events.printer")
            and ("Evaluation" in r.getMessage() or r.getMessage().startswith("metrics"))]


def _check_evaluations(tmp_path, caplog, evaluations):
    """Each evaluation, given as (its metrics.json row, the iterations run before it): its row holds the
    mse of a hand-written loop after that many steps, and both log lines say that many iterations."""
    expected = _hand_written_losses([run for _, run in evaluations])
    assert [(row["iteration"], row["mse"]) for row in read_lines(tmp_path / "metrics.json") if "mse" in row] == [
        (row, pytest.approx(mse, rel=1e-6)) for (row, _), mse in zip(evaluations, expected)
    ]
    assert _evaluation_lines(caplog) == [
        line for (_, run), mse in zip(evaluations, expected)
        for line in (f"Evaluation after {run} iterations: mse={mse:.6g}", f"metrics after {run} iterations:  mse: {mse:.6g}")
    ]


def test_the_log_counts_iterations_one_way_for_the_periodic_and_the_final_evaluation(tmp_path, treadle_caplog):
    """detectron2's job: eval_period=3, max_iter=6. metrics.json keeps detectron2's rows (2, then max_iter 6);
    the log says 'after 3 iterations' and 'after 6 iterations', each the weights of a hand-written loop's 3rd and 6th step."""
    trainer, model = make_trainer()
    evaluate = _evaluate_mse(model)
    printer = CommonMetricPrinter(6, window_size=1, color=False)
    trainer.register_hooks([EvalHook(3, evaluate), PeriodicWriter([printer, JSONWriter(str(tmp_path / "metrics.json"))], period=1)])
    trainer.train(0, 6)
    _check_evaluations(tmp_path, treadle_caplog, [(2, 3), (6, 6)])


def test_a_run_stopped_between_evaluations_says_the_iterations_it_ran(tmp_path, treadle_caplog):
    """A stop request after iteration 4 of 20 (the 5th): evaluated once the loop ends, put at 5 in metrics.json
    and logged 'after 5 iterations' by both lines, the weights of a hand-written loop's 5th step."""
    trainer, model = make_trainer()
    evaluate = _evaluate_mse(model)
    stop = CallbackHook(after_step=lambda t: t.request_stop("budget") if t.iter == 4 else None)
    writer = PeriodicWriter([CommonMetricPrinter(20, window_size=1, color=False), JSONWriter(str(tmp_path / "metrics.json"))],
                            period=1)
    trainer.register_hooks([EvalHook(3, evaluate), stop, writer])
    trainer.train(0, 20)
    _check_evaluations(tmp_path, treadle_caplog, [(2, 3), (5, 5)])
