"""PeriodicCheckpointer, BestCheckpointer and EarlyStopping: which files, when, with what inside."""

import json
import logging
import math

import pytest
import torch
from torch import nn

from tests.hooks.helpers import crash_at, make_run, same, scripted_eval, stop_at
from treadle.events import JSONWriter
from treadle.hooks import (
    BestCheckpointer,
    CallbackHook,
    EarlyStopping,
    EvalHook,
    PeriodicCheckpointer,
    PeriodicWriter,
    PreemptionHandler,
)


def test_periodic_checkpoints_every_period_and_a_final_one(tmp_path):
    run = make_run(tmp_path, lambda r: PeriodicCheckpointer(r.checkpointer, period=3))
    run.trainer.train(0, 10)
    # 2, 5, 8; iteration 9 is the last one, saved as model_final only.
    assert run.files() == ["last_checkpoint", "model_0000002.pth", "model_0000005.pth", "model_0000008.pth", "model_final.pth"]
    assert run.pointer() == "model_final.pth"
    for it in (2, 5, 8):
        ckpt = run.load(f"model_{it:07d}.pth")
        assert ckpt["iteration"] == it == ckpt["trainer"]["iteration"]
        assert same(ckpt["model"], run.weights[it])
        assert ckpt["trainer"]["step"]["data"]["position"] == (it + 1) * 4
    final = run.load("model_final.pth")
    assert final["iteration"] == 9
    assert same(final["model"], run.weights[9])


def test_final_checkpoint_after_a_stop_request(tmp_path):
    run = make_run(tmp_path, lambda r: PeriodicCheckpointer(r.checkpointer, period=3), lambda r: stop_at(4))
    run.trainer.train(0, 100)
    assert run.files() == ["last_checkpoint", "model_0000002.pth", "model_final.pth"]
    final = run.load("model_final.pth")
    assert final["iteration"] == 4
    assert same(final["model"], run.weights[4])
    assert run.pointer() == "model_final.pth"


def test_no_final_checkpoint_after_an_exception(tmp_path):
    run = make_run(tmp_path, lambda r: PeriodicCheckpointer(r.checkpointer, period=3), lambda r: crash_at(4))
    with pytest.raises(RuntimeError, match="crash at 4"):
        run.trainer.train(0, 100)
    # The weights after 4 may come from a broken step: the resume point stays at 2.
    assert run.files() == ["last_checkpoint", "model_0000002.pth"]
    assert run.pointer() == "model_0000002.pth"


def test_max_to_keep_keeps_the_newest_periodic_files(tmp_path):
    run = make_run(tmp_path, lambda r: PeriodicCheckpointer(r.checkpointer, period=1, max_to_keep=2))
    run.trainer.train(0, 6)
    assert run.files() == ["last_checkpoint", "model_0000003.pth", "model_0000004.pth", "model_final.pth"]


def best_run(out, script, calls, mode="max", extra=()):
    return make_run(
        out,
        lambda r: EvalHook(2, scripted_eval(lambda: r.trainer, script, calls)),
        lambda r: BestCheckpointer(0, r.checkpointer, "acc", mode),
        lambda r: PeriodicCheckpointer(r.checkpointer, period=4),
        *extra,
    )


