
import pytest
import torch
from torch import nn

from tests.hooks.helpers import make_trainer
from treadle.engine import HookOrderError
from treadle.hooks import (
    EMA,
    EvalHook,
    PreciseBN,
)


def _bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


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


def test_a_run_preempted_after_its_last_iteration_keeps_its_final_statistics_when_it_finishes():
    """The last iteration recomputes the statistics (of the final weights).
    A preemption after it leaves the run to finish on resume, which must not
    recompute them: PreciseBN's data is shuffled, so a second pass would
    average other batches than the uninterrupted run's did."""
    from treadle.engine import HookBase

    def bn_loader():
        data = torch.utils.data.TensorDataset(torch.randn(64, 3, generator=torch.Generator().manual_seed(2)) * 2 + 1)
        return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)

    def trainer_of(model, *hooks):
        trainer, _ = make_trainer(model)
        trainer.register_hooks([PreciseBN(0, model, bn_loader(), num_iter=2, input_fn=lambda b: b[0]), *hooks])
        return trainer

    uninterrupted = _bn_model()
    trainer_of(uninterrupted).train(0, 4)

    saved = {}

    class PreemptedAtTheEnd(HookBase):
        def after_iteration(self):
            if self.trainer.iter == 3:  # after every hook's after_step: the statistics were recomputed
                self.trainer.request_stop("preempted", interrupted=True)
                saved["trainer"] = self.trainer.state_dict()
                saved["model"] = {k: v.clone() for k, v in self.trainer.step.model.state_dict().items()}

    trainer_of(_bn_model(), PreemptedAtTheEnd()).train(0, 4)
    resumed = _bn_model()
    resumed.load_state_dict(saved["model"])
    finishing = trainer_of(resumed)
    finishing.load_state_dict(saved["trainer"])
    assert finishing.has_work(4, 4)  # the run did not finish: train() runs its end
    finishing.train(4, 4)
    assert finishing.finished
    for name in ("running_mean", "running_var"):
        assert torch.equal(getattr(resumed[1], name), getattr(uninterrupted[1], name)), name
