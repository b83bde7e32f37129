"""detectron2's own engine unit tests, ported by renaming imports.

Each test here does what a test of detectron2's ``tests/test_engine.py``,
``test_events.py``, ``test_checkpoint.py``, ``test_scheduler.py``,
``test_solver.py`` or ``utils/test_tensorboardx.py`` does, written against
treadle's modules under detectron2's names (``detectron2.engine`` ->
``treadle.engine``, ``detectron2.utils.events`` -> ``treadle.events``,
``detectron2.checkpoint`` -> ``treadle.checkpoint``, ``detectron2.solver`` ->
``treadle.solver``). Where treadle deliberately differs (documented in
docs/migrating.md), the test asserts treadle's behaviour and says why.
Tests that need detectron2's yacs config, its datasets or its Caffe2 name
conversion are out of scope.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
from collections import OrderedDict
from unittest import mock

import numpy as np
import pytest
import torch
from fvcore.common.param_scheduler import (
    CosineParamScheduler,
    MultiStepParamScheduler,
    StepWithFixedGammaParamScheduler,
)
from iopath.common.file_io import PathHandler, PathManager
from torch import nn

from treadle.checkpoint import Checkpointer, DetectionCheckpointer
from treadle.engine import SimpleTrainer, hooks
from treadle.events import (
    CommonMetricPrinter,
    EventStorage,
    JSONWriter,
    TensorboardXWriter,
    get_event_storage,
    has_event_storage,
)
from treadle.solver import LRMultiplier, WarmupParamScheduler, reduce_param_groups


class _SimpleModel(nn.Module):
    """detectron2's test model: a dict with one loss from any batch tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.mod = nn.Linear(10, 20)

    def forward(self, x: torch.Tensor) -> dict:
        return {"loss": x.sum() + sum(p.mean() for p in self.parameters())}


def _data_loader():
    # An endless generator, as in detectron2's tests.
    generator = torch.Generator().manual_seed(0)
    while True:
        yield torch.rand(3, 3, generator=generator)


def _trainer(**kwargs) -> SimpleTrainer:
    model = _SimpleModel()
    return SimpleTrainer(model, _data_loader(), torch.optim.SGD(model.parameters(), 0.1), **kwargs)


