import json
import logging
import math
import types

import pytest
import torch
from fvcore.common.param_scheduler import (
    ConstantParamScheduler,
    CosineParamScheduler,
    MultiStepParamScheduler,
    StepParamScheduler,
    StepWithFixedGammaParamScheduler,
)
from torch import nn

from treadle.engine import EagerStep, StepBase, TrainerBase, Update
from treadle.events import JSONWriter
from treadle.hooks import PeriodicWriter
from treadle.hooks.callback import CallbackHook
from treadle.hooks.lr_scheduler import LRMonitor, LRMultiplier, LRScheduler, build_lr_multiplier


def make_trainer(scheduler_factory, lr=1.0, **hook_options):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = [(torch.randn(4, 2), torch.randn(4, 1))]
    trainer = TrainerBase(EagerStep(model, data, opt, loss_fn=nn.functional.mse_loss))
    hook = LRScheduler(scheduler=scheduler_factory(opt), **hook_options)
    trainer.register_hooks([hook])
    return trainer, hook, opt


def lrs(trainer):
    return [v for v, _ in trainer.storage.history("lr").values()]


def test_param_scheduler_is_a_multiplier_over_max_iter():
    trainer, _, _ = make_trainer(lambda opt: MultiStepParamScheduler([1.0, 0.1, 0.01], milestones=[4, 6], num_updates=8), lr=0.5)
    trainer.train(0, 8)
    assert lrs(trainer) == pytest.approx([0.5] * 4 + [0.05] * 2 + [0.005] * 2)


def test_torch_scheduler_is_stepped_each_iteration():
    trainer, _, _ = make_trainer(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))
    trainer.train(0, 6)
    assert lrs(trainer) == pytest.approx([1, 1, 0.5, 0.5, 0.25, 0.25])


@pytest.mark.parametrize(
    "factory",
    [
        lambda opt: CosineParamScheduler(1.0, 0.0),
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
    ],
    ids=["fvcore", "torch"],
)
def test_scheduler_state_restores_the_schedule(factory):
    full, _, _ = make_trainer(factory)
    full.train(0, 10)
    expected = lrs(full)

    first, hook, opt = make_trainer(factory)
    # Interrupted after 4 of 10 iterations.
    first.register_hooks([CallbackHook(after_step=lambda t: t.request_stop("preempted") if t.iter == 3 else None)])
    first.train(0, 10)
    state = {"hook": hook.state_dict(), "opt": opt.state_dict()}
    assert all(isinstance(v, (int, float, list, dict, str, bool, type(None))) for v in state["hook"].values())

    resumed, hook2, opt2 = make_trainer(factory)
    opt2.load_state_dict(state["opt"])
    hook2.load_state_dict(state["hook"])
    resumed.train(4, 10)
    assert lrs(first) + lrs(resumed) == pytest.approx(expected)


def test_lr_published_is_from_the_largest_param_group():
    model = nn.Sequential(nn.Linear(10, 10), nn.LayerNorm(10))
    opt = torch.optim.SGD([{"params": model[1].parameters(), "lr": 0.1}, {"params": model[0].parameters(), "lr": 0.7}], lr=0.1)
    trainer = TrainerBase(EagerStep(model, [torch.zeros(())], opt, loss_fn=lambda out, t: out))
    hook = LRScheduler(scheduler=torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0))
    trainer.register_hooks([hook])
    hook.trainer = trainer
    hook.before_train()
    assert hook._group_index == 1


def test_bad_scheduler_is_rejected():
    with pytest.raises(TypeError, match="got int"):
        LRScheduler(scheduler=3)
    with pytest.raises(TypeError, match="ParamScheduler"):
        LRMultiplier(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1), object(), 10)


def test_named_schedules_with_warmup():
    from treadle.hooks.lr_scheduler import build_lr_multiplier

    cosine = build_lr_multiplier("cosine", max_iter=100, warmup_iters=10, warmup_factor=0.1)
    assert cosine(0.0) == pytest.approx(0.1)
    assert cosine(0.05) == pytest.approx((0.1 + (1 + __import__("math").cos(__import__("math").pi * 0.1)) / 2) / 2, rel=1e-6)
    assert cosine(0.5) == pytest.approx(0.5)
    step = build_lr_multiplier("step", max_iter=90, gamma=0.5)
    assert [step(i / 90) for i in (0, 59, 60, 79, 80)] == pytest.approx([1, 1, 0.5, 0.5, 0.25])
    assert build_lr_multiplier("linear", max_iter=10)(0.5) == pytest.approx(0.5)
    assert build_lr_multiplier("constant", max_iter=10)(0.9) == 1.0
    with pytest.raises(ValueError, match="Unknown schedule 'poly'; choose one of constant, cosine, linear, step"):
        build_lr_multiplier("poly", max_iter=10)


