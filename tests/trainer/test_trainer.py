"""The plain-object Trainer."""

import json
import math

import pytest
import torch
from fvcore.common.param_scheduler import LinearParamScheduler
from torch import nn

from treadle.engine import CompiledStep, TrainingHistory
from treadle.trainer import Trainer


def problem(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    return torch.utils.data.TensorDataset(x, y)


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def loader(ds, batch=32):
    return torch.utils.data.DataLoader(ds, batch_size=batch)


def test_epochs_history_and_evaluation(tmp_path):
    train_set, val_set = problem(256), problem(128, seed=1)
    trainer = Trainer(
        model(), "adamw", train_set, batch_size=32, lr=1e-2, loss_fn=nn.functional.cross_entropy,
        eval_loader=loader(val_set), metrics=["accuracy", "loss"], max_epochs=4, seed=0, output_dir=str(tmp_path),
        progress_bar=False,
    )
    assert trainer.epoch_length == 8 and trainer.max_iter == 32
    history = trainer.train()
    assert isinstance(history, TrainingHistory)
    assert [e["epoch"] for e in history.epochs] == [0, 1, 2, 3]
    assert [e["iteration"] for e in history.epochs] == [7, 15, 23, 31]
    assert all({"total_loss", "accuracy", "loss", "lr"} <= set(e) for e in history.epochs)
    assert history.epochs[-1]["accuracy"] > 0.85
    assert history.epochs[-1]["total_loss"] < history.epochs[0]["total_loss"]
    assert len(history["total_loss"]) == 32  # every iteration
    assert [it for it, _ in history.iterations["accuracy"]] == [7, 15, 23, 32]
    lines = [json.loads(x) for x in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [x["iteration"] for x in lines if "accuracy" in x] == [7, 15, 23, 32]
    assert sorted(p.name for p in tmp_path.glob("model_*.pth")) == ["model_0000015.pth", "model_0000023.pth", "model_final.pth"] or (tmp_path / "model_final.pth").exists()
    assert trainer.evaluate()["accuracy"] == pytest.approx(history.epochs[-1]["accuracy"])


def test_optimizer_by_name_has_no_decay_on_biases():
    trainer = Trainer(model(), "adamw", loader(problem()), lr=1e-3, weight_decay=0.1, loss_fn=nn.functional.cross_entropy, max_iter=1, progress_bar=False)
    decays = sorted(g["weight_decay"] for g in trainer.optimizer.param_groups)
    assert decays == [0.0, 0.1]
    with pytest.raises(ValueError, match="Unknown optimizer 'lion'"):
        Trainer(model(), "lion", loader(problem()), lr=1e-3, max_iter=1)
    with pytest.raises(ValueError, match="needs a learning rate"):
        Trainer(model(), "sgd", loader(problem()), max_iter=1)


@pytest.mark.parametrize(
    "scheduler, expected_last",
    [
        ("linear", 0.1 * 1 / 8),
        (lambda opt, max_iter: torch.optim.lr_scheduler.StepLR(opt, step_size=max_iter // 2, gamma=0.5), 0.05),
        (LinearParamScheduler(1.0, 0.0), 0.1 * 1 / 8),
        ("constant", 0.1),
    ],
    ids=["name", "factory", "param-scheduler", "constant"],
)
def test_scheduler_forms(scheduler, expected_last):
    m = model()
    trainer = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), loader(problem()), loss_fn=nn.functional.cross_entropy, max_epochs=1, scheduler=scheduler, progress_bar=False)
    history = trainer.train()
    assert history["lr"][0] == pytest.approx(0.1)
    assert history["lr"][-1] == pytest.approx(expected_last)


def test_warmup_longer_than_the_run_is_clipped_with_one_warning_naming_the_argument(treadle_caplog):
    m = model()
    trainer = Trainer(
        m, torch.optim.SGD(m.parameters(), lr=0.1), loader(problem()), loss_fn=nn.functional.cross_entropy,
        max_epochs=1, scheduler="cosine", warmup_iters=100, progress_bar=False,
    )
    history = trainer.train()
    assert trainer.max_iter == 8
    warnings = [r.getMessage() for r in treadle_caplog.records if "warmup_iters" in r.getMessage()]
    assert warnings == [
        "warmup_iters=100 is not shorter than the run (max_iter=8): warming up over 4 iterations, half the run, instead."
    ]
    # Hugging Face's warm-up (as get_cosine_schedule_with_warmup): a ramp over
    # iterations 0-3 from 0, the full rate at 4, then the cosine over the rest.
    expected = [0.1 * i / 4 for i in range(4)] + [0.1 * 0.5 * (1 + math.cos(math.pi * i / 4)) for i in range(4)]
    assert history["lr"] == pytest.approx(expected, rel=0, abs=1e-12)
    assert max(history["lr"]) == history["lr"][4] == pytest.approx(0.1)


def test_bad_run_lengths_and_inputs():
    ds = problem()
    with pytest.raises(ValueError, match="Give max_iter or max_epochs"):
        Trainer(model(), "sgd", loader(ds), lr=0.1)
    # Both: whichever comes first.
    assert Trainer(model(), "sgd", loader(ds), lr=0.1, max_iter=3, max_epochs=1).max_iter == 3
    assert Trainer(model(), "sgd", loader(ds), lr=0.1, max_iter=10_000, max_epochs=1).max_iter == len(loader(ds))
    with pytest.raises(ValueError, match="batch_size"):
        Trainer(model(), "sgd", ds, lr=0.1, max_iter=3)
    gen = (b for b in loader(ds))
    with pytest.raises(ValueError, match="max_epochs needs data with a length"):
        Trainer(model(), "sgd", gen, lr=0.1, max_epochs=1)
    with pytest.raises(PermissionError, match="cannot be written"):
        blocker = __import__("tempfile").NamedTemporaryFile()
        Trainer(model(), "sgd", loader(ds), lr=0.1, max_iter=1, output_dir=blocker.name + "/out")


def test_resume_is_exact(tmp_path):
    ds = problem(512)

    def make(out, max_iter):
        m = model(3)
        return Trainer(m, "sgd", ds, batch_size=32, lr=0.05, loss_fn=nn.functional.cross_entropy, max_iter=max_iter,
                       scheduler="cosine", seed=7, output_dir=str(out), checkpoint_period=5, progress_bar=False)

    straight = make(tmp_path / "a", 20)
    straight.train()
    interrupted = make(tmp_path / "b", 20)
    interrupted.register_hooks([__import__("treadle.hooks", fromlist=["CallbackHook"]).CallbackHook(
        after_step=lambda t: t.request_stop("test") if t.iter == 12 else None)])
    interrupted.train()
    resumed = make(tmp_path / "b", 20)
    resumed.train(resume=True)
    assert resumed.start_iter == 13
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)


def test_compile_uses_compiled_step_and_model_loss_contract():
    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model()

        def forward(self, batch):
            x, y = batch
            return {"ce": nn.functional.cross_entropy(self.net(x), y)}

    trainer = Trainer(WithLoss(), "adam", loader(problem()), lr=1e-2, max_iter=4, compile={"backend": "aot_eager"}, progress_bar=False)
    assert isinstance(trainer.step, CompiledStep)
    history = trainer.train()
    assert set(history.iterations) >= {"ce", "total_loss"}


def test_ema_weights_survive_resume_exactly(tmp_path):
    from treadle.hooks import EMA, CallbackHook

    ds = problem(512)

    def make(out):
        return Trainer(model(5), "sgd", ds, batch_size=32, lr=0.05, loss_fn=nn.functional.cross_entropy, max_iter=16,
                       seed=3, output_dir=str(out), checkpoint_period=4, ema_decay=0.9, progress_bar=False)

    def ema_of(trainer):
        return next(h for h in trainer.hooks if isinstance(h, EMA))

    straight = make(tmp_path / "a")
    straight.train()
    first = make(tmp_path / "b")
    first.register_hooks([CallbackHook(after_step=lambda t: t.request_stop("cut") if t.iter == 9 else None)])
    first.train()
    resumed = make(tmp_path / "b")
    resumed.train(resume=True)
    expected, got = ema_of(straight).averaged_state_dict(), ema_of(resumed).averaged_state_dict()
    assert ema_of(resumed).num_updates == 16
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_scheduler_factory_gets_max_iter_only_in_a_required_slot():
    import functools

    from torch.optim.lr_scheduler import CosineAnnealingLR, ExponentialLR

    from treadle.engine import resolve_scheduler

    def opt():
        return torch.optim.SGD(model().parameters(), lr=0.1)

    # Options bound by partial or given defaults are kept, not overwritten by max_iter.
    assert resolve_scheduler(functools.partial(CosineAnnealingLR, T_max=100), opt(), 40).T_max == 100
    assert resolve_scheduler(lambda o, gamma=0.9: ExponentialLR(o, gamma), opt(), 40).gamma == 0.9
    # Two required parameters still receive (optimizer, max_iter).
    assert resolve_scheduler(lambda o, n: CosineAnnealingLR(o, T_max=n), opt(), 40).T_max == 40
    assert resolve_scheduler(CosineAnnealingLR, opt(), 40).T_max == 40


def test_rmsnorm_scale_has_no_weight_decay():
    from treadle.engine import get_param_groups

    norm = nn.RMSNorm(16)
    net = nn.Sequential(nn.Linear(6, 16, bias=False), norm)
    groups = get_param_groups(net, weight_decay=0.1)
    no_decay = [p for g in groups if g["weight_decay"] == 0.0 for p in g["params"]]
    assert any(p is norm.weight for p in no_decay)
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.1]