def test_best_checkpoint_holds_the_best_iteration_and_leaves_the_pointer(tmp_path, treadle_caplog):
    # Evaluations after iterations 1, 3, 5, 7 and the final one, in the last
    # iteration's after_step (9), its result put at 10 (iterations run).
    script = {1: 0.5, 3: 0.7, 5: 0.6, 7: math.nan, 9: 0.65}
    calls, pointers = [], {}
    # Read when the next iteration starts: checkpoints are taken when an iteration ends.
    record = lambda r: CallbackHook(  # noqa: E731
        before_step=lambda t: pointers.__setitem__(t.iter - 1, (tmp_path / "last_checkpoint").exists() and r.pointer())
    )
    run = best_run(tmp_path, script, calls, extra=[record])
    run.trainer.train(0, 10)

    assert calls == [1, 3, 5, 7, 9]
    best = run.load("model_best.pth")
    assert best["iteration"] == 3
    assert same(best["model"], run.weights[3])
    assert best["trainer"]["hooks"]["BestCheckpointer"] == {"best_metric": 0.7, "best_iter": 3}
    # model_best never became the resume point: no pointer until the periodic save at 3.
    assert pointers[1] is False
    assert pointers[3] == pointers[5] == "model_0000003.pth"
    assert pointers[7] == "model_0000007.pth"
    assert run.pointer() == "model_final.pth"
    warnings = [r.getMessage() for r in treadle_caplog.records if r.levelno == logging.WARNING]
    assert "BestCheckpointer: acc is NaN at iteration 7; ignored." in warnings


def test_best_from_the_final_evaluation_matches_model_final(tmp_path):
    script = {1: 3.0, 3: 2.0, 5: 2.5, 7: 2.2, 9: 1.0}
    run = best_run(tmp_path, script, [], mode="min")
    run.trainer.train(0, 10)
    best, final = run.load("model_best.pth"), run.load("model_final.pth")
    # The metric is put at 10 (iterations run); the state is that of the last iteration, 9.
    assert best["trainer"]["hooks"]["BestCheckpointer"] == {"best_metric": 1.0, "best_iter": 10}
    assert best["iteration"] == final["iteration"] == 9
    assert same(best["model"], final["model"])


def test_best_metric_survives_a_resume(tmp_path):
    script = {1: 0.5, 3: 0.7, 5: 0.6, 7: 0.8, 9: 0.75, 11: 0.1}
    best_iteration_at = {}
    watch = lambda r: CallbackHook(  # noqa: E731
        after_step=lambda t: best_iteration_at.__setitem__(t.iter, r.load("model_best.pth")["iteration"])
    )
    first = best_run(tmp_path, script, [], extra=[lambda r: crash_at(4)])
    with pytest.raises(RuntimeError, match="crash at 4"):
        first.trainer.train(0, 12)

    second = best_run(tmp_path, script, [], extra=[watch])
    best_hook = next(h for h in second.trainer.hooks if isinstance(h, BestCheckpointer))
    assert (best_hook.best_metric, best_hook.best_iter) == (None, None)
    start = second.resume()
    assert start == 4
    assert (best_hook.best_metric, best_hook.best_iter) == (0.7, 3)
    second.trainer.train(start, 12)
    # 0.6 at 5 is below the restored 0.7: no save; 0.8 at 7 is a new best.
    assert best_iteration_at[5] == 3
    assert best_iteration_at[7] == 7
    assert second.load("model_best.pth")["trainer"]["hooks"]["BestCheckpointer"] == {"best_metric": 0.8, "best_iter": 7}


def test_best_checkpointer_needs_an_eval_hook_before_it(tmp_path):
    run = make_run(tmp_path, lambda r: BestCheckpointer(0, r.checkpointer, "acc", "max"))
    with pytest.raises(ValueError, match=r"BestCheckpointer\('acc'\) needs an EvalHook registered before it"):
        run.trainer.train(0, 2)






def test_values_before_a_checkpoint_are_written_before_it(tmp_path):
    """A kill right after a save must not lose what came before it: the writers flush first."""
    metrics = tmp_path / "metrics.json"
    seen_at_save = {}

    def lines_now(trainer):
        # Checkpoints are taken when an iteration ends: look right after, as the next one starts.
        if trainer.iter in (4, 8):
            seen_at_save[trainer.iter - 1] = [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()]

    script = {3: 0.1, 7: 0.2, 9: 0.3}
    run = make_run(
        tmp_path,
        lambda r: EvalHook(4, scripted_eval(lambda: r.trainer, script, [])),
        lambda r: PeriodicCheckpointer(r.checkpointer, period=4),
        lambda r: CallbackHook(before_step=lines_now),  # before the writer's next flush
        lambda r: PeriodicWriter([JSONWriter(str(metrics), window_size=1)], period=10),
    )
    run.trainer.train(0, 10)
    # The writer's own period (10) would write line 9 only; the saves at 3 and 7
    # flushed first, so their iterations (with the evaluations) were on disk.
    assert seen_at_save == {3: [3], 7: [3, 7]}
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(line["iteration"], line.get("acc")) for line in lines] == [(3, 0.1), (7, 0.2), (9, None), (10, 0.3)]