def test_bad_multiplier_arguments_are_config_errors():
    from treadle.config import ConfigError
    from treadle.hooks.lr_scheduler import build_lr_multiplier

    # ConfigError, so that tools/train_net.py reports a config's mistake in one line.
    for kwargs in (
        dict(name="cosine", max_iter=0),
        dict(name="poly", max_iter=10),
        dict(name="step", max_iter=10, steps=[12]),
    ):
        with pytest.raises(ConfigError):
            build_lr_multiplier(**kwargs)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("requested", [30, 50])
def test_warmup_not_shorter_than_the_run_is_clipped_to_half_of_it_with_one_warning(treadle_caplog, requested):
    from treadle.hooks.lr_scheduler import build_lr_multiplier

    clipped = build_lr_multiplier("cosine", max_iter=30, warmup_iters=requested, warmup_factor=0.1)
    half = build_lr_multiplier("cosine", max_iter=30, warmup_iters=15, warmup_factor=0.1)
    assert warnings_of(treadle_caplog) == [
        f"lr_multiplier.warmup_iters={requested} is not shorter than the run (max_iter=30): warming up over 15 "
        "iterations, half the run, instead."
    ]
    points = [i / 30 for i in range(30)]
    assert [clipped(w) for w in points] == [half(w) for w in points]
    assert clipped(0.0) == pytest.approx(0.1) and clipped(0.5) == pytest.approx(0.5)  # the peak, then cosine decay

    treadle_caplog.clear()
    build_lr_multiplier("cosine", max_iter=30, warmup_iters=29)  # shorter than the run: kept, no warning
    assert warnings_of(treadle_caplog) == []


def test_one_iteration_run_gets_no_warmup(treadle_caplog):
    from treadle.hooks.lr_scheduler import build_lr_multiplier

    constant = build_lr_multiplier("constant", max_iter=1, warmup_iters=5)
    assert constant(0.0) == 1.0  # not 0.001 times the rate for the only iteration
    assert warnings_of(treadle_caplog) == [
        "lr_multiplier.warmup_iters=5 is not shorter than the run (max_iter=1): no warm-up instead."
    ]


def test_resolve_scheduler_names_its_own_argument(treadle_caplog):
    from treadle.engine import resolve_scheduler

    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0)
    for scheduler in ("linear", None):
        treadle_caplog.clear()
        multiplier = resolve_scheduler(scheduler, opt, 8, warmup_iters=100)
        # Hugging Face's warm-up: from 0 to the full rate at the (clipped) 4 iterations.
        assert multiplier(0.0) == 0.0 and multiplier(0.5) == pytest.approx(1.0)
        assert warnings_of(treadle_caplog) == [
            "warmup_iters=100 is not shorter than the run (max_iter=8): warming up over 4 iterations, half the run, "
            "instead."
        ]


@pytest.mark.parametrize(
    "schedule",
    [
        lambda: StepParamScheduler(num_updates=10, values=[1.0, 0.1]),
        lambda: StepWithFixedGammaParamScheduler(base_value=1.0, num_decays=2, gamma=0.1, num_updates=10),
    ],
    ids=["StepParamScheduler", "StepWithFixedGammaParamScheduler"],
)
def test_fvcore_step_schedules_reach_the_last_iteration(schedule):
    """fvcore's step schedules index int(where * num_updates + 1e-6): the
    position after the last step must stay a whole step below 1."""
    trainer, _, _ = make_trainer(lambda opt: schedule())
    trainer.train(0, 10)
    values = lrs(trainer)
    assert len(values) == 10 and values[0] == pytest.approx(1.0) and values[-1] < 0.2


def test_torch_scheduler_stepped_per_epoch(treadle_caplog):
    trainer, _, _ = make_trainer(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5), interval="epoch")
    trainer.epoch_length = 3
    trainer.train(0, 15)  # 5 epochs: 1, 1, 0.5, 0.5, 0.25 (StepLR counts epochs)
    assert lrs(trainer) == pytest.approx([1] * 6 + [0.5] * 6 + [0.25] * 3)
    assert "stepping StepLR after every epoch (3 iterations)" in treadle_caplog.text


def test_epoch_interval_is_for_torch_schedulers():
    with pytest.raises(ValueError, match="interval='epoch' is for torch schedulers"):
        LRScheduler(scheduler=CosineParamScheduler(1.0, 0.0), interval="epoch")


