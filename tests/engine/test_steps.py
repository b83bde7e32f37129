import itertools

import pytest
import torch
from torch import nn

from treadle.engine import CompiledStep, EagerStep, HookBase, StepBase, TrainerBase
from treadle.events import ScalarKind


def regression_data(n_batches=64, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 1, generator=g)
    batches = []
    for _ in range(n_batches):
        x = torch.randn(batch, 4, generator=g)
        batches.append((x, x @ w + 0.1 * torch.randn(batch, 1, generator=g)))
    return batches


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def train(step, iters, hooks=()):
    trainer = TrainerBase(step)
    trainer.register_hooks(list(hooks))
    history = {}

    class Grab(HookBase):
        def after_step(self):
            for name, (value, _) in self.trainer.storage.latest().items():
                history.setdefault(name, []).append(value)

    trainer.register_hooks([Grab()])
    trainer.train(0, iters)
    return history


def test_loss_fn_contract_trains_and_publishes_total_loss_and_data_time():
    model = make_model()
    data = regression_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = EagerStep(model, data, opt, loss_fn=nn.functional.mse_loss)
    history = train(step, 40)
    assert set(history) == {"total_loss", "data_time"}
    assert history["total_loss"][-1] < history["total_loss"][0] / 2
    assert all(t >= 0 for t in history["data_time"])


class DictLossModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = make_model()

    def forward(self, batch):
        x, y = batch
        out = self.net(x)
        return {"loss_mse": nn.functional.mse_loss(out, y), "loss_l1": 0.5 * nn.functional.l1_loss(out, y)}


def test_dict_of_losses_is_summed_and_each_term_published():
    model = DictLossModel()
    data = regression_data()
    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.01))
    trainer = TrainerBase(step)
    trainer.train(0, 1)
    latest = trainer.storage.latest()
    x, y = data[0]
    assert set(latest) == {"loss_mse", "loss_l1", "total_loss", "data_time"}
    assert latest["total_loss"][0] == pytest.approx(latest["loss_mse"][0] + latest["loss_l1"][0])
    assert trainer.storage.kind("loss_l1") == ScalarKind.LOSS


class HFLikeOutput(dict):
    """Like transformers' ModelOutput: a dict that also has attributes."""

    def __getattr__(self, name):
        return self[name]


class HFLikeModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = make_model()

    def forward(self, batch):
        logits = self.net(batch["x"])
        return HFLikeOutput(loss=nn.functional.mse_loss(logits, batch["y"]), logits=logits)


def test_object_with_loss_attribute_uses_only_the_loss():
    model = HFLikeModel()
    data = [{"x": x, "y": y} for x, y in regression_data()]
    trainer = TrainerBase(EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.01)))
    trainer.train(0, 2)
    assert set(trainer.storage.latest()) == {"total_loss", "data_time"}


class ScalarModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = make_model()

    def forward(self, batch):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)