def test_tensorboard_points_before_a_checkpoint_are_on_disk_before_it(tmp_path):
    """TensorboardWriter keeps rows between batches (flush_secs): a save
    flushes them first, so a kill -9 right after it loses none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from treadle.events import TensorboardWriter

    tb_dir = tmp_path / "tb"
    seen_at_save = {}

    def points_now(trainer):
        if trainer.iter in (4, 8):
            acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
            acc.Reload()
            seen_at_save[trainer.iter - 1] = [e.step for e in acc.Scalars("total_loss")]

    run = make_run(
        tmp_path,
        lambda r: PeriodicCheckpointer(r.checkpointer, period=4),
        lambda r: CallbackHook(before_step=points_now),
        # An hour between batches: only the first write and the saves reach the disk.
        lambda r: PeriodicWriter([TensorboardWriter(str(tb_dir), window_size=1, flush_secs=3600)], period=1),
    )
    run.trainer.train(0, 10)
    assert seen_at_save == {3: [0, 1, 2, 3], 7: list(range(8))}


def _loss_on(model, data):
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(data[0]), data[1]))


def test_best_checkpoint_under_ema_holds_the_weights_that_were_scored(tmp_path):
    """The evaluation runs on the EMA average, so model_best must hold the
    average: loading it reproduces the recorded best loss."""
    from treadle.hooks import EMA

    g = torch.Generator().manual_seed(5)
    val = (torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g))
    scores = {}
    run = make_run(
        tmp_path,
        lambda r: EMA(0.9),
        lambda r: EvalHook(2, lambda: scores.setdefault(r.trainer.iter, {"loss": _loss_on(r.model, val)})),
        lambda r: BestCheckpointer(2, r.checkpointer, "loss"),  # mode inferred: min
    )
    run.trainer.train(0, 12)
    best = run.load("model_best.pth")
    recorded = best["trainer"]["hooks"]["BestCheckpointer"]["best_metric"]
    assert recorded == min(s["loss"] for s in scores.values())
    assert best["weights"] == "ema"
    fresh = nn.Linear(3, 1)
    fresh.load_state_dict(best["model"])
    assert _loss_on(fresh, val) == pytest.approx(recorded, rel=1e-6)
    assert not same(best["model"], run.weights[best["iteration"]])  # not the live weights


@pytest.mark.parametrize(
    "metric,expected", [("loss", "min"), ("val/loss", "min"), ("cer", "min"), ("wer", "min"), ("perplexity", "min"),
                        ("mse", "min"), ("top1_error", "min"), ("accuracy", "max"), ("f1", "max"), ("auc", "max")]
)
def test_mode_follows_the_metric(metric, expected):
    assert BestCheckpointer(0, None, metric).mode == expected
    assert EarlyStopping(metric, patience=2).mode == expected
    assert BestCheckpointer(0, None, metric, "max").mode == "max"  # given: kept


def test_best_loss_keeps_the_lowest(tmp_path):
    script = {1: 3.0, 3: 2.0, 5: 2.5, 7: 2.2, 9: 2.9}
    calls = []
    run = make_run(
        tmp_path,
        lambda r: EvalHook(2, scripted_eval(lambda: r.trainer, script, calls, name="loss")),
        lambda r: BestCheckpointer(0, r.checkpointer, "loss"),
    )
    run.trainer.train(0, 10)
    assert run.load("model_best.pth")["iteration"] == 3


def test_registered_metric_declares_its_direction():
    from treadle.evaluation import metric_mode, register_metric, unregister_metric
    from treadle.evaluation.classification import ClassificationEvaluator

    register_metric("distortion_score", lambda: ClassificationEvaluator(), higher_is_better=True)
    try:
        assert metric_mode("distortion_score") == "max"  # the name alone would say "min"
    finally:
        unregister_metric("distortion_score")


def test_detectron2_argument_order_is_enforced():
    with pytest.raises(TypeError, match="takes the metric third"):
        BestCheckpointer("accuracy", None, "max")


@pytest.mark.parametrize(
    "order",
    [
        ("checkpointer", "scheduler", "ema", "preemption"),  # the checkpointer before what it saves
        ("scheduler", "ema", "checkpointer", "preemption"),
        ("preemption", "ema", "checkpointer", "scheduler"),
    ],
)
def test_any_registration_order_resumes_exactly(tmp_path, order):
    """The periodic checkpoint is taken when the iteration ends, after every
    hook's after_step: registered first, it still saves the scheduler's and the
    EMA's state of its iteration, and the resumed run ends equal."""
    from treadle.hooks import EMA, LRScheduler

    def make(out, *extra):
        factories = {
            "checkpointer": lambda r: PeriodicCheckpointer(r.checkpointer, 4),
            "scheduler": lambda r: LRScheduler(r.optimizer, torch.optim.lr_scheduler.StepLR(r.optimizer, 3, 0.5)),
            "ema": lambda r: EMA(0.8),
            "preemption": lambda r: PreemptionHandler(r.checkpointer, exit_code=None),
        }
        return make_run(out, *[factories[name] for name in order], *extra)

    straight = make(tmp_path / "straight")
    straight.trainer.train(0, 12)
    crashed = make(tmp_path / "crashed", lambda r: crash_at(9))
    with pytest.raises(RuntimeError):
        crashed.trainer.train(0, 12)
    assert crashed.pointer() == "model_0000007.pth"
    resumed = make(tmp_path / "crashed")
    resumed.trainer.train(resumed.resume(), 12)
    assert same(resumed.model.state_dict(), straight.model.state_dict())
    ema = lambda run: next(h for h in run.trainer.hooks if type(h).__name__ == "EMA").averaged_state_dict()  # noqa: E731
    assert same(ema(resumed), ema(straight))
    assert resumed.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]


