"""Ported code runs: a detectron2 training script and LiBai's documented
``tools/my_train_net.py``, changed only in their imports (``tests/ported/``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PORTED = ROOT / "tests" / "ported"
D2_SCRIPT = PORTED / "d2_lazyconfig_train_net.py"
D2_CONFIG = PORTED / "d2_digits_config.py"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _d2(out, *args, env=None, wait=True):
    cmd = [sys.executable, str(D2_SCRIPT), "--config-file", str(D2_CONFIG), f"train.output_dir={out}", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env or _env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    result = subprocess.run(cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _weights(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow
def test_detectron2_script_resumes_bit_exact_after_kill_9(tmp_path):
    reference = tmp_path / "reference"
    _d2(reference)
    # Killed while paused at iteration 25 (after the checkpoint of 19), then resumed.
    run, marker = tmp_path / "run", tmp_path / "paused"
    job = _d2(run, env=_env(D2_PAUSE_AT="25", D2_PAUSE_MARKER=str(marker)), wait=False)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.02)
        assert marker.exists(), job.stderr.read()[-3000:]
        job.kill()  # kill -9
        job.wait()
    finally:
        job.kill()
    assert (run / "last_checkpoint").read_text() == "model_0000019.pth"
    _d2(run, "--resume")
    final, expected = _weights(run / "model_final.pth"), _weights(reference / "model_final.pth")
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in final)
    lines = [json.loads(line) for line in (run / "metrics.json").read_text().splitlines()]
    assert [line["iteration"] for line in lines if "total_loss" in line] == [9, 19, 29, 39]  # each once
    assert (run / "log.txt").exists() and (run / "config.yaml").exists()


LIBAI_SCRIPT = '''
# tools/my_train_net.py, as LiBai's training documentation writes it, with
# treadle's module names.
import logging

from treadle.config import LazyConfig
from treadle.engine import DefaultTrainer, EagerStep, HookBase, default_argument_parser, default_setup, hooks
from treadle.utils import comm as dist


class myhook(HookBase):
    def after_step(self):
        self.trainer.storage.put_scalar("myhook_calls", 1.0, smoothing_hint=False)


class _mytrainer(EagerStep):
    """A replaced run_step: the usual step, counting its calls."""

    calls = 0

    def run_step(self):
        _mytrainer.calls += 1
        super().run_step()
        self.storage.put_scalar("mytrainer_calls", float(_mytrainer.calls), smoothing_hint=False)


class MyTrainer(DefaultTrainer):
    def __init__(self, cfg):
        super().__init__(cfg)

        # add your _trainer according to your own needs
        # NOTE: run_step() is overwrited in your _trainer
        self._trainer = _mytrainer(self.model, self.train_loader, self.optimizer, loss_fn=self.step.loss_fn)

    def build_hooks(self):
        ret = [
            hooks.IterationTimer(),
            hooks.LRScheduler(),
            hooks.PeriodicCheckpointer(self.checkpointer, self.cfg.train.checkpointer.period),
        ]
        # add your hook according to your own needs
        # NOTE: all hooks will be called sequentially
        ret.append(myhook())

        if dist.is_main_process():
            ret.append(hooks.PeriodicWriter(self.build_writers(), self.cfg.train.log_period))
        return ret


logger = logging.getLogger("libai." + __name__)


def main(args):
    cfg = LazyConfig.load(args.config_file)
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    default_setup(cfg, args)
    trainer = MyTrainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    main(args)
'''


def test_libai_my_train_net_runs(tmp_path):
    script = tmp_path / "my_train_net.py"
    script.write_text(LIBAI_SCRIPT)
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(script), f"train.output_dir={out}", "train.max_iter=30", "train.log_period=10",
         "train.checkpointer.period=10", "lr_multiplier.warmup_iters=5"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert [line["mytrainer_calls"] for line in lines if "mytrainer_calls" in line] == [10.0, 20.0, 30.0]
    assert all(line.get("myhook_calls") == 1.0 for line in lines if "total_loss" in line)
    lrs = [line["lr"] for line in lines if "lr" in line]
    assert len(set(lrs)) == 3 and max(lrs) < 0.05  # LRScheduler() ran the config's cosine schedule
    assert (out / "model_final.pth").exists() and (out / "model_0000019.pth").exists()