def test_scalar_loss_model_equals_loss_fn_contract():
    a, b = ScalarModel(), make_model()
    b.load_state_dict(a.net.state_dict())
    data = regression_data()
    train(EagerStep(a, data, torch.optim.SGD(a.parameters(), lr=0.05)), 10)
    train(EagerStep(b, data, torch.optim.SGD(b.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss), 10)
    for p, q in zip(a.net.parameters(), b.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    "output, message",
    [
        (torch.ones(3), r"loss 'total_loss' of shape \(3,\)"),
        ({"a": torch.ones(()), "b": 2.0}, "entry 'b' is a float"),
        ([torch.ones(())], "returned list; expected a scalar loss tensor"),
        ({"total_loss": torch.ones(())}, "name is kept for the sum"),
    ],
)
def test_bad_model_outputs_are_clear_errors(output, message):
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.ones(()))

        def forward(self, batch):
            return output

    model = Bad()
    step = EagerStep(model, [torch.zeros(1)], torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises((TypeError, ValueError), match=message):
        TrainerBase(step).train(0, 1)


def test_loss_fn_needs_input_target_pairs():
    model = make_model()
    step = EagerStep(model, [torch.zeros(2, 4)], torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.functional.mse_loss)
    with pytest.raises(TypeError, match=r"\(inputs, targets\) pair; got Tensor"):
        TrainerBase(step).train(0, 1)


@pytest.mark.parametrize("step_class", [EagerStep, CompiledStep])
def test_a_fourth_positional_argument_is_refused_saying_the_rest_are_keyword_only(step_class, monkeypatch):
    """Python's own "takes 4 positional arguments but 5 were given" counts self and names no keyword; the
    layers above may add a hint (treadle.compat adds LiBai's spelling)."""
    import treadle.engine.steps as steps

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.setattr(steps, "POSITIONAL_HINTS", [])
    name = step_class.__name__
    with pytest.raises(TypeError) as error:
        step_class(model, [], optimizer, 4, 5)
    assert str(error.value) == (f"{name}(model, data_loader, optimizer, *, ...) takes 3 positional arguments and 5 "
                                "were given: the rest are keyword-only")
    steps.POSITIONAL_HINTS.append(lambda step, rest: f"{step} got {rest!r}")
    with pytest.raises(TypeError, match=r"the rest are keyword-only \(" + name + r" got \(4,\)\)$"):
        step_class(model, [], optimizer, 4)


def test_grad_accumulation_equals_one_big_batch():
    small = regression_data(n_batches=12, batch=4, seed=1)
    big = [(torch.cat([small[i][0], small[i + 1][0], small[i + 2][0]]), torch.cat([small[i][1], small[i + 1][1], small[i + 2][1]])) for i in range(0, 12, 3)]
    m1, m2 = make_model(3), make_model(3)
    h1 = train(EagerStep(m1, small, torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9), loss_fn=nn.functional.mse_loss, grad_accum_steps=3), 4)
    h2 = train(EagerStep(m2, big, torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9), loss_fn=nn.functional.mse_loss), 4)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # The published loss is the mean over micro-batches: the big batch's loss.
    assert h1["total_loss"] == pytest.approx(h2["total_loss"], rel=1e-5)


class _Resizable(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.head = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x))).mean(-1, keepdim=True)  # whatever the head's width


def _resize(model, surgery):
    with torch.no_grad():
        if surgery == "grow":  # the head from 1 to 3 outputs
            model.head.weight.data = torch.cat([model.head.weight, torch.full((2, 8), 0.1)])
            model.head.bias.data = torch.cat([model.head.bias, torch.zeros(2)])
        else:  # the hidden layer from 8 units to 5
            model.hidden.weight.data = model.hidden.weight[:5].clone()
            model.hidden.bias.data = model.hidden.bias[:5].clone()
            model.head.weight.data = model.head.weight[:, :5].clone()


@pytest.mark.parametrize("surgery", ["grow", "prune"])
def test_a_parameter_resized_through_data_between_steps_trains_as_in_a_hand_written_step(surgery):
    # The step's autograd graph is freed when it returns, as in detectron2's
    # run_step. A graph kept into the next step (as a loop that keeps `loss`
    # does) keeps each parameter's gradient accumulator with the shape it had:
    # torch does not renew it when .data changes shape, so a grown head's
    # gradient came out summed to the old shape, silently, and a pruned layer
    # raised.
    data = regression_data(n_batches=6)
    model = _Resizable()
    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss)
    grad_shapes = []

    class Surgery(HookBase):
        def after_backward(self):
            grad_shapes.append(tuple(model.head.weight.grad.shape))

        def after_step(self):
            if self.trainer.iter == 1:
                _resize(model, surgery)

    trainer = TrainerBase(step)
    trainer.register_hooks([Surgery()])
    trainer.train(0, 4)

    expected = _Resizable()
    optimizer = torch.optim.SGD(expected.parameters(), lr=0.05)
    for it, (x, y) in enumerate(data[:4]):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(expected(x), y).backward()
        optimizer.step()
        if it == 1:
            _resize(expected, surgery)
    assert grad_shapes[2:] == [tuple(model.head.weight.shape)] * 2
    for name, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def _fake_fsdp2(module, calls):
    """``module`` recognised as FSDP2-sharded (as ``fully_shard`` does, by a class
    swap), recording its ``set_requires_gradient_sync`` calls; no process group."""
    from torch.distributed.fsdp import FSDPModule

    class FakeFSDP(FSDPModule, type(module)):
        def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
            calls.append(requires_gradient_sync)

    module.__class__ = FakeFSDP
    return module