def test_detectron2s_standard_hook_order_is_accepted(tmp_path):
    """detectron2's tools/lazyconfig_train_net.py order: IterationTimer, LRScheduler,
    PreciseBN, PeriodicCheckpointer, EvalHook, PeriodicWriter."""
    from treadle.hooks import IterationTimer, LRScheduler, PreciseBN

    run = make_run(
        tmp_path,
        lambda r: IterationTimer(),
        lambda r: LRScheduler(r.optimizer, torch.optim.lr_scheduler.StepLR(r.optimizer, 3)),
        lambda r: PreciseBN(4, r.model, r.loader, 2),
        lambda r: PeriodicCheckpointer(r.checkpointer, 4),
        lambda r: EvalHook(4, lambda: {"acc": 1.0}),
        lambda r: PeriodicWriter([JSONWriter(str(tmp_path / "metrics.json"))], 4),
    )
    run.trainer.train(0, 8)
    assert run.files() == ["last_checkpoint", "metrics.json", "model_0000003.pth", "model_final.pth"]


def test_an_order_no_design_can_serve_is_refused_with_the_reason(tmp_path):
    from treadle.engine import HookOrderError
    from treadle.hooks import EMA

    with pytest.raises(HookOrderError, match="EvalHook must be registered after EMA: it evaluates the averaged weights"):
        make_run(tmp_path, lambda r: EvalHook(4, lambda: {}), lambda r: EMA(0.9))
