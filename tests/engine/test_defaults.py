"""DefaultTrainer from a config, default_setup, and subclassing as in detectron2."""

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from treadle.config import LazyConfig
from treadle.engine.defaults import DefaultTrainer, default_argument_parser, default_setup
from treadle.hooks import (
    BestCheckpointer,
    EarlyStopping,
    EMA,
    EvalHook,
    IterationTimer,
    LRMonitor,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
    RunSummary,
    PreemptionHandler,
)

ROOT = Path(__file__).resolve().parents[2]


def digits_cfg(tmp_path, *overrides):
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    return LazyConfig.apply_overrides(
        cfg, [f"train.output_dir={tmp_path}", "train.max_iter=30", "lr_multiplier.warmup_iters=3", *overrides]
    )


def test_default_hooks_in_documented_order(tmp_path):
    cfg = digits_cfg(tmp_path, "train.ema.enabled=true", "train.early_stopping.metric=accuracy")
    trainer = DefaultTrainer(cfg)
    assert [type(h) for h in trainer.hooks] == [
        IterationTimer, LRScheduler, EMA, EvalHook, BestCheckpointer, EarlyStopping,
        PeriodicCheckpointer, PreemptionHandler, PeriodicWriter, RunSummary,
    ]
    decays = sorted({g["weight_decay"] for g in trainer.optimizer.param_groups})
    assert decays == [0.0, 1e-4]  # biases without weight decay


def test_a_config_without_lr_multiplier_publishes_the_rate_it_does_not_set(tmp_path):
    cfg = digits_cfg(tmp_path, "train.max_iter=6", "train.eval_period=0", "train.log_period=3")
    cfg.lr_multiplier = None
    trainer = DefaultTrainer(cfg)
    assert [type(h) for h in trainer.hooks][:2] == [IterationTimer, LRMonitor]
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [(r["iteration"], r["lr"]) for r in rows if "total_loss" in r] == [(2, 0.05), (5, 0.05)]


def test_default_setup_logs_and_seeds_but_writes_nothing_until_training_starts(tmp_path, treadle_caplog):
    cfg = digits_cfg(tmp_path, "train.seed=-1", "train.max_iter=4", "train.eval_period=0")
    default_setup(cfg)
    assert cfg.train.seed >= 0  # the picked seed is written back
    assert "Using a generated random seed" in treadle_caplog.text
    assert "PyTorch" in treadle_caplog.text  # the environment table
    trainer = DefaultTrainer(cfg)
    assert not tmp_path.exists() or os.listdir(tmp_path) == []  # built, checked: still nothing written
    trainer.train()
    saved = LazyConfig.load(str(tmp_path / "config.yaml"))
    assert saved.train.seed == cfg.train.seed and saved.train.max_iter == 4
    # The log starts with what was logged before the folder was claimed.
    log = (tmp_path / "log.txt").read_text()
    assert log.count("Environment info") == 1 and log.index("Environment info") < log.index("Starting training")


def test_subclass_overrides_builders(tmp_path):
    built = []

    class MyTrainer(DefaultTrainer):
        @classmethod
        def build_model(cls, cfg, device=None):
            built.append("model")
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(64, 10)).to(device)

        def build_hooks(self):
            hooks = super().build_hooks()
            return [h for h in hooks if not isinstance(h, EvalHook) and not isinstance(h, BestCheckpointer)]

    trainer = MyTrainer(digits_cfg(tmp_path, "train.eval_period=0"))
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert built == ["model"]
    assert not any(isinstance(h, EvalHook) for h in trainer.hooks)
    weights = torch.load(tmp_path / "model_final.pth", weights_only=True)["model"]
    assert set(weights) == {"0.weight", "0.bias"}
    results = MyTrainer.test(trainer.cfg, trainer.model)
    assert 0.0 <= results["accuracy"] <= 1.0


def test_init_checkpoint_loads_weights_only(tmp_path):
    first = DefaultTrainer(digits_cfg(tmp_path / "a", "train.eval_period=0"))
    first.train()
    cfg = digits_cfg(tmp_path / "b", f"train.init_checkpoint={tmp_path / 'a' / 'model_final.pth'}")
    second = DefaultTrainer(cfg)
    second.resume_or_load(resume=False)
    assert second.start_iter == 0
    for p, q in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(p, q)


def test_compiled_bf16_step_from_config(tmp_path):
    cfg = digits_cfg(tmp_path, "train.step.kind=compiled", "train.step.precision=bf16", "train.step.compile.backend=aot_eager", "train.eval_period=0", "train.max_iter=5")
    trainer = DefaultTrainer(cfg)
    from treadle.engine import CompiledStep

    assert isinstance(trainer.step, CompiledStep) and trainer.step.precision == "bf16"
    trainer.train()
    assert trainer.step.compiled


def test_argument_parser_defaults_and_intermixed_options():
    parser = default_argument_parser()
    args = parser.parse_intermixed_args(["train.max_iter=5", "--resume", "optimizer.lr=0.1"])
    assert args.resume and args.opts == ["train.max_iter=5", "optimizer.lr=0.1"]
    assert args.config_file.endswith("configs/digits_mlp.py") and Path(args.config_file).exists()
    assert (args.num_gpus, args.num_machines, args.machine_rank, args.dist_url) == (1, 1, 0, "auto")


