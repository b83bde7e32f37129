"""Validation loss: per-sample mean, batches weighted by size."""

import pytest
import torch
import torch.nn.functional as F

from treadle.evaluation import LossEvaluator


def test_mean_loss_batches_weighted_by_size():
    # Batch 1: mse((1, 2), (0, 0)) = 2.5 over 2 samples; batch 2: mse(3, 0) = 9 over 1.
    # Per sample: (2 * 2.5 + 9) / 3 = 14 / 3, not the mean of batch means 5.75.
    ev = LossEvaluator(loss_fn=F.mse_loss)
    ev.process((None, torch.tensor([0.0, 0.0])), torch.tensor([1.0, 2.0]))
    ev.process((None, torch.tensor([0.0])), torch.tensor([3.0]))
    assert ev.evaluate() == {"loss": 14 / 3}


def test_per_sample_losses_are_summed_and_counted():
    ev = LossEvaluator(loss_fn=lambda out, y: F.mse_loss(out, y, reduction="none"))
    ev.process((None, torch.tensor([0.0, 0.0])), torch.tensor([1.0, 2.0]))
    ev.process((None, torch.tensor([0.0])), torch.tensor([3.0]))
    assert ev.evaluate() == {"loss": (1 + 4 + 9) / 3}


def test_loss_from_model_outputs_without_loss_fn():
    ev = LossEvaluator()
    # A dict batch of 4 samples whose model returns {"loss": 1.0, ...}, then a
    # pair batch of 2 whose model returns a bare loss 4.0: (4 * 1 + 2 * 4) / 6.
    ev.process({"input_ids": torch.zeros(4, 7)}, {"loss": torch.tensor(1.0), "logits": torch.zeros(4, 7, 2)})
    ev.process((torch.zeros(2, 3), torch.zeros(2)), torch.tensor(4.0))
    assert ev.evaluate() == {"loss": 2.0}


def test_dict_of_scalar_losses_is_summed_and_object_with_loss():
    class Out:
        loss = torch.tensor(0.5)

    ev = LossEvaluator()
    ev.process(torch.zeros(2, 1), {"loss_cls": torch.tensor(1.0), "loss_box": torch.tensor(2.0)})
    ev.process(torch.zeros(2, 1), Out())
    assert ev.evaluate() == {"loss": (2 * 3.0 + 2 * 0.5) / 4}


def test_errors():
    # The training step's messages (one contract), naming where the loss came from.
    with pytest.raises(TypeError, match="the model returned list; expected a scalar loss tensor.*needs a loss_fn"):
        LossEvaluator().process(torch.zeros(1), [1.0])
    with pytest.raises(ValueError, match=r"the model returned a dict with keys \['logits'\], no 'loss' among them"):
        LossEvaluator().process(torch.zeros(1), {"logits": torch.zeros(1, 3)})
    with pytest.raises(TypeError, match="loss_fn returned float; expected a scalar loss tensor"):
        LossEvaluator(loss_fn=lambda o, t: 1.0).process((None, torch.zeros(1)), torch.zeros(1))
    with pytest.raises(ValueError, match="loss_fn or compute_loss, not both"):
        LossEvaluator(loss_fn=F.mse_loss, compute_loss=lambda batch: torch.zeros(()))
    with pytest.raises(ValueError, match=r"LossEvaluator computes only \['loss'\], got \['mse'\]"):
        LossEvaluator(["mse"])
    with pytest.raises(ValueError, match="no samples were processed"):
        LossEvaluator(loss_fn=F.mse_loss).evaluate()
    with pytest.raises(ValueError, match="cannot tell the batch size of a object"):
        LossEvaluator().process(object(), torch.tensor(1.0))


def test_process_never_reads_values_on_the_host():
    ev = LossEvaluator(loss_fn=F.mse_loss)
    ev.process((None, torch.zeros(4, device="meta")), torch.zeros(4, device="meta"))
    assert {v.device.type for v in ev.statistics.values()} == {"meta"}