def test_grad_accumulation_with_fsdp2_syncs_only_the_last_micro_batch():
    from treadle.checkpoint.fsdp import is_fsdp_model

    calls = []
    model = _fake_fsdp2(make_model(), calls)
    assert is_fsdp_model(model) and not hasattr(model, "no_sync")
    step = EagerStep(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.functional.mse_loss, grad_accum_steps=3)
    train(step, 2)
    assert calls == [False, False, True] * 2


def test_fsdp2_gradient_sync_is_turned_back_on_when_a_micro_batch_fails():
    calls = []
    model = _fake_fsdp2(make_model(), calls)
    data = regression_data(n_batches=1) + [(torch.zeros(8, 3), torch.zeros(8, 1))]  # wrong width
    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.functional.mse_loss, grad_accum_steps=3)
    with pytest.raises(RuntimeError):
        TrainerBase(step).train(0, 1)
    assert calls == [False, False, True]


def test_clip_grad_norm_clips_and_publishes_the_norm_before_clipping():
    model = make_model()
    data = [(torch.randn(8, 4) * 100, torch.randn(8, 1) * 100)]
    seen = {}

    class Probe(HookBase):
        def after_backward(self):
            seen["norm"] = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])

    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.0), loss_fn=nn.functional.mse_loss, clip_grad_norm=1.0)
    trainer = TrainerBase(step)
    trainer.register_hooks([Probe()])
    trainer.train(0, 1)
    published = trainer.storage.latest()["grad_norm"][0]
    assert published == pytest.approx(float(seen["norm"]), rel=1e-5) and published > 1.0
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert float(clipped) == pytest.approx(1.0, rel=1e-4)


def test_clip_grad_norm_ignores_optimizer_parameters_without_a_gradient():
    model = make_model()
    unused = nn.Parameter(torch.ones(3))  # in the optimizer, never in the loss: its grad stays None
    data = [(torch.randn(8, 4) * 100, torch.randn(8, 1) * 100)]
    seen = []

    class Probe(HookBase):
        def after_backward(self):
            seen.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))

    opt = torch.optim.SGD([{"params": model.parameters()}, {"params": [unused]}], lr=0.01)
    step = EagerStep(model, data, opt, loss_fn=nn.functional.mse_loss, clip_grad_norm=1.0)
    history = train(step, 3, hooks=[Probe()])
    assert history["grad_norm"] == pytest.approx(seen, rel=1e-5)
    assert unused.grad is None and torch.equal(unused.detach(), torch.ones(3))