@contextlib.contextmanager
def _captured(logger: logging.Logger):
    """The messages ``logger`` logs at INFO and above inside the block (unittest's assertLogs)."""
    records: list = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, level = Capture(level=logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _json_lines(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f]


# --- tests/test_engine.py ---------------------------------------------------------------------


def test_simple_trainer_trains_and_publishes_its_loss():
    trainer = _trainer()
    before = trainer.model.mod.weight.detach().clone()
    trainer.train(0, 10)
    assert trainer.iter == 10  # max_iter after a finished run, as in detectron2
    assert not torch.equal(before, trainer.model.mod.weight)
    assert [i for _, i in trainer.storage.history("total_loss").values()] == list(range(10))


def test_simple_trainer_reset_data_loader():
    trainer = _trainer()
    trainer.train(0, 10)
    marker = torch.full((3, 3), 7.0)

    def constant_loader():
        while True:
            yield marker

    trainer.reset_data_loader(constant_loader)
    trainer.train(0, 10)
    # loss = x.sum() + mean of parameters: the new loader's batches are the ones used.
    last_loss = trainer.storage.history("total_loss").latest()
    assert float(last_loss) == pytest.approx(63.0, abs=1.0)
    assert next(trainer._data_loader_iter) is marker


def test_writer_hooks_write_at_periods_the_last_iteration_and_the_final_evaluation(tmp_path):
    trainer = _trainer()
    max_iter = 50
    json_file = tmp_path / "metrics.json"
    writers = [CommonMetricPrinter(max_iter), JSONWriter(str(json_file))]
    trainer.register_hooks([hooks.EvalHook(0, lambda: {"metric": 100}), hooks.PeriodicWriter(writers)])

    with _captured(writers[0].logger) as records:
        trainer.train(0, max_iter)

    data = _json_lines(json_file)
    assert [x["iteration"] for x in data] == [19, 39, 49, 50]
    assert "metric" in data[-1], "the evaluation's metric is in the last line, at max_iter"
    # treadle's printer also prints the evaluation's results on a line of their own.
    assert records[-1] == "metrics after 50 iterations:  metric: 100"
    training_lines = records[:-1]
    assert len(training_lines) == 3
    for log, iteration in zip(training_lines, [19, 39, 49]):
        assert f"iter: {iteration}/50" in log
    assert "eta: 0:00:00" in training_lines[-1]


def test_gather_metric_period_is_accepted_and_every_iteration_is_recorded(tmp_path):
    # detectron2 reads losses on the host every gather_metric_period iterations and records
    # only those; treadle keeps every iteration's loss on the device and reads them once per
    # flush, so the history has all iterations and the JSON line is the median over the window.
    trainer = _trainer(gather_metric_period=5)
    json_file = tmp_path / "metrics.json"
    trainer.register_hooks(
        [hooks.IterationTimer(), hooks.PeriodicWriter([JSONWriter(str(json_file), window_size=10)], period=10)]
    )
    trainer.train(0, 50)

    data = _json_lines(json_file)
    assert [x["iteration"] for x in data] == [9, 19, 29, 39, 49]
    assert len(trainer.storage.history("time").values()) == 48  # the first 2 iterations are warmup
    history = trainer.storage.history("total_loss").values()
    assert [i for _, i in history] == list(range(50))
    for line, start in zip(data, range(0, 50, 10)):
        window = [float(v) for v, _ in history[start : start + 10]]
        assert line["total_loss"] == pytest.approx(statistics.median(window))


def test_async_write_metrics_is_accepted(tmp_path):
    trainer = _trainer(async_write_metrics=True)
    json_file = tmp_path / "metrics.json"
    trainer.register_hooks(
        [hooks.IterationTimer(), hooks.PeriodicWriter([JSONWriter(str(json_file), window_size=1)], period=1)]
    )
    trainer.train(0, 50)
    assert len(trainer.storage.history("time").values()) == 48
    for key in ["data_time", "total_loss"]:
        assert [i for _, i in trainer.storage.history(key).values()] == list(range(50))
    assert [x["iteration"] for x in _json_lines(json_file)] == list(range(50))


def test_checkpoint_resume_restores_the_scheduler_and_the_learning_rate(tmp_path):
    model = _SimpleModel()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 3)
    trainer = SimpleTrainer(model, _data_loader(), opt)
    checkpointer = Checkpointer(model, str(tmp_path), opt=opt, trainer=trainer)
    trainer.register_hooks(
        [hooks.LRScheduler(scheduler=scheduler), hooks.PeriodicCheckpointer(checkpointer, 10)]
    )
    trainer.train(0, 12)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5)
    assert scheduler.last_epoch == 12
    del trainer

    opt = torch.optim.SGD(model.parameters(), 999)  # the learning rate comes from the checkpoint
    trainer = SimpleTrainer(model, _data_loader(), opt)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 3)
    trainer.register_hooks([hooks.LRScheduler(scheduler=scheduler)])
    checkpointer = Checkpointer(model, str(tmp_path), opt=opt, trainer=trainer)
    checkpointer.resume_or_load("non_exist.pth")
    assert trainer.iter == 11  # the last finished iteration, 0-based
    assert scheduler.last_epoch == 12  # the number of scheduler.step() calls
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5)


@pytest.mark.parametrize("total_iter,period,eval_count", [(30, 15, 2), (31, 15, 3), (20, 0, 1)])
def test_eval_hook_runs_at_its_period_and_after_training(total_iter, period, eval_count):
    test_func = mock.Mock(return_value={"metric": 3.0})
    trainer = _trainer()
    trainer.register_hooks([hooks.EvalHook(period, test_func)])
    trainer.train(0, total_iter)
    assert test_func.call_count == eval_count