def test_dict_with_loss_and_other_scalar_losses_is_summed_as_in_training():
    # Training sums every entry of a dict of scalar losses, "loss" included, so
    # the validation loss of {"loss": 1, "aux": 2} is 3, not the "loss" entry.
    ev = LossEvaluator()
    ev.process(torch.zeros(2, 1), {"loss": torch.tensor(1.0), "aux": torch.tensor(2.0)})
    assert ev.evaluate() == {"loss": 3.0}


def test_tensor_loss_attribute_is_read_before_the_mapping():
    # A Mapping that also has a tensor .loss (as a Hugging Face ModelOutput
    # does): training takes .loss, not the sum of the entries.
    class Output(dict):
        loss = torch.tensor(0.5)

    ev = LossEvaluator()
    ev.process(torch.zeros(2, 1), Output(loss_cls=torch.tensor(1.0), loss_box=torch.tensor(2.0)))
    assert ev.evaluate() == {"loss": 0.5}


# ---------------------------------------------------------------------- the loss contract, shared with training
def test_logits_are_not_taken_for_a_loss():
    # A model that returns predictions, evaluated without loss_fn: the mean of
    # its logits used to be reported as the loss. Training refuses it, and so
    # does evaluation, in one line naming the source.
    with pytest.raises(ValueError) as error:
        LossEvaluator().process((torch.zeros(4, 3), torch.zeros(4)), torch.randn(4, 2))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("the model returned loss 'total_loss' of shape (4, 2); a loss must be a scalar")
    assert message.endswith("a model that returns predictions needs a loss_fn")
    with pytest.raises(ValueError, match=r"the model returned loss 'loss' of shape \(4,\)"):
        LossEvaluator().process(torch.zeros(4, 3), {"loss": torch.ones(4), "logits": torch.zeros(4, 2)})


def test_compute_loss_is_the_loss_and_the_outputs_are_not_read():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,))), (torch.randn(2, 3), torch.randint(0, 2, (2,)))]

    def compute_loss(batch):
        x, y = batch
        return {"ce": F.cross_entropy(model(x), y), "zero": torch.zeros(())}

    ev = LossEvaluator(compute_loss=compute_loss)
    for batch in batches:
        ev.process(batch, None)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    expected = F.cross_entropy(model(x), y, reduction="sum").item() / 6
    assert ev.evaluate()["loss"] == pytest.approx(expected, rel=1e-6)


def test_a_compute_loss_that_is_not_a_scalar_is_named():
    class MyTrainer:
        def compute_loss(self, batch):
            return torch.ones(len(batch[0]), 2)

    with pytest.raises(ValueError, match=r"^MyTrainer.compute_loss returned loss 'total_loss' of shape \(4, 2\); a loss must be a scalar \(reduce it, e\.g\. with \.mean\(\)\)$"):
        LossEvaluator(compute_loss=MyTrainer().compute_loss).process((torch.zeros(4, 3), torch.zeros(4)), None)


def test_a_dict_batch_with_a_loss_fn_trains_and_evaluates_to_the_value_computed_by_hand():
    """One loss contract: training took only (inputs, targets) pairs with a
    loss_fn, where evaluation also took a dict with its targets under "labels"."""
    from torch import nn

    from treadle.trainer import Trainer

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(6, 3)

        def forward(self, features, labels=None):  # a Hugging Face-style signature
            return self.linear(features)

    g = torch.Generator().manual_seed(0)
    batches = [{"features": torch.randn(8, 6, generator=g), "labels": torch.randint(0, 3, (8,), generator=g)}
               for _ in range(4)]
    ce = nn.functional.cross_entropy
    trainer = Trainer(Tagger(), "sgd", iter(batches), lr=0.5, loss_fn=ce, max_iter=4, progress_bar=False, device="cpu")
    trainer.train()
    by_hand = Tagger()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.5)
    for batch in batches:
        optimizer.zero_grad()
        ce(by_hand(batch["features"]), batch["labels"]).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))
    with torch.no_grad():
        expected = sum(ce(by_hand(b["features"]), b["labels"], reduction="sum") for b in batches) / 32
    ready = torch.utils.data.DataLoader(batches, batch_size=None)  # a list of ready batches
    assert trainer.evaluate(ready)["loss"] == pytest.approx(float(expected), rel=1e-6)