def test_clip_grad_value_updates_as_the_hand_written_loop_with_clip_grad_value_():
    data = [(x * 50, y * 50) for x, y in regression_data(n_batches=6, seed=3)]  # gradients well above 0.01
    hand = make_model()
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.05, momentum=0.9)
    clipped = []
    for x, y in data:
        hand_opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(hand(x), y).backward()
        clipped.append(max(float(p.grad.abs().max()) for p in hand.parameters()) > 0.01)
        torch.nn.utils.clip_grad_value_(list(hand.parameters()), 0.01)
        hand_opt.step()
    assert all(clipped)  # the clipping is not a no-op here
    model = make_model()
    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     loss_fn=nn.functional.mse_loss, clip_grad_value=0.01)
    history = train(step, len(data))
    assert "grad_norm" not in history  # only clipping by norm measures a norm
    for p, q in zip(model.parameters(), hand.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("value", [0, -1.0, "0.1", True])
def test_a_bad_clip_grad_value_is_one_line_naming_it(value):
    model = make_model()
    with pytest.raises(ValueError, match=r"^clip_grad_value must be a positive number or None, got "):
        EagerStep(model, [], torch.optim.SGD(model.parameters(), lr=0.1), clip_grad_value=value)


def test_clip_grad_norm_and_clip_grad_value_together_are_refused():
    model = make_model()
    with pytest.raises(ValueError, match=r"^Give clip_grad_norm \(1.0\) or clip_grad_value \(0.5\), not both$"):
        EagerStep(model, [], torch.optim.SGD(model.parameters(), lr=0.1), clip_grad_norm=1.0, clip_grad_value=0.5)


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16():
    model = make_model()
    dtypes = []
    model[0].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    step = EagerStep(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss, precision="bf16")
    history = train(step, 30)
    assert dtypes[0] == torch.bfloat16
    assert model[0].weight.dtype == torch.float32  # master weights stay fp32
    assert history["total_loss"][-1] < history["total_loss"][0]


def test_bf16_step_equals_the_hand_written_autocast_loop_bit_for_bit():
    """The step's bf16 forward under autocast: the updates are those of the
    hand-written torch.amp loop, bit for bit."""
    torch.manual_seed(0)
    data = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(12)]

    def fresh():
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    reference, ref_opt = fresh()
    for x, y in data * 2:
        ref_opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(reference(x), y)
        loss.backward()
        ref_opt.step()
    model, opt = fresh()
    TrainerBase(EagerStep(model, data, opt, loss_fn=nn.functional.cross_entropy, precision="bf16")).train(0, 24)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    assert not torch.is_autocast_enabled("cpu")  # the context is left after each step


def test_fp16_on_cpu_is_a_clear_error_and_bad_arguments_are_rejected():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="precision='fp16' needs CUDA.*Use precision='bf16' on CPU"):
        EagerStep(model, [], opt, precision="fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        EagerStep(model, [], opt, precision="fp8")
    with pytest.raises(ValueError, match="grad_accum_steps must be an integer >= 1"):
        EagerStep(model, [], opt, grad_accum_steps=0)
    with pytest.raises(ValueError, match="grad_scaler is used only with precision='fp16'"):
        EagerStep(model, [], opt, grad_scaler=torch.amp.GradScaler("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 with GradScaler needs CUDA")
def test_fp16_grad_scaler_on_cuda_hooks_see_unscaled_gradients():
    model = make_model().cuda()
    data = [(x.cuda(), y.cuda()) for x, y in regression_data()]
    grads = []

    class Probe(HookBase):
        def after_backward(self):
            grads.append(model[0].weight.grad.clone())

    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss, precision="fp16")
    trainer = TrainerBase(step)
    trainer.register_hooks([Probe()])
    trainer.train(0, 5)
    reference = make_model().cuda()
    x, y = data[0]
    nn.functional.mse_loss(reference(x), y).backward()
    torch.testing.assert_close(grads[0], reference[0].weight.grad, rtol=1e-2, atol=1e-3)
    assert "grad_scaler" in step.state_dict()


def test_model_left_in_eval_mode_is_reported():
    model = make_model().eval()
    step = EagerStep(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.functional.mse_loss)
    with pytest.raises(RuntimeError, match="model is in eval mode"):
        TrainerBase(step).train(0, 1)


def test_step_run_outside_training_names_the_missing_storage():
    model = make_model()
    step = EagerStep(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.01), loss_fn=nn.functional.mse_loss)
    with pytest.raises(RuntimeError, match="outside of an EventStorage context"):
        step.run_step()