@pytest.mark.parametrize(
    "mode,values,saves",
    [
        ("max", [0.3, 0.4, 0.35, 0.5], 3),
        ("min", [1.0, 0.8, 0.9, 0.9], 2),
        ("min", [math.nan, 0.8, 0.9, 0.9], 1),
    ],
)
def test_best_checkpointer_saves_on_each_improvement(tmp_path, mode, values, saves):
    trainer = _trainer()
    metrics = iter(values)
    checkpointer = Checkpointer(trainer.model, str(tmp_path), opt=trainer.optimizer, trainer=trainer)
    trainer.register_hooks(
        [
            hooks.EvalHook(10, lambda: {"metric": next(metrics)}),
            hooks.BestCheckpointer(10, checkpointer, "metric", mode=mode),
        ]
    )
    with mock.patch.object(checkpointer, "save") as save:
        trainer.train(0, 40)
    assert save.call_count == saves


def test_default_trainer_style_model_property_follows_assignment():
    trainer = _trainer()
    assert trainer.model is trainer.step.model
    trainer.model = _SimpleModel()
    assert trainer.model is trainer.step.model


# --- tests/test_events.py ---------------------------------------------------------------------


def test_json_writer_writes_the_latest_scalar(tmp_path):
    json_file = tmp_path / "test.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(json_file))
        for k in range(60):
            storage.put_scalar("key", k, smoothing_hint=False)
            if (k + 1) % 20 == 0:
                writer.write()
            storage.step()
        writer.close()
    assert [int(x["key"]) for x in _json_lines(json_file)] == [19, 39, 59]


def test_json_writer_keeps_scalars_of_another_period_at_their_own_iteration(tmp_path):
    json_file = tmp_path / "test.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(json_file))
        for k in range(60):
            if k % 17 == 0:
                storage.put_scalar("key2", k, smoothing_hint=False)
            storage.put_scalar("key", k, smoothing_hint=False)
            if (k + 1) % 20 == 0:
                writer.write()
            storage.step()
        writer.close()
    data = _json_lines(json_file)
    assert [int(x.get("key2", 0)) for x in data] == [17, 0, 34, 0, 51, 0]
    assert [int(x.get("key", 0)) for x in data] == [0, 19, 0, 39, 0, 59]
    assert [int(x["iteration"]) for x in data] == [17, 19, 34, 39, 51, 59]


def _printed(printer: CommonMetricPrinter) -> str:
    with _captured(printer.logger) as records:
        printer.write()
    assert len(records) == 1
    return records[0]


def test_printer_shows_eta_only_with_max_iter():
    with EventStorage() as s:
        with_max_iter, without = CommonMetricPrinter(10), CommonMetricPrinter()
        for _ in range(2):
            s.put_scalar("time", 1.0)
            s.step()
        assert "eta" in _printed(with_max_iter)
        assert "eta" not in _printed(without)


def test_printer_shows_metric_scalars():
    with EventStorage() as s:
        with_max_iter, without = CommonMetricPrinter(10), CommonMetricPrinter()
        for _ in range(2):
            s.put_scalar("time", 1.0)
            s.put_scalar("[metric]bn_stat", 1.0)
            s.step()
        assert "[metric]bn_stat" in _printed(with_max_iter)
        assert "[metric]bn_stat" in _printed(without)


def test_printer_shows_losses_published_without_a_kind():
    # detectron2 models call storage.put_scalar("loss_cls", ...) with no kind.
    with EventStorage() as s:
        for _ in range(2):
            s.put_scalar("loss_cls", 0.25)
            s.put_scalar("loss_box_reg", 0.5)
            s.put_scalar("unrelated", 3.0)
            s.step()
        line = _printed(CommonMetricPrinter(10))
    assert "loss_cls: 0.25" in line and "loss_box_reg: 0.5" in line
    assert "unrelated" not in line


def test_smoothing_window_counts_iterations(tmp_path):
    json_file = tmp_path / "test.json"
    with EventStorage() as storage:
        writer = JSONWriter(str(json_file), window_size=10)
        for k in range(20):
            storage.put_scalar("key1", k, smoothing_hint=True)
            if (k + 1) % 2 == 0:
                storage.put_scalar("key2", k, smoothing_hint=True)
            if (k + 1) % 5 == 0:
                storage.put_scalar("key3", k, smoothing_hint=True)
            if (k + 1) % 10 == 0:
                writer.write()
            storage.step()
        samples = {k: storage.count_samples(k, 10) for k in ["key1", "key2", "key3"]}
        writer.close()
    assert samples == {"key1": 10, "key2": 5, "key3": 2}
    data = _json_lines(json_file)
    assert [x["key1"] for x in data] == [4.5, 14.5]
    assert [x["key2"] for x in data] == [5, 15]
    assert [x["key3"] for x in data] == [6.5, 16.5]