def test_a_dict_batch_with_a_loss_fn_gives_the_model_the_rest_by_name():
    """Hugging Face's rule for a custom loss: the labels are taken out before the
    forward. A model with forward(self, x) was given the whole dict (torch's
    "linear(): argument 'input' ... must be Tensor, not dict")."""
    from torch import nn
    from torch.utils.data import DataLoader, default_collate

    from treadle.trainer import Trainer

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(6, 3)

        def forward(self, x):
            return self.linear(x)

    g = torch.Generator().manual_seed(0)
    samples = [{"x": torch.randn(6, generator=g), "labels": torch.randint(0, 3, (), generator=g)} for _ in range(32)]
    trainer = Trainer(Net(), "sgd", samples, batch_size=8, shuffle=False, lr=0.5, loss_fn=F.cross_entropy,
                      eval_loader=samples, max_epochs=2, progress_bar=False, device="cpu")
    trainer.train()
    by_hand = Net()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.5)
    batches = list(DataLoader(samples, batch_size=8, collate_fn=default_collate))
    for batch in batches * 2:
        optimizer.zero_grad()
        F.cross_entropy(by_hand(batch["x"]), batch["labels"]).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))
    with torch.no_grad():
        expected = sum(F.cross_entropy(by_hand(b["x"]), b["labels"], reduction="sum") for b in batches) / 32
    assert trainer.evaluate()["loss"] == pytest.approx(float(expected), rel=1e-6)


def test_a_hugging_face_model_with_a_loss_fn_computes_no_loss_of_its_own():
    """It was given the labels too, and computed its own loss beside the loss_fn's."""
    from treadle.trainer import Trainer

    from tests.tiny_models import CountingTokens, tiny_gpt2

    def shifted_cross_entropy(outputs, labels):
        return F.cross_entropy(outputs.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())

    model = tiny_gpt2()
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, outputs: calls.append((sorted(kwargs), outputs.loss)),
                                with_kwargs=True)
    trainer = Trainer(model, "adamw", CountingTokens(16), batch_size=8, lr=1e-3, loss_fn=shifted_cross_entropy,
                      eval_loader=CountingTokens(8, seed=1), metrics=["loss", "perplexity"], max_iter=2,
                      progress_bar=False, device="cpu")
    trainer.train()
    results = trainer.evaluate()
    assert len(calls) == 2 + 2  # two training steps, then the evaluation at the end and evaluate()
    assert calls[0][0] == ["attention_mask", "input_ids"]
    assert all(keys == ["attention_mask", "input_ids"] and loss is None for keys, loss in calls)
    assert results["perplexity"] == pytest.approx(float(torch.tensor(results["loss"]).exp()), rel=1e-4)


def test_a_list_of_per_sample_dicts_with_a_loss_fn_is_refused_in_training_as_in_evaluation():
    """The pair rule: two per-sample dicts are no (inputs, targets) pair, in
    training as in evaluation (training fed the first dict to the model)."""
    from treadle.evaluation.loss import forward_loss

    samples = [{"x": torch.randn(6), "labels": torch.tensor(1)}, {"x": torch.randn(6), "labels": torch.tensor(0)}]
    with pytest.raises(TypeError, match=r"^With loss_fn, each batch must be an \(inputs, targets\) pair or a dict "
                       r"with its targets under 'labels'; got a list of 2 per-sample dicts"):
        forward_loss(lambda batch: torch.zeros(2, 3), F.cross_entropy, samples)
    with pytest.raises(TypeError, match="cannot find targets in a batch of type list"):
        LossEvaluator(loss_fn=F.cross_entropy).process(samples, torch.zeros(2, 3))