def test_version_option_prints_treadle_and_its_version(capsys):
    import treadle

    with pytest.raises(SystemExit) as exit_info:
        default_argument_parser().parse_intermixed_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"treadle {treadle.__version__}\n"


def test_missing_or_null_ddp_section_means_defaults(tmp_path):
    from omegaconf import open_dict

    cfg = digits_cfg(tmp_path, "train.ddp=null")
    assert isinstance(DefaultTrainer(cfg).model, nn.Module)
    with open_dict(cfg.train):
        del cfg.train["ddp"]
    assert "ddp" not in cfg.train
    assert isinstance(DefaultTrainer(cfg).model, nn.Module)


def test_plain_dataloader_gives_the_epoch_length(tmp_path):
    from treadle.data.datasets import DigitsDataset

    class PlainLoaderTrainer(DefaultTrainer):
        @classmethod
        def build_train_loader(cls, cfg):
            return torch.utils.data.DataLoader(DigitsDataset(split="train"), batch_size=64)

    trainer = PlainLoaderTrainer(digits_cfg(tmp_path, "train.step.grad_accum_steps=2"))
    batches = len(trainer.train_loader)
    assert batches > 2
    assert trainer.epoch_length == batches // 2  # optimizer steps per pass, as Trainer counts them


def test_weight_decay_override_reaches_the_decayed_param_group():
    small = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    for name in ("digits_mlp.py", "charlm_transformer.py"):  # the SGD and AdamW presets
        cfg = LazyConfig.load(str(ROOT / "configs" / name))
        cfg = LazyConfig.apply_overrides(cfg, ["optimizer.weight_decay=0.5"])
        optimizer = DefaultTrainer.build_optimizer(cfg, small)
        decays = sorted(g["weight_decay"] for g in optimizer.param_groups)
        assert decays == [0.0, pytest.approx(0.5)], name


def test_charlm_corpus_overrides_reach_the_datasets_and_the_model():
    cfg = LazyConfig.load(str(ROOT / "configs" / "charlm_transformer.py"))
    cfg = LazyConfig.apply_overrides(cfg, ["corpus.seq_len=64", "corpus.max_chars=20000"])
    assert cfg.model.seq_len == 64
    for split in ("train", "test"):
        dataset = cfg.dataloader[split].dataset
        assert (dataset.seq_len, dataset.max_chars) == (64, 20000)


def test_a_hooks_own_logger_reaches_the_console_and_log_txt(tmp_path, capsys):
    """LiBai's hook example: ``logging.getLogger("libai." + __name__)`` at INFO."""
    import logging

    from treadle.engine import HookBase

    logger = logging.getLogger("libai." + __name__)

    class MyHook(HookBase):
        def before_train(self):
            logger.info(f"start training at {self.trainer.iter}")

        def after_step(self):
            if (self.trainer.iter + 1) % 2 == 0:
                logger.info(f"iteration {self.trainer.iter}!")

    class MyTrainer(DefaultTrainer):
        def build_hooks(self):
            return super().build_hooks() + [MyHook()]

    cfg = digits_cfg(tmp_path, "train.max_iter=4", "train.eval_period=0")
    default_setup(cfg)
    MyTrainer(cfg).train()
    lines = [f"libai.{__name__} INFO: {text}" for text in ("start training at 0", "iteration 1!", "iteration 3!")]
    out, log = capsys.readouterr().out, (tmp_path / "log.txt").read_text()
    assert all(line in out and line in log for line in lines), out


def test_libai_graph_enabled_builds_the_compiled_step(tmp_path):
    """LiBai: "the mode is determined by the graph.enabled parameter", read once treadle.compat is imported."""
    import treadle.compat  # noqa: F401  (registers LiBai's graph node)
    from treadle.engine import CompiledStep, EagerStep

    cfg = digits_cfg(tmp_path, "+graph.enabled=true", "train.step.compile.backend=aot_eager", "train.eval_period=0")
    assert isinstance(DefaultTrainer(cfg).step, CompiledStep)
    cfg.graph.enabled = False
    assert type(DefaultTrainer(cfg).step) is EagerStep
    # A step of one's own is not compiled: refused, also by a DefaultTrainer built without train_net's check.
    own = digits_cfg(tmp_path, "+graph.enabled=true", "train.eval_period=0")
    own.train.step = LazyConfig.load(str(ROOT / "configs" / "digits_sam.py")).train.step
    from treadle.config import ConfigError

    with pytest.raises(ConfigError, match=r"^graph.enabled=True compiles treadle's step, and train.step is a step"):
        DefaultTrainer(own)


def test_a_node_read_by_nothing_is_refused_by_a_default_trainer_and_left_to_a_subclass(tmp_path, monkeypatch):
    """Another trainer's node whose layer is not imported (LiBai's graph without treadle.compat) was silently
    unused by a DefaultTrainer built in a script; a subclass's own builders may read a node of their own."""
    from treadle.config import ConfigError, top_nodes

    monkeypatch.setattr(top_nodes, "OTHER_NODES", {})
    cfg = digits_cfg(tmp_path, "+graph.enabled=true", "train.eval_period=0")
    with pytest.raises(ConfigError, match="^The config's top-level node 'graph' is read by nothing: a job reads"):
        DefaultTrainer(cfg)
    assert list(tmp_path.iterdir()) == []  # refused before anything is written

    class ReadsItsOwnNode(DefaultTrainer):
        pass

    assert type(ReadsItsOwnNode(cfg).step).__name__ == "EagerStep"
