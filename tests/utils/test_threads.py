"""The CPU threads of a run: ``train.num_threads`` (a config job's
``default_setup``) and the plain ``Trainer``'s ``num_threads``. Each test
reads ``torch.get_num_threads()`` inside the run, from a hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from treadle.config import LazyConfig
from treadle.config.errors import ConfigError
from treadle.config.validation import check_run_config
from treadle.trainer import Trainer
from treadle.engine.defaults import DefaultTrainer, default_setup
from treadle.hooks import HookBase
from treadle.utils import threads

from tests.tiny_models import classification

ROOT = Path(__file__).resolve().parents[2]
CE = nn.functional.cross_entropy


class ThreadsSeen(HookBase):
    """Records torch's thread count before training and after each step."""

    def __init__(self) -> None:
        self.seen: list = []

    def before_train(self) -> None:
        self.seen.append(torch.get_num_threads())

    def after_step(self) -> None:
        self.seen.append(torch.get_num_threads())


def train_plain(**settings) -> list:
    hook = ThreadsSeen()
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(classification(64), batch_size=16),
                      loss_fn=CE, max_iter=3, progress_bar=False, hooks=[hook], **settings)
    trainer.train()
    return hook.seen


@pytest.fixture
def no_omp_env(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # As in a fresh process: the count now is the one treadle found at import.
    monkeypatch.setattr(threads, "_AT_IMPORT", torch.get_num_threads())
    monkeypatch.setattr(threads, "_SET_BY_TREADLE", None)


def test_the_trainer_trains_with_num_threads_and_puts_the_users_count_back(no_omp_env, treadle_caplog):
    before = torch.get_num_threads()
    assert train_plain(num_threads=3) == [3] * 4
    assert torch.get_num_threads() == before
    assert "CPU threads: 3 (num_threads=3)" in treadle_caplog.text


def test_auto_trains_on_one_cpu_thread(no_omp_env, treadle_caplog):
    threads._AT_IMPORT = 4  # a 4-core machine's default
    torch.set_num_threads(4)
    assert train_plain() == [1] * 4
    assert torch.get_num_threads() == 4
    assert "CPU threads: 1 (num_threads='auto': one on the CPU)" in treadle_caplog.text


def test_auto_keeps_a_count_the_user_set_with_torch(no_omp_env, treadle_caplog):
    threads._AT_IMPORT = 4
    torch.set_num_threads(3)
    assert train_plain() == [3] * 4
    assert "CPU threads: 3 (set by torch.set_num_threads; num_threads='auto' keeps it)" in treadle_caplog.text


def test_omp_num_threads_wins_and_the_log_says_so(monkeypatch, treadle_caplog):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)  # as torch took it from the environment at start
    assert train_plain(num_threads=1) == [3] * 4
    warnings = [r.getMessage() for r in treadle_caplog.records if r.levelname == "WARNING"]
    assert "num_threads=1 is not applied: OMP_NUM_THREADS=3 is set, and this run uses 3 CPU thread(s)" in warnings
    assert "CPU threads: 3 (OMP_NUM_THREADS=3 is set; it wins over num_threads=1)" in treadle_caplog.text


@pytest.mark.parametrize("value", [0, -2, "many", 1.5, True])
def test_a_bad_num_threads_is_refused_in_one_line(value):
    with pytest.raises(ValueError) as error:
        train_plain(num_threads=value)
    shown = repr(value) if isinstance(value, str) else str(value)
    assert str(error.value) == f"num_threads must be 'auto', None (torch's count) or an integer >= 1, got {shown}"


# ---------------------------------------------------------------------- the config job
def digits_cfg(tmp_path, *overrides):
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    return LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path}", "train.max_iter=2", "train.eval_period=0",
                                            "train.checkpointer.period=0", *overrides])


def train_job(cfg) -> list:
    default_setup(cfg)
    trainer = DefaultTrainer(cfg)
    hook = ThreadsSeen()
    trainer.register_hooks([hook])
    trainer.train()
    return hook.seen


def cpu_threads_row(log: str) -> str:
    return next(line for line in log.splitlines() if "CPU threads" in line).split("|")[2].strip()


def test_the_config_job_trains_with_train_num_threads_and_logs_it(tmp_path, no_omp_env):
    assert train_job(digits_cfg(tmp_path, "train.num_threads=3")) == [3] * 3
    assert cpu_threads_row((tmp_path / "log.txt").read_text()) == "3 (train.num_threads=3)"


def test_the_config_jobs_auto_is_one_thread_on_the_cpu(tmp_path, no_omp_env):
    threads._AT_IMPORT = 4
    torch.set_num_threads(4)
    assert train_job(digits_cfg(tmp_path, "train.device=cpu")) == [1] * 3
    assert cpu_threads_row((tmp_path / "log.txt").read_text()) == "1 (train.num_threads='auto': one on the CPU)"


def test_the_config_job_leaves_omp_num_threads_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    assert train_job(digits_cfg(tmp_path)) == [3] * 3
    row = cpu_threads_row((tmp_path / "log.txt").read_text())
    assert row == "3 (OMP_NUM_THREADS=3 is set; it wins over train.num_threads='auto')"


def test_a_bad_train_num_threads_is_refused_in_one_line(tmp_path):
    cfg = digits_cfg(tmp_path)
    OmegaConf.update(cfg, "train.num_threads", 0)
    message = "train.num_threads must be 'auto', None (torch's count) or an integer >= 1, got 0"
    with pytest.raises(ConfigError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        check_run_config(cfg)
    with pytest.raises(ConfigError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        default_setup(cfg)  # a script of the user's own that skips check_run_config
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []
