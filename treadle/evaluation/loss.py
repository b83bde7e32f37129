"""The loss of a batch, one contract for training and evaluation, and its
mean over a dataset (:class:`LossEvaluator`).

The contract (``docs/engine.md``, "Step objects"), used by the training step
(:class:`~treadle.engine.EagerStep`), the plain ``Trainer``'s ``train_step``,
``eval_step`` and ``evaluate()``, and :class:`LossEvaluator`:

1. with ``loss_fn``, the batch is ``(inputs, targets)`` and the loss is
   ``loss_fn(model(inputs), targets)``; or a mapping with its targets under
   ``"labels"``, which the model gets without them (Hugging Face's rule for a
   custom loss: the model computes none of its own):
   ``loss_fn(model(**inputs), batch["labels"])``, ``inputs`` the rest;
2. without it, the model gets the whole batch (``model(**batch)`` for a
   mapping, see :mod:`treadle.evaluation.batch`) and returns its loss;
3. a ``compute_loss(batch)`` of the user's replaces both.

What comes out is read by :func:`as_losses`: a scalar tensor; an object with
a tensor ``.loss`` (Hugging Face outputs, which are also dicts, so this comes
first); a dict with a ``"loss"`` beside other outputs (logits); or a dict of
scalar losses, summed. Anything else, a loss that is not a scalar among it,
is refused in one line naming where it came from.
"""

from __future__ import annotations

from collections import abc
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import torch

from .batch import TARGET_KEY, batch_size, forward_batch, get_targets
from .evaluator import DatasetEvaluators, metric_names
from .registry import register_metric
from .results import Results
from .statistics import StatisticsEvaluator, float_accumulator_dtype

__all__ = ["LossEvaluator", "forward_loss", "as_losses", "evaluator_loss_fn"]

LossFn = Callable[[Any, Any], Any]

#: Where a loss comes from, as errors name it (besides a ``compute_loss``).
MODEL = "the model"
LOSS_FN = "loss_fn"


def forward_loss(model: Callable[..., Any], loss_fn: Optional[LossFn], batch: Any, target_key: str = TARGET_KEY) -> Any:
    """What the contract computes from a batch (training's and evaluation's),
    before :func:`as_losses` reads it: with ``loss_fn``, ``loss_fn(outputs,
    targets)`` (``model(inputs)`` and ``targets`` of a pair; the model's output
    for the mapping without ``target_key`` and ``batch[target_key]`` of a
    mapping); without it, the model's output for the whole batch."""
    if loss_fn is None:
        return forward_batch(model, batch, whole=True)
    return loss_fn(*_outputs_and_targets(model, batch, target_key))