@pytest.mark.parametrize("constant", [False, True], ids=["cosine", "constant"])
@pytest.mark.parametrize("tensor_lr", [False, True])
def test_lr_multiplier_step_sets_the_rates_torchs_step_sets(tensor_lr, constant):
    """LRMultiplier's own step (fewer calls per iteration; for a constant
    schedule, none once the rates are set) against torch's LRScheduler.step
    on a twin optimizer: same rates, last_epoch and get_last_lr at every
    iteration, a tensor rate filled in place, also after a rate changed by
    hand and base rates changed by a resume."""

    def build():
        model = nn.Linear(2, 2)
        lr = torch.tensor(0.1) if tensor_lr else 0.1
        opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": lr * 2}], lr=lr)
        schedule = ConstantParamScheduler(0.5) if constant else CosineParamScheduler(1.0, 0.0)
        scheduler = LRMultiplier(opt, schedule, max_iter=50)
        opt.step()  # after the scheduler wraps it, as in training: torch warns otherwise
        return opt, scheduler

    ours_opt, ours = build()
    torch_opt, reference = build()
    lr_tensor = ours_opt.param_groups[0]["lr"]
    computed = []
    get_lr = ours.get_lr
    ours.get_lr = lambda: computed.append(ours.last_epoch) or get_lr()
    for i in range(60):  # past max_iter too
        if i == 20 and not tensor_lr:
            for opt in (ours_opt, torch_opt):
                opt.param_groups[1]["lr"] = 7.0  # by hand: the schedule sets it back
        if i == 30:
            for scheduler in (ours, reference):
                scheduler.base_lrs = [0.3, 0.6]  # as a resume that keeps the config's rate does
        ours.step()
        torch.optim.lr_scheduler.LRScheduler.step(reference)
        assert [float(g["lr"]) for g in ours_opt.param_groups] == [float(g["lr"]) for g in torch_opt.param_groups]
        assert ours.last_epoch == reference.last_epoch and ours._step_count == reference._step_count
        assert [float(v) for v in ours.get_last_lr()] == [float(v) for v in reference.get_last_lr()]
    if tensor_lr:
        assert ours_opt.param_groups[0]["lr"] is lr_tensor
    if constant:  # the rates are computed again only where they had to change
        assert not [epoch for epoch in computed if 3 <= epoch <= 19 or 23 <= epoch <= 29 or epoch >= 33]


def test_reduce_lr_on_plateau_is_refused_by_the_hook_given_or_found_on_the_trainer():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    with pytest.raises(TypeError, match="ReduceLROnPlateau is not supported"):
        LRScheduler(optimizer, plateau)
    hook = LRScheduler()
    hook.trainer = types.SimpleNamespace(scheduler=plateau)
    with pytest.raises(TypeError, match="ReduceLROnPlateau is not supported"):
        hook.before_train()


@pytest.mark.parametrize("name", ["cosine", "linear", None])
def test_resolve_scheduler_warms_up_as_hugging_face_and_configs_as_detectron2(name):
    """The plain Trainer's scheduler="cosine", warmup_iters=W is what an HF
    user's lr_scheduler_type="cosine", warmup_steps=W gives (per-step rates
    of transformers' own schedule); a config's warm-up stays detectron2's."""
    transformers = pytest.importorskip("transformers")
    hf = {
        "cosine": transformers.get_cosine_schedule_with_warmup,
        "linear": transformers.get_linear_schedule_with_warmup,
        None: lambda optimizer, warmup, total: transformers.get_constant_schedule_with_warmup(optimizer, warmup),
    }[name]
    from treadle.engine import resolve_scheduler

    n, warmup = 20, 5
    multiplier = resolve_scheduler(name, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), n, warmup_iters=warmup)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    reference = hf(optimizer, warmup, n)
    expected = []
    for _ in range(n):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    assert [multiplier(i / n) for i in range(n)] == pytest.approx(expected, rel=0, abs=1e-12)
    assert expected[warmup] == 1.0  # the full rate is reached
    detectron2 = build_lr_multiplier(name or "constant", max_iter=n, warmup_iters=warmup)
    assert detectron2(0.0) == pytest.approx(0.001)
    if name == "cosine":
        assert detectron2(warmup / n) == pytest.approx(0.5 * (1 + math.cos(math.pi * warmup / n)))


@pytest.mark.parametrize("style", ["detectron2", "huggingface"])
@pytest.mark.parametrize("warmup", [0, 4, 8])
def test_a_configs_step_schedule_drops_the_rate_at_its_milestone_under_a_warm_up(style, warmup):
    """A config's lr_multiplier (build_lr_multiplier) stepped by the LRScheduler
    hook: the rate of each iteration against the rates worked out by hand."""
    n, lr = 24, 0.5
    trainer, _, _ = make_trainer(lambda opt: build_lr_multiplier(
        "step", max_iter=n, warmup_iters=warmup, steps=[16], gamma=0.1, warmup_style=style), lr=lr)
    trainer.train(0, n)
    start = 0.001 if style == "detectron2" else 0.0  # the warm-up's first factor (warmup_factor, or 0)
    by_hand = [lr * (start + (1 - start) * i / warmup if i < warmup else 1.0) * (0.1 if i >= 16 else 1.0)
               for i in range(n)]
    assert lrs(trainer) == pytest.approx(by_hand, rel=1e-12, abs=1e-15)