def test_event_storage_is_current_only_inside_its_context():
    assert not has_event_storage()
    with EventStorage() as storage:
        assert has_event_storage()
        assert get_event_storage() is storage
    assert not has_event_storage()


# --- tests/test_checkpoint.py -----------------------------------------------------------------


def _complex_model():
    m = nn.Module()
    m.block1 = nn.Module()
    m.block1.layer1 = nn.Linear(2, 3)
    m.layer2 = nn.Linear(3, 2)
    m.res = nn.Module()
    m.res.layer2 = nn.Linear(3, 2)
    # Names as a checkpoint from another code base has them: "block1." is missing.
    state_dict = OrderedDict()
    state_dict["layer1.weight"] = torch.rand(3, 2)
    state_dict["layer1.bias"] = torch.rand(3)
    state_dict["layer2.weight"] = torch.rand(2, 3)
    state_dict["layer2.bias"] = torch.rand(2)
    state_dict["res.layer2.weight"] = torch.rand(2, 3)
    state_dict["res.layer2.bias"] = torch.rand(2)
    return m, state_dict


def test_load_with_matching_heuristics(tmp_path):
    model, state_dict = _complex_model()
    torch.save({"model": state_dict}, tmp_path / "checkpoint.pth")
    checkpointer = DetectionCheckpointer(model, save_dir=str(tmp_path))
    with torch.no_grad():
        model.block1.layer1.weight.fill_(1)  # unlike any torch.rand value

    checkpointer.load(str(tmp_path / "checkpoint.pth"))
    assert torch.equal(model.block1.layer1.weight, torch.ones(3, 2))

    checkpointer.load(str(tmp_path / "checkpoint.pth?matching_heuristics=True"))
    assert torch.equal(model.block1.layer1.weight, state_dict["layer1.weight"])
    assert torch.equal(model.res.layer2.weight, state_dict["res.layer2.weight"])
    assert torch.equal(model.layer2.weight, state_dict["layer2.weight"])


def test_custom_path_manager_handler(tmp_path):
    class TestHandler(PathHandler):
        PREFIX = "treadle_test://"

        def _get_supported_prefixes(self):
            return [self.PREFIX]

        def _get_local_path(self, path, **kwargs):
            return os.path.join(str(tmp_path), path[len(self.PREFIX) :])

        def _open(self, path, mode="r", **kwargs):
            return open(self._get_local_path(path), mode, **kwargs)

    path_manager = PathManager()
    path_manager.register_handler(TestHandler())
    model, state_dict = _complex_model()
    torch.save({"model": state_dict}, tmp_path / "checkpoint.pth")
    checkpointer = DetectionCheckpointer(model, save_dir=str(tmp_path))
    checkpointer.path_manager = path_manager
    checkpointer.load("treadle_test://checkpoint.pth")
    assert torch.equal(model.layer2.weight, state_dict["layer2.weight"])
    checkpointer.load("treadle_test://checkpoint.pth?matching_heuristics=True")
    assert torch.equal(model.block1.layer1.weight, state_dict["layer1.weight"])


# --- tests/test_scheduler.py ------------------------------------------------------------------


def _stepped_lrs(multiplier, max_iter: int, steps: int) -> list:
    p = nn.Parameter(torch.zeros(0))
    opt = torch.optim.SGD([p], lr=5)
    sched = LRMultiplier(opt, multiplier, max_iter)
    p.sum().backward()
    opt.step()
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_warmup_multistep():
    multiplier = WarmupParamScheduler(
        MultiStepParamScheduler([1, 0.1, 0.01, 0.001], milestones=[10, 15, 20], num_updates=30), 0.001, 5 / 30
    )
    lrs = _stepped_lrs(multiplier, 30, 30)
    assert np.allclose(lrs[:5], [0.005, 1.004, 2.003, 3.002, 4.001])
    assert np.allclose(lrs[5:10], 5.0)
    assert np.allclose(lrs[10:15], 0.5)
    assert np.allclose(lrs[15:20], 0.05)
    assert np.allclose(lrs[20:], 0.005)