def test_finite_loader_is_reiterated():
    """Three batches over seven iterations: each pass starts again from the first batch."""
    model = make_model()
    data = regression_data(n_batches=3)
    seen = []

    def loss_fn(outputs, targets):
        seen.append(next(i for i, (_, y) in enumerate(data) if y is targets))
        return nn.functional.mse_loss(outputs, targets)

    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.01), loss_fn=loss_fn)
    TrainerBase(step).train(0, 7)
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(RuntimeError, match="yields no batches"):
        TrainerBase(EagerStep(model, [], torch.optim.SGD(model.parameters(), lr=0.01))).train(0, 1)


def test_compiled_step_matches_eager_step():
    data = regression_data()
    m1, m2 = make_model(5), make_model(5)
    h1 = train(EagerStep(m1, data, torch.optim.SGD(m1.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss), 8)
    step = CompiledStep(m2, data, torch.optim.SGD(m2.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss, backend="aot_eager")
    h2 = train(step, 8)
    assert step.compiled
    assert h2["total_loss"] == pytest.approx(h1["total_loss"], rel=1e-5)
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.slow
def test_compiled_step_with_inductor_matches_eager_step():
    data = regression_data()
    m1, m2 = make_model(5), make_model(5)
    h1 = train(EagerStep(m1, data, torch.optim.SGD(m1.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss), 6)
    step = CompiledStep(m2, data, torch.optim.SGD(m2.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss)
    h2 = train(step, 6)
    assert step.compiled
    assert h2["total_loss"] == pytest.approx(h1["total_loss"], rel=1e-4)


def test_compiled_step_falls_back_to_eager_with_one_warning():
    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler here")

    data = regression_data()
    m1, m2 = make_model(5), make_model(5)
    h1 = train(EagerStep(m1, data, torch.optim.SGD(m1.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss), 4)
    step = CompiledStep(m2, data, torch.optim.SGD(m2.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss, backend=broken_backend)
    with pytest.warns(RuntimeWarning, match="compilation failed, training continues eagerly.*no compiler here") as record:
        h2 = train(step, 4)
    assert len([w for w in record if "compilation failed" in str(w.message)]) == 1
    assert not step.compiled
    assert h2["total_loss"] == h1["total_loss"]


def test_compiled_step_user_errors_still_surface():
    model = make_model()
    bad = [(torch.zeros(2, 5), torch.zeros(2, 1))]  # wrong feature size
    step = CompiledStep(model, bad, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.functional.mse_loss, backend="aot_eager")
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="cannot be multiplied"):
        TrainerBase(step).train(0, 1)


class GANStep(StepBase):
    """A user's research loop: two models, two optimizers, alternating updates."""

    def __init__(self, gen, disc, data, opt_g, opt_d):
        self.gen, self.disc, self.data = gen, disc, iter(data)
        self.opt_g, self.opt_d = opt_g, opt_d

    def run_step(self):
        real = next(self.data)
        z = torch.randn(real.shape[0], 2)
        fake = self.gen(z)
        bce = nn.functional.binary_cross_entropy_with_logits
        d_loss = bce(self.disc(real), torch.ones(len(real), 1)) + bce(self.disc(fake.detach()), torch.zeros(len(real), 1))
        self.opt_d.zero_grad()
        d_loss.backward()
        self.opt_d.step()
        g_loss = bce(self.disc(fake), torch.ones(len(real), 1))
        self.opt_g.zero_grad()
        g_loss.backward()
        self.trainer.after_backward()
        self.opt_g.step()
        self.storage.put_scalars(loss_d=d_loss.detach(), loss_g=g_loss.detach(), kind=ScalarKind.LOSS)


def test_a_replaced_step_object_trains_a_two_optimizer_loop_with_hooks():
    torch.manual_seed(0)
    gen, disc = nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
    real = (torch.randn(16, 2) * 0.1 + torch.tensor([2.0, -1.0]) for _ in itertools.count())
    g0, d0 = gen.weight.clone(), disc[0].weight.clone()
    trainer = TrainerBase()
    trainer.step = GANStep(gen, disc, real, torch.optim.Adam(gen.parameters(), 1e-2), torch.optim.Adam(disc.parameters(), 1e-2))
    backward_calls = []
    from treadle.hooks.callback import CallbackHook

    trainer.register_hooks([CallbackHook(after_backward=lambda t: backward_calls.append(t.iter))])
    trainer.train(0, 50)
    assert backward_calls == list(range(50))
    assert not torch.equal(gen.weight, g0) and not torch.equal(disc[0].weight, d0)
    assert set(trainer.storage.latest()) == {"loss_d", "loss_g"}
    # The generator moved its outputs towards the real data's mean.
    assert (gen(torch.randn(256, 2)).mean(0) - torch.tensor([2.0, -1.0])).abs().max() < (gen.bias.new_zeros(2) - torch.tensor([2.0, -1.0])).abs().max()


def test_step_state_holds_data_position_and_resets_iterator():
    class Loader:
        def __init__(self):
            self.position = 0

        def __iter__(self):
            while True:
                x = torch.full((2, 4), float(self.position))
                self.position += 1
                yield x, torch.zeros(2, 1)

        def state_dict(self):
            return {"position": self.position}

        def load_state_dict(self, state):
            self.position = state["position"]

    model = make_model()
    loader = Loader()
    step = EagerStep(model, loader, torch.optim.SGD(model.parameters(), lr=0.0), loss_fn=nn.functional.mse_loss)
    TrainerBase(step).train(0, 3)
    assert step.state_dict() == {"data": {"position": 3}}
    step.load_state_dict({"data": {"position": 1}})
    assert step._data_iter is None and loader.position == 1


def test_single_entry_dict_of_losses():
    class OneTerm(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = make_model()

        def forward(self, batch):
            x, y = batch
            return {"loss_mse": nn.functional.mse_loss(self.net(x), y)}

    model = OneTerm()
    trainer = TrainerBase(EagerStep(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.01)))
    trainer.train(0, 2)
    latest = trainer.storage.latest()
    assert latest["total_loss"][0] == latest["loss_mse"][0]


# ---------------------------------------------------------------------- the per-batch loss to override
class RegularizedStep(EagerStep):
    """pytorch-accelerated's calculate_train_batch_loss, the treadle way."""

    def compute_loss(self, batch):
        x, y = batch
        out = self.model(x)
        return {"mse": nn.functional.mse_loss(out, y), "l2": 1e-3 * sum((p**2).sum() for p in self.model.parameters())}


def test_an_overridden_compute_loss_keeps_accumulation_clipping_and_precision():
    """With accumulation (2 micro-batches), clipping and bf16, the override's
    losses drive the update exactly as the same loss through loss_fn would."""
    data = regression_data()
    reference_model, custom_model = make_model(), make_model()
    reg = lambda m: 1e-3 * sum((p**2).sum() for p in m.parameters())  # noqa: E731
    options = dict(grad_accum_steps=2, clip_grad_norm=0.5, precision="bf16")

    class Plain(EagerStep):
        def compute_loss(self, batch):
            x, y = batch
            return nn.functional.mse_loss(self.model(x), y) + reg(self.model)

    plain = train(Plain(reference_model, data, torch.optim.SGD(reference_model.parameters(), lr=0.05), **options), 10)
    custom = train(RegularizedStep(custom_model, data, torch.optim.SGD(custom_model.parameters(), lr=0.05), **options), 10)
    assert {"mse", "l2", "total_loss", "grad_norm"} <= set(custom)
    for a, b in zip(reference_model.parameters(), custom_model.parameters()):
        torch.testing.assert_close(a, b)
    assert custom["total_loss"] == pytest.approx(plain["total_loss"])


def test_compute_loss_can_be_given_as_a_function():
    model = make_model()
    data = regression_data()
    seen = []

    def loss(batch):
        seen.append(len(batch[0]))
        return nn.functional.l1_loss(model(batch[0]), batch[1])

    step = EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.05), compute_loss=loss)
    history = train(step, 5)
    assert seen == [8] * 5 and len(history["total_loss"]) == 5


def test_train_on_batch_is_one_update_outside_a_loop():
    model, twin = make_model(), make_model()
    data = regression_data()
    step = EagerStep(model, [], torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss, clip_grad_norm=1.0)
    losses = step.train_on_batch(data[0])
    assert set(losses) == {"total_loss", "grad_norm"} and not losses["total_loss"].requires_grad
    opt = torch.optim.SGD(twin.parameters(), lr=0.05)
    loss = nn.functional.mse_loss(twin(data[0][0]), data[0][1])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(twin.parameters()), 1.0)
    opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b)
    assert losses["total_loss"] == pytest.approx(loss.item())


# ---------------------------------------------------------------------- one update sequence
def test_run_step_accumulation_and_train_on_batch_make_the_same_update():
    """run_step (one batch or two micro-batches) and train_on_batch share one
    update sequence: the weights are those of the hand-written loop."""
    data = regression_data(n_batches=8, seed=2)
    pairs = [(torch.cat([data[i][0], data[i + 1][0]]), torch.cat([data[i][1], data[i + 1][1]])) for i in range(0, 8, 2)]
    options = dict(loss_fn=nn.functional.mse_loss, clip_grad_norm=0.5)

    def optimizer(model):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    hand = make_model(4)
    hand_opt = optimizer(hand)
    for x, y in pairs:
        hand_opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(hand(x), y).backward()
        torch.nn.utils.clip_grad_norm_(list(hand.parameters()), 0.5)
        hand_opt.step()

    whole, accumulated, one_by_one = make_model(4), make_model(4), make_model(4)
    train(EagerStep(whole, pairs, optimizer(whole), **options), 4)
    train(EagerStep(accumulated, data, optimizer(accumulated), grad_accum_steps=2, **options), 4)
    step = EagerStep(one_by_one, [], optimizer(one_by_one), grad_accum_steps=2, **options)
    for batch in pairs:
        step.train_on_batch(batch)  # the whole batch, not grad_accum_steps micro-batches
    for model in (whole, one_by_one):
        for p, q in zip(model.parameters(), hand.parameters()):
            assert torch.equal(p, q)
    for p, q in zip(accumulated.parameters(), hand.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_an_overridden_next_batch_feeds_every_step():
    """run_step takes its batches from next_batch, overridden or not (the
    inline fetch of the common case used to skip an override)."""
    data = regression_data(n_batches=4)

    class Doubled(EagerStep):
        def next_batch(self):
            x, y = super().next_batch()
            return 2 * x, y

    model, hand = make_model(), make_model()
    train(Doubled(model, data, torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.functional.mse_loss), 4)
    opt = torch.optim.SGD(hand.parameters(), lr=0.05)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(hand(2 * x), y).backward()
        opt.step()
    for p, q in zip(model.parameters(), hand.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_non_scalar_loss_of_an_overridden_compute_loss_is_named(accumulate):
    class PerSample(EagerStep):
        def compute_loss(self, batch):
            x, y = batch
            return nn.functional.mse_loss(self.model(x), y, reduction="none")

    model = make_model()
    step = PerSample(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.1), grad_accum_steps=accumulate)
    with pytest.raises(ValueError, match=r"^PerSample\.compute_loss returned loss 'total_loss' of shape \(8, 1\); a loss must be a scalar") as error:
        TrainerBase(step).train(0, 1)
    assert "\n" not in str(error.value)
    given = EagerStep(model, regression_data(), torch.optim.SGD(model.parameters(), lr=0.1), compute_loss=lambda batch: batch[1])
    with pytest.raises(ValueError, match=r"^compute_loss=<lambda> returned loss 'total_loss' of shape \(8, 1\)"):
        given.train_on_batch(regression_data()[0])