def test_a_hooks_own_logger_reaches_the_console_and_log_txt(tmp_path, capsys):
    """Any logger name at INFO, in the main process: LiBai's ``"libai." + __name__``."""
    import logging

    from treadle.hooks import HookBase

    class MyHook(HookBase):
        def after_train(self):
            logging.getLogger("libai.myhook").info(f"end training at {self.trainer.iter}")

    Trainer(model(), "sgd", problem(64), batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=2,
            output_dir=str(tmp_path), progress_bar=False, hooks=[MyHook()]).train()
    out, log = capsys.readouterr().out, (tmp_path / "log.txt").read_text()
    assert "libai.myhook INFO: end training at 2" in out, out
    assert "libai.myhook INFO: end training at 2" in log


def _failing_batches():
    yield torch.randn(32, 6), torch.randint(0, 2, (32,))
    raise RuntimeError("the first run's data broke")


def test_a_runs_log_txt_holds_that_run_only_after_a_failed_run_without_output_dir(tmp_path):
    """A Trainer without ``output_dir`` fails, a second with it finishes: its log.txt is its own."""
    first = Trainer(model(), "sgd", _failing_batches(), lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=4,
                    progress_bar=False)
    with pytest.raises(RuntimeError, match="the first run's data broke"):
        first.train()
    second = Trainer(model(), "sgd", problem(64), batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy,
                     max_iter=2, output_dir=str(tmp_path), progress_bar=False)
    second.train()
    log = (tmp_path / "log.txt").read_text()
    assert "the first run's data broke" not in log and "Exception during training" not in log
    assert "Traceback" not in log
    assert log.splitlines()[0].endswith("INFO: Optimizer 'sgd': torch.optim.SGD(lr=0.1, weight_decay=0.0), "
                                        "torch's defaults for the rest")


def test_a_runs_log_txt_leaves_out_the_warnings_of_a_trainer_built_before_it(tmp_path):
    Trainer(model(), "sgd", problem(64), batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=2,
            dist_timeout=60, progress_bar=False)  # warned about, never trained
    Trainer(model(), "sgd", problem(64), batch_size=32, lr=0.1, loss_fn=nn.functional.cross_entropy, max_iter=2,
            output_dir=str(tmp_path), progress_bar=False).train()
    log = (tmp_path / "log.txt").read_text()
    assert "dist_timeout=60" not in log and "Starting training from iteration 0" in log
