"""EarlyStopping: when it stops, and its counters across a resume."""

import pytest

from tests.hooks.helpers import crash_at, make_run, same, scripted_eval
from treadle.hooks import CallbackHook, EarlyStopping, EvalHook, PeriodicCheckpointer


def early_stopping_run(out, script, calls, extra=()):
    return make_run(
        out,
        lambda r: EvalHook(2, scripted_eval(lambda: r.trainer, script, calls)),
        lambda r: EarlyStopping("acc", patience=2),
        lambda r: PeriodicCheckpointer(r.checkpointer, period=6),
        *extra,
    )


STOP_SCRIPT = {1: 0.5, 3: 0.6, 5: 0.55, 7: 0.58, 9: 0.9, 11: 0.95, 20: 1.0}


def test_early_stopping_stops_at_the_expected_iteration_and_after_train_still_runs(tmp_path):
    calls, steps = [], []
    count = lambda r: CallbackHook(before_step=lambda t: steps.append(t.iter))  # noqa: E731
    run = early_stopping_run(tmp_path, STOP_SCRIPT, calls, extra=[count])
    run.trainer.train(0, 20)

    assert steps == list(range(8))
    assert run.trainer.stop_reason.startswith("early stopping: acc has not improved by more than 0.0 for 2 evaluation(s)")
    # The final evaluation is not repeated: the weights after 7 were just evaluated.
    assert calls == [1, 3, 5, 7]
    # The final checkpoint is written, with the weights of the last iteration run.
    assert run.files() == ["last_checkpoint", "model_0000005.pth", "model_final.pth"]
    final = run.load("model_final.pth")
    assert final["iteration"] == 7
    assert same(final["model"], run.weights[7])
    assert final["trainer"]["hooks"]["EarlyStopping"] == {"best_metric": 0.6, "best_iter": 3, "num_bad_evals": 2}


def test_early_stopping_counters_survive_a_resume(tmp_path):
    first = early_stopping_run(tmp_path, STOP_SCRIPT, [], extra=[lambda r: crash_at(6)])
    with pytest.raises(RuntimeError, match="crash at 6"):
        first.trainer.train(0, 20)
    # The checkpoint at 5 holds one miss (0.55 after the best 0.6).
    assert first.load("model_0000005.pth")["trainer"]["hooks"]["EarlyStopping"] == {
        "best_metric": 0.6,
        "best_iter": 3,
        "num_bad_evals": 1,
    }

    calls, steps = [], []
    count = lambda r: CallbackHook(before_step=lambda t: steps.append(t.iter))  # noqa: E731
    second = early_stopping_run(tmp_path, STOP_SCRIPT, calls, extra=[count])
    start = second.resume()
    second.trainer.train(start, 20)
    # One more miss, at 7, stops it: as in the uninterrupted run.
    assert start == 6 and steps == [6, 7]
    assert calls == [7]
    assert second.load("model_final.pth")["iteration"] == 7


def test_the_final_evaluation_stops_nothing(tmp_path):
    # The final evaluation runs in the last iteration's after_step, where
    # EarlyStopping runs too: a worse result there ends no run, it has ended.
    calls = []
    run = make_run(
        tmp_path,
        lambda r: EvalHook(2, scripted_eval(lambda: r.trainer, {1: 0.5, 3: 0.6, 5: 0.1}, calls)),
        lambda r: EarlyStopping("acc", patience=1),
    )
    run.trainer.train(0, 6)
    assert calls == [1, 3, 5]
    assert run.trainer.stop_reason is None and run.trainer.finished