def _outputs_and_targets(model: Callable[..., Any], batch: Any, target_key: str = TARGET_KEY) -> Any:
    """A batch's model outputs and targets, for a ``loss_fn``: ``model(inputs)``
    and ``targets`` of an ``(inputs, targets)`` pair; the model's output for
    the mapping without ``target_key`` (``model(**inputs)``) and ``batch[target_key]``."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and (
        isinstance(batch[0], torch.Tensor) or not (isinstance(batch[0], abc.Mapping) and isinstance(batch[1], abc.Mapping))
    ):
        # forward_batch's pair rule, written out (two per-sample dicts are no pair there either;
        # tensor inputs are told first, in C: an ABC isinstance is a Python call): through
        # forward_batch and get_targets a step made 21 more calls (benchmarks/peers.py --calls,
        # treadle-bare 314.5 against 293.5 per iteration) and took ~4 µs more (--interleaved).
        inputs, targets = batch
        return model(inputs), targets
    if isinstance(batch, abc.Mapping):
        targets = get_targets(batch, target_key, LOSS_FN)  # first: a batch without them is refused before the forward
        return forward_batch(model, batch, target_key=target_key), targets
    if isinstance(batch, (tuple, list)) and batch and all(isinstance(item, abc.Mapping) for item in batch):
        raise TypeError(
            f"With loss_fn, each batch must be an (inputs, targets) pair or a dict with its targets under "
            f"{target_key!r}; got a {type(batch).__name__} of {len(batch)} per-sample dicts (detectron2's batch, "
            "which the model takes whole and returns its losses of): leave loss_fn out, or collate the samples "
            "into one dict (collate_fn=torch.utils.data.default_collate)"
        )
    raise TypeError(
        "With loss_fn, each batch must be an (inputs, targets) pair; got "
        + type(batch).__name__
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        + f" (or give a dict with its targets under {target_key!r})"
    )


def as_losses(out: Any, source: str) -> Dict[str, torch.Tensor]:
    """The losses in ``out`` by name, their sum under ``"total_loss"``.

    ``source`` names where ``out`` came from (``MODEL``, ``LOSS_FN``,
    ``"MyTrainer.compute_loss"``) in the error raised when ``out`` is not a
    loss by the contract (see the module docstring).
    """
    if isinstance(out, torch.Tensor):
        return {"total_loss": _scalar(out, source, "total_loss")}
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return {"total_loss": _scalar(loss, source, "loss")}
    if isinstance(out, Mapping) and out:
        if "loss" in out and not all(isinstance(v, torch.Tensor) and v.numel() == 1 for v in out.values()):
            # A model output that holds more than losses ({"loss": ..., "logits": ...}).
            loss = out["loss"]
            if not isinstance(loss, torch.Tensor):
                raise TypeError(f"{source} returned a dict whose 'loss' is a {type(loss).__name__}, not a loss tensor")
            return {"total_loss": _scalar(loss, source, "loss")}
        for name, value in out.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{source} returned a dict whose entry '{name}' is a {type(value).__name__}, not a loss tensor")
            if value.numel() != 1:
                raise ValueError(
                    f"{source} returned a dict with keys {sorted(map(str, out))}, no 'loss' among them, and "
                    f"'{name}' of shape {tuple(value.shape)} is not a scalar loss{_hint(source)}"
                )
        if "total_loss" in out:
            raise ValueError(f"{source} returned a loss named 'total_loss'; that name is kept for the sum of the losses")
        losses = dict(out)
        losses["total_loss"] = sum(out.values())
        return losses
    raise TypeError(
        f"{source} returned {type(out).__name__}; expected a scalar loss tensor, a dict of scalar "
        f"losses, or an object with a .loss attribute{_hint(source)}"
    )


def _scalar(value: torch.Tensor, source: str, name: str) -> torch.Tensor:
    if value.numel() != 1:
        raise ValueError(
            f"{source} returned loss '{name}' of shape {tuple(value.shape)}; a loss must be a scalar "
            f"(reduce it, e.g. with .mean()){_hint(source)}"
        )
    return value


def _hint(source: str) -> str:
    return "; a model that returns predictions needs a loss_fn" if source == MODEL else ""


def loss_source(compute_loss: Callable[..., Any]) -> str:
    """How errors name a ``compute_loss`` of the user's: ``"MyTrainer.compute_loss"``
    for a method, ``"compute_loss=fn"`` for a function."""
    owner = getattr(compute_loss, "__self__", None)
    name = getattr(compute_loss, "__name__", type(compute_loss).__name__)
    return f"{type(owner).__name__}.{name}" if owner is not None else f"compute_loss={name}"


@register_metric("loss", higher_is_better=False)
class LossEvaluator(StatisticsEvaluator):
    """``loss``: the mean loss per sample over the dataset, by the training
    step's loss contract (the module docstring).

    With ``loss_fn``, each batch is ``(inputs, targets)`` (or a dict with
    ``target_key``) and its loss is ``loss_fn(outputs, targets)``. With
    ``compute_loss`` (a ``Trainer`` subclass's), the loss is
    ``compute_loss(batch)`` and the model's outputs are not read. Without
    either, the model's outputs are the loss.

    A scalar loss is taken as the batch's mean and weighted by the batch size
    (the first dimension of the targets, or of the batch's first tensor
    without ``loss_fn``), so a short last batch counts for what it holds. A
    ``loss_fn`` may also return one loss per sample (``reduction="none"``),
    which is summed and counted element by element. Sums are kept in float64.
    """

    def __init__(
        self,
        metrics: Sequence[str] = ("loss",),
        *,
        loss_fn: Optional[LossFn] = None,
        target_key: str = "labels",
        compute_loss: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        names = metric_names(metrics)
        if names != ["loss"]:
            raise ValueError(f"LossEvaluator computes only ['loss'], got {names}")
        for name, fn in (("loss_fn", loss_fn), ("compute_loss", compute_loss)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, got {fn!r}")
        if loss_fn is not None and compute_loss is not None:
            raise ValueError("LossEvaluator takes loss_fn or compute_loss, not both (compute_loss replaces loss_fn)")
        self.loss_fn = loss_fn
        self.target_key = target_key
        self.compute_loss = compute_loss
        super().__init__()

    def init_statistics(self) -> Dict[str, torch.Tensor]:
        return {
            "loss_sum": torch.zeros((), dtype=torch.float64),
            "count": torch.zeros((), dtype=torch.int64),
        }

    def batch_loss(self, inputs: Any, outputs: Any) -> torch.Tensor:
        """The loss of one batch (``outputs`` are the model's for ``inputs``):
        a scalar, or one value per sample from a ``loss_fn`` that returns them."""
        if self.compute_loss is not None:
            return as_losses(self.compute_loss(inputs), loss_source(self.compute_loss))["total_loss"]
        if self.loss_fn is None:
            return as_losses(outputs, MODEL)["total_loss"]
        loss = self.loss_fn(outputs, get_targets(inputs, self.target_key, type(self).__name__))
        if isinstance(loss, torch.Tensor) and loss.dim() > 0 and loss.numel() > 1:
            return loss  # one loss per sample: counted element by element
        return as_losses(loss, LOSS_FN)["total_loss"]

    def process(self, inputs: Any, outputs: Any) -> None:
        who = type(self).__name__
        loss = self.batch_loss(inputs, outputs).detach()
        loss = loss.to(float_accumulator_dtype(loss.device))
        if loss.numel() == 1:
            size_source = get_targets(inputs, self.target_key, who) if self.loss_fn is not None else inputs
            n = batch_size(size_source)
            if n is None:
                raise ValueError(
                    f"{who}: cannot tell the batch size of a {type(size_source).__name__} to weight "
                    "the batch's mean loss; return one loss per sample instead"
                )
            self.update("loss_sum", loss.reshape(()) * n)
        else:
            n = loss.numel()
            self.update("loss_sum", loss.sum())
        self.update("count", n, device=loss.device)

    def compute(self, stats: Dict[str, torch.Tensor]) -> Results:
        count = int(stats["count"])
        if count == 0:
            raise ValueError(f"{type(self).__name__}: no samples were processed; is the data loader empty?")
        return {"loss": stats["loss_sum"] / count}


def evaluator_loss_fn(evaluator: Any) -> Optional[LossFn]:
    """The ``loss_fn`` of the :class:`LossEvaluator` in ``evaluator`` (itself,
    or one of a :class:`~treadle.evaluation.DatasetEvaluators`), or None:
    what an evaluation feeds the model by when the step has no ``loss_fn``
    (a model whose outputs a ``loss_fn`` reads returns predictions, and gets
    the inputs without the targets)."""
    members = evaluator.evaluators if isinstance(evaluator, DatasetEvaluators) else [evaluator]
    for member in members:
        found = member.loss_fn if isinstance(member, LossEvaluator) else (
            evaluator_loss_fn(member) if isinstance(member, DatasetEvaluators) else None
        )
        if found is not None:
            return found
    return None