def test_an_unknown_warmup_style_is_a_config_error_naming_the_choices():
    from treadle.config import ConfigError

    with pytest.raises(ConfigError, match="warmup_style must be one of detectron2, huggingface, got 'hf'"):
        build_lr_multiplier("cosine", max_iter=10, warmup_iters=2, warmup_style="hf")


class TwoOptimizerStep(StepBase):
    """A GAN-like step: a generator and a discriminator, each updated by its own optimizer."""

    def __init__(self):
        torch.manual_seed(0)
        self.g, self.d = nn.Linear(2, 2), nn.Linear(2, 1)
        self.opt_g = torch.optim.SGD(self.g.parameters(), lr=1.0)
        self.opt_d = torch.optim.SGD(self.d.parameters(), lr=0.1)
        self.update_g, self.update_d = Update(self.opt_g), Update(self.opt_d)

    def run_step(self):
        noise = torch.randn(4, 2)
        self.update_d.apply(self.d(self.g(noise).detach()).mean() - self.d(noise).mean())
        self.update_g.apply(-self.d(self.g(noise)).mean())


def _gan_trainer():
    step = TwoOptimizerStep()
    sched_g = torch.optim.lr_scheduler.StepLR(step.opt_g, step_size=2, gamma=0.5)
    sched_d = torch.optim.lr_scheduler.ExponentialLR(step.opt_d, gamma=0.9)
    return TrainerBase(step), step, sched_g, sched_d


def test_two_schedules_each_publish_their_rate_under_their_own_name(tmp_path):
    trainer, step, sched_g, sched_d = _gan_trainer()
    trainer.register_hooks([
        LRScheduler(step.opt_g, sched_g, name="lr_g"),
        LRScheduler(step.opt_d, sched_d, name="lr_d"),
        PeriodicWriter([JSONWriter(str(tmp_path / "metrics.json"), window_size=1)], period=1),
    ])
    trainer.train(0, 6)
    rows = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    # The rate each iteration ran with: StepLR halves every 2 iterations, ExponentialLR takes 0.9 each.
    assert [(r["iteration"], r["lr_g"], r["lr_d"]) for r in rows] == [
        (i, pytest.approx(1.0 * 0.5 ** (i // 2)), pytest.approx(0.1 * 0.9**i)) for i in range(6)
    ]
    assert all("lr" not in r for r in rows)


def test_two_hooks_publishing_lr_are_refused_before_anything_is_written(tmp_path):
    trainer, step, sched_g, sched_d = _gan_trainer()
    with pytest.raises(ValueError) as refused:
        trainer.register_hooks([
            LRScheduler(step.opt_g, sched_g),
            LRScheduler(step.opt_d, sched_d),
            PeriodicWriter([JSONWriter(str(tmp_path / "metrics.json"))], period=1),
        ])
    assert str(refused.value) == (
        "LRScheduler and LRScheduler#2 both publish the scalar 'lr': writers keep one value per name and "
        "iteration, so one of the two would be lost; give each its own name, e.g. "
        'LRScheduler(opt_g, sched_g, name="lr_g")'
    )
    assert trainer.hooks == [] and list(tmp_path.iterdir()) == []


def test_a_monitor_and_a_schedule_on_one_name_are_refused_when_added_later():
    trainer, step, sched_g, _ = _gan_trainer()
    trainer.register_hooks([LRScheduler(step.opt_g, sched_g, name="rate")])
    with pytest.raises(ValueError, match=(
        r"^LRScheduler and LRMonitor both publish the scalar 'rate': .*"
        r'give each its own name, e.g. LRMonitor\(opt_g, name="lr_g"\)$'
    )):
        trainer.register_hooks([LRMonitor(step.opt_d, name="rate")])
    assert [type(h) for h in trainer.hooks] == [LRScheduler]


@pytest.mark.parametrize("hook", [LRScheduler, LRMonitor])
@pytest.mark.parametrize("name", ["", None, 3])
def test_the_name_is_checked_when_the_hook_is_built(hook, name):
    with pytest.raises(ValueError) as refused:
        hook(name=name)
    assert str(refused.value) == (
        f"{hook.__name__} name must be a non-empty str (the scalar its rate is published under), got {name!r}"
    )
