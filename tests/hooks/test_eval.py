import itertools
import json
import os
import shutil
import tempfile

import pytest
import torch
from iopath.common.file_io import PathHandler
from torch import nn

from treadle.engine import EagerStep, HookOrderError, TrainerBase
from treadle.events import JSONWriter
from treadle.hooks import (
    EMA,
    CallbackHook,
    EvalHook,
    PeriodicWriter,
    PreciseBN,
    TorchMemoryStats,
    TorchProfiler,
)
from treadle.utils.file_io import PathManager


def make_trainer(model=None, lr=0.1):
    torch.manual_seed(0)
    model = model or nn.Linear(3, 1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return TrainerBase(EagerStep(model, itertools.cycle(data), opt, loss_fn=nn.functional.mse_loss)), model


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


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
    # Every 5 iterations (4, 9, ..., 39) and once after training (42 iterations run).
    assert evals == [(i, pytest.approx(i / 100)) for i in range(4, 40, 5)] + [(42, pytest.approx(0.42))]
    assert calls == list(range(4, 40, 5)) + [42]
    assert [line["iteration"] for line in lines if "total_loss" in line] == [19, 39, 41]
    assert trainer.storage.kind("val/n") == "metric"


def test_eval_at_the_last_iteration_runs_once_and_not_after_an_error():
    trainer, _ = make_trainer()
    calls = []
    trainer.register_hooks([EvalHook(5, lambda: calls.append(trainer.iter) or {"a": 1.0})])
    trainer.train(0, 10)
    assert calls == [4, 10]

    failing, _ = make_trainer()
    calls.clear()
    boom = CallbackHook(after_step=lambda t: (_ for _ in ()).throw(RuntimeError("x")) if t.iter == 6 else None)
    failing.register_hooks([EvalHook(5, lambda: calls.append(failing.iter) or {"a": 1.0}), boom])
    with pytest.raises(RuntimeError):
        failing.train(0, 10)
    assert calls == [4]  # no final evaluation of a failed run


def test_eval_results_must_be_numbers():
    trainer, _ = make_trainer()
    trainer.register_hooks([EvalHook(0, lambda: {"acc": "high"})])
    with pytest.raises(TypeError, match="'acc' is a str"):
        trainer.train(0, 2)


def test_ema_matches_a_hand_computation_and_swaps_weights_for_evaluation():
    model = nn.Linear(3, 1)
    trainer, _ = make_trainer(model)
    history = []
    ema = EMA(0.5)
    seen_in_eval = []
    trainer.register_hooks(
        [
            CallbackHook(after_step=lambda t: history.append({k: v.clone() for k, v in model.state_dict().items()})),
            ema,
            EvalHook(0, lambda: seen_in_eval.append(model.weight.detach().clone()) or {"x": 0.0}),
        ]
    )
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train(0, 4)
    expected = initial["weight"]
    for state in history:
        expected = 0.5 * expected + 0.5 * state["weight"]
    torch.testing.assert_close(ema.averaged_state_dict()["weight"], expected)
    torch.testing.assert_close(seen_in_eval[0], expected)  # evaluation saw the average
    assert torch.equal(model.weight, history[-1]["weight"])  # and the trained weights came back
    assert ema.num_updates == 4


def test_ema_state_round_trip_and_warmup():
    model = nn.Linear(2, 1)
    ema = EMA(0.99, model=model, warmup=True)
    assert ema._current_decay() == pytest.approx(0.1)
    ema.update()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update()
    state = ema.state_dict()
    other = EMA(0.99, model=model, warmup=True)
    other.load_state_dict(state)
    assert other.num_updates == 2
    torch.testing.assert_close(other.averaged_state_dict()["weight"], ema.averaged_state_dict()["weight"])
    with pytest.raises(ValueError, match="decay must be in"):
        EMA(1.0)


def test_averaged_weights_restores_trained_weights_after_an_exception():
    model = nn.Linear(2, 1)
    ema = EMA(0.5, model=model)
    ema.update()
    with torch.no_grad():
        model.weight.fill_(3.0)
    with pytest.raises(ValueError):
        with ema.averaged_weights():
            assert not torch.all(model.weight == 3.0)
            raise ValueError
    assert torch.all(model.weight == 3.0)


def test_wrong_order_of_evaluation_hooks_is_reported():
    trainer, model = make_trainer()
    with pytest.raises(HookOrderError, match="EvalHook must be registered after EMA"):
        trainer.register_hooks([EvalHook(5, dict), EMA(0.9)])


def test_profiler_writes_a_trace_per_profiled_iteration(tmp_path):
    trainer, _ = make_trainer()
    profiler = TorchProfiler(lambda t: t.iter in (2, 3), str(tmp_path / "traces"))
    trainer.register_hooks([profiler])
    trainer.train(0, 5)
    names = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert names == ["profiler-trace-iter2.json", "profiler-trace-iter3.json"]
    trace = json.loads((tmp_path / "traces" / names[0]).read_text())
    assert any("aten::" in event.get("name", "") for event in trace["traceEvents"])


class _RemoteStore(PathHandler):
    """A non-local iopath backend (like s3://) storing under ``root``; like
    remote backends, get_local_path hands out a download cache, not the store."""

    PREFIX = "treadle-test-profiler://"

    def __init__(self, root, cache):
        super().__init__()
        self.root, self.cache = root, cache

    def _get_supported_prefixes(self):
        return [self.PREFIX]

    def _stored(self, path):
        return os.path.join(self.root, path[len(self.PREFIX):])

    def _get_local_path(self, path, force=False, **kwargs):
        return os.path.join(self.cache, os.path.basename(path))

    def _copy_from_local(self, local_path, dst_path, overwrite=False, **kwargs):
        shutil.copyfile(local_path, self._stored(dst_path))
        return True

    def _mkdirs(self, path, **kwargs):
        os.makedirs(self._stored(path), exist_ok=True)


def test_profiler_uploads_traces_to_a_remote_output_dir(tmp_path, monkeypatch):
    store, cache, scratch = tmp_path / "store", tmp_path / "cache", tmp_path / "scratch"
    for d in (store, cache, scratch):
        d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    PathManager.register_handler(_RemoteStore(str(store), str(cache)), allow_override=True)
    try:
        trainer, _ = make_trainer()
        profiler = TorchProfiler(lambda t: t.iter == 2, _RemoteStore.PREFIX + "traces")
        trainer.register_hooks([profiler])
        trainer.train(0, 4)
    finally:
        # iopath has no public way to unregister a handler.
        PathManager._path_handlers.pop(_RemoteStore.PREFIX, None)
    assert profiler.trace_files == [_RemoteStore.PREFIX + "traces/profiler-trace-iter2.json"]
    trace = json.loads((store / "traces" / "profiler-trace-iter2.json").read_text())
    assert any("aten::" in event.get("name", "") for event in trace["traceEvents"])
    assert not os.listdir(cache) and not os.listdir(scratch)  # nothing left behind locally


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU no-op")
def test_memory_stats_is_a_no_op_with_one_info_line_on_cpu(treadle_caplog):
    trainer, _ = make_trainer()
    trainer.register_hooks([TorchMemoryStats(period=1)])
    trainer.train(0, 3)
    assert treadle_caplog.text.count("TorchMemoryStats does nothing: CUDA is not available") == 1


def test_precise_bn_recomputes_true_statistics_before_evaluation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    trainer, _ = make_trainer(model)
    bn_data = [(torch.randn(16, 3) * 2 + 1, None) for _ in range(5)]
    seen = []
    trainer.register_hooks(
        [
            PreciseBN(0, model, bn_data, num_iter=5),
            EvalHook(0, lambda: seen.append(model[1].running_mean.clone()) or {"x": 0.0}),
        ]
    )
    trainer.train(0, 3)
    with torch.no_grad():
        feats = torch.cat([model[0](x) for x, _ in bn_data])
    torch.testing.assert_close(seen[0], feats.mean(0), rtol=1e-4, atol=1e-5)
    assert model.training  # the training mode was restored


def test_no_final_evaluation_after_an_interrupted_stop_but_one_after_early_stop():
    for interrupted, expected in ((True, [4]), (False, [4, 7])):
        trainer, _ = make_trainer()
        calls = []
        stop = CallbackHook(after_step=lambda t, cut=interrupted: t.request_stop("cut", interrupted=cut) if t.iter == 6 else None)
        trainer.register_hooks([EvalHook(5, lambda calls=calls, t=trainer: calls.append(t.iter) or {"a": 1.0}), stop])
        trainer.train(0, 20)
        assert calls == expected, interrupted
        assert trainer.interrupted is interrupted


def _bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


def test_precise_bn_keeps_the_buffer_tensors_it_updates():
    """fvcore assigns new statistics tensors; whoever holds the old ones
    (EMA's buffer pairs) would keep stale statistics."""
    model = _bn_model()
    trainer, _ = make_trainer(model)
    running_mean = model[1].running_mean
    bn_data = [(torch.randn(16, 3) * 2 + 1, None) for _ in range(5)]
    trainer.register_hooks([PreciseBN(0, model, bn_data, num_iter=5), EvalHook(0, lambda: {"x": 0.0})])
    trainer.train(0, 3)
    assert model[1].running_mean is running_mean
    with torch.no_grad():
        feats = torch.cat([model[0](x) for x, _ in bn_data])
    torch.testing.assert_close(running_mean, feats.mean(0), rtol=1e-4, atol=1e-5)


def test_precise_bn_with_ema_recomputes_the_statistics_of_the_averaged_weights():
    model = _bn_model()
    trainer, _ = make_trainer(model)
    bn_data = [(torch.randn(16, 3) * 2 + 1, None) for _ in range(5)]
    ema = EMA(0.5, model=model)
    seen = []

    def evaluate():
        # Inside the EMA swap: the weights and statistics being evaluated.
        with torch.no_grad():
            feats = torch.cat([model[0](x) for x, _ in bn_data])
        seen.append((model[1].running_mean.clone(), feats.mean(0)))
        return {"x": 0.0}

    trainer.register_hooks([ema, PreciseBN(2, model, bn_data, num_iter=5), EvalHook(2, evaluate)])
    trainer.train(0, 6)
    assert len(seen) == 3  # iterations 1, 3 and the final one
    for used, true_mean in seen:
        torch.testing.assert_close(used, true_mean, rtol=1e-4, atol=1e-5)
    assert model.training


def test_precise_bn_runs_after_ema():
    model = _bn_model()
    trainer, _ = make_trainer(model)
    with pytest.raises(HookOrderError, match="PreciseBN must be registered after EMA"):
        trainer.register_hooks([PreciseBN(2, model, [], num_iter=5), EMA(0.5, model=model)])