def test_warmup_cosine():
    lrs = _stepped_lrs(WarmupParamScheduler(CosineParamScheduler(1, 0), 0.001, 5 / 30), 30, 30)
    assert lrs[0] == 0.005
    for idx, lr in enumerate(lrs):
        expected = 2.5 * (1.0 + math.cos(math.pi * idx / 30))
        if idx >= 5:
            assert lr == pytest.approx(expected)
        else:
            assert lr != pytest.approx(expected)


def test_warmup_step_with_fixed_gamma_rescaled_interval():
    multiplier = WarmupParamScheduler(
        StepWithFixedGammaParamScheduler(base_value=1.0, gamma=0.1, num_decays=4, num_updates=30),
        0.001,
        5 / 30,
        rescale_interval=True,
    )
    p = nn.Parameter(torch.zeros(0))
    opt = torch.optim.SGD([p], lr=5)
    sched = LRMultiplier(opt, multiplier, 30)
    p.sum().backward()
    opt.step()
    lrs = [0.005]
    for _ in range(29):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert np.allclose(lrs[:5], [0.005, 1.004, 2.003, 3.002, 4.001])
    assert np.allclose(lrs[5:10], 5.0)
    assert np.allclose(lrs[10:15], 0.5)
    assert np.allclose(lrs[15:20], 0.05)
    assert np.allclose(lrs[20:25], 0.005)
    assert np.allclose(lrs[25:], 0.0005)
    # detectron2 raises IndexError on a step past the schedule; treadle holds the last value
    # (a step after the last iteration is what the LRScheduler hook does at the end).
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0005)


# --- tests/test_solver.py ---------------------------------------------------------------------


def test_expand_param_groups():
    # detectron2's import, renamed: its private name ports as it is written.
    from treadle.solver.build import _expand_param_groups, expand_param_groups

    params = [
        {"params": ["p1", "p2", "p3", "p4"], "lr": 1.0, "weight_decay": 3.0},
        {"params": ["p2", "p3", "p5"], "lr": 2.0, "momentum": 2.0},
        {"params": ["p1"], "weight_decay": 4.0},
    ]
    out = _expand_param_groups(params)
    assert out == [
        dict(params=["p1"], lr=1.0, weight_decay=4.0),
        dict(params=["p2"], lr=2.0, weight_decay=3.0, momentum=2.0),
        dict(params=["p3"], lr=2.0, weight_decay=3.0, momentum=2.0),
        dict(params=["p4"], lr=1.0, weight_decay=3.0),
        dict(params=["p5"], lr=2.0, momentum=2.0),
    ]
    assert expand_param_groups(params) == out


def test_reduce_param_groups():
    params = [
        dict(params=["p1"], lr=1.0, weight_decay=4.0),
        dict(params=["p2", "p6"], lr=2.0, weight_decay=3.0, momentum=2.0),
        dict(params=["p3"], lr=2.0, weight_decay=3.0, momentum=2.0),
        dict(params=["p4"], lr=1.0, weight_decay=3.0),
        dict(params=["p5"], lr=2.0, momentum=2.0),
    ]
    assert reduce_param_groups(params) == [
        {"lr": 1.0, "weight_decay": 4.0, "params": ["p1"]},
        {"lr": 2.0, "weight_decay": 3.0, "momentum": 2.0, "params": ["p2", "p6", "p3"]},
        {"lr": 1.0, "weight_decay": 3.0, "params": ["p4"]},
        {"lr": 2.0, "momentum": 2.0, "params": ["p5"]},
    ]


# --- tests/utils/test_tensorboardx.py ---------------------------------------------------------


def test_tensorboardx_writer_creates_no_file_until_it_writes(tmp_path):
    writer = TensorboardXWriter(str(tmp_path))
    writer.close()
    assert os.listdir(tmp_path) == []


def test_tensorboardx_writer_single_write(tmp_path):
    writer = TensorboardXWriter(str(tmp_path))
    writer._writer.add_scalar("testing", 1, 1)
    writer.close()
    assert os.listdir(tmp_path)
