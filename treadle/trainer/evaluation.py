"""How the plain ``Trainer`` evaluates: the forward, the metrics, the loss,
and the metric that best checkpoints and early stopping watch.

One :class:`TrainerEvaluation` serves the ``eval_loader``'s evaluations,
``evaluate(loader)`` and ``eval_step(batch)``:

- the batch reaches the model as in training (``model(inputs)`` with a
  ``loss_fn``, a dict without its ``"labels"``; the whole batch without
  one); with ``evaluate_with_generate``,
  ``model.generate(...)`` on the batch's inputs instead;
- the ``loss`` is computed as training computes it (a subclass's
  ``compute_loss``, else ``loss_fn``, else the model's own); with
  ``evaluate_with_generate`` it is the forward's, computed only where
  ``metrics`` ask for it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from treadle.evaluation import build_evaluator, forward_batch, inference_on_dataset
from treadle.evaluation import known_metric_mode, metric_mode, model_id2label
from treadle.evaluation.batch import move_to_device, training_forward
from treadle.evaluation.inference import inference_context
from treadle.evaluation.loss import LossEvaluator
from treadle.utils import comm
from treadle.utils.rng import get_rng_state, set_rng_state

from treadle.compat.overrides import PreparedBatches, StepResultsEvaluator

__all__ = ["TrainerEvaluation", "watches_training", "EVAL_PREFIXES", "TRAIN_PREFIXES"]

logger = logging.getLogger(__name__)

#: Prefixes other trainers put on the metric to watch (Hezar's
#: "evaluation.f1", the Hugging Face Trainer's "eval_loss"): the name in
#: treadle's storage is what follows.
EVAL_PREFIXES = ("eval/", "evaluation/", "eval.", "evaluation.", "eval_")
#: Prefixes naming a training scalar to watch ("train_loss"): the name in treadle's storage is what follows.
TRAIN_PREFIXES = ("train/", "train.", "train_")


def watches_training(metric: Optional[str]) -> bool:
    """Whether ``best_metric`` names a training scalar (``"train/loss"``), which needs no evaluation."""
    return bool(metric) and metric.startswith(TRAIN_PREFIXES)  # type: ignore[union-attr]


def _metric_name(metric: Any) -> Optional[str]:
    if isinstance(metric, str):
        return metric
    if isinstance(metric, (tuple, list)) and metric and isinstance(metric[0], str):
        return metric[0]
    return None


def _with_model_labels(metrics: List[Any], model: Any) -> List[Any]:
    """``metrics`` with the model's ``config.id2label`` given to a ``"seqeval"``
    that names no labels: Hezar's ``metrics=["seqeval"]`` reads them from
    its model, as a Hugging Face token classifier carries them."""
    labels = model_id2label(model)
    if labels is None:
        return metrics
    out = []
    for metric in metrics:
        if isinstance(metric, str) and metric == "seqeval":
            metric = ("seqeval", {"id2label": labels})
        elif (isinstance(metric, (tuple, list)) and len(metric) == 2 and metric[0] == "seqeval"
              and isinstance(metric[1], Mapping) and "id2label" not in metric[1]):
            metric = ("seqeval", {**metric[1], "id2label": labels})
        out.append(metric)
    return out


def _generate_forward(model: Any, batch: Any, *, options: Dict[str, Any]) -> Any:
    """The evaluation forward of ``evaluate_with_generate``: ``generate`` on the
    batch's inputs (a DDP wrapper's module generates)."""
    generate = getattr(model, "module", model).generate
    if isinstance(batch, Mapping):
        return generate(**{k: v for k, v in batch.items() if k != "labels"}, **options)
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return generate(batch[0], **options)
    return generate(batch, **options)


def _no_outputs(model: Any, batch: Any) -> None:
    """The evaluation forward where nothing reads the outputs (the loss is a compute_loss's)."""
    return None


def _shapes(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items() if isinstance(v, torch.Tensor))
    return type(batch).__name__


class TrainerEvaluation:
    """The plain ``Trainer``'s evaluation (see the module docstring).

    Args:
        model: the model as trained (wrapped on several processes).
        metrics: the ``Trainer``'s ``metrics`` (default ``["loss"]``).
        loss_fn, compute_loss: how training computes the loss
            (``compute_loss``: a subclass's override, which replaces ``loss_fn``).
        generate: ``generate()``'s options with ``evaluate_with_generate``, else None.
        batch_fn: ``batch_fn(batch) -> (outputs, loss)``, a subclass's
            override of an evaluation batch (pytorch-accelerated's
            ``calculate_eval_batch_loss``, Hezar's ``evaluation_step``): the
            outputs go to the metrics, the loss is the evaluation ``loss``.
        step_results: ``step_results(batch) -> {name: float}``, qurious'
            ``eval_step`` override: the results are each value's mean over the batches.
        prepare: a subclass's qurious ``_prepare_batch``: the metrics see
            each batch as the ``(inputs, targets)`` it makes.
    """

    def __init__(self, model: Any, *, metrics: Iterable[Any], loss_fn: Optional[Callable[[Any, Any], Any]],
                 compute_loss: Optional[Callable[[Any], Any]], generate: Optional[Dict[str, Any]],
                 batch_fn: Optional[Callable[[Any], Tuple[Any, Any]]] = None,
                 step_results: Optional[Callable[[Any], Dict[str, float]]] = None,
                 prepare: Optional[Callable[[Any], Tuple[Any, Any]]] = None) -> None:
        self.model = model
        self.metrics: List[Any] = list(metrics) or ["loss"]
        self.loss_fn = loss_fn
        self.generate = generate
        self.step_results = step_results
        self.prepare = prepare
        self._step_metrics: Any = None  # the metrics' evaluator of one_batch under a qurious eval_step
        # How a batch's loss is computed: as training computes it; where the
        # forward generates, by the training forward of its own.
        if batch_fn is not None:
            override = _OverrideForward(batch_fn)
            self.loss_options: Dict[str, Any] = {"compute_loss": override.loss}
        elif compute_loss is not None:
            self.loss_options = {"compute_loss": compute_loss}
        elif generate is not None:
            self.loss_options = {"compute_loss": self._forward_loss}
        else:
            self.loss_options = {"loss_fn": loss_fn} if loss_fn is not None else {}
        self._batch_loss = LossEvaluator(**self.loss_options)
        self._training_loss = LossEvaluator(loss_fn=loss_fn)
        if batch_fn is not None:
            self.forward: Callable[[Any, Any], Any] = override.forward
        elif generate is not None:
            self.forward = functools.partial(_generate_forward, options=generate)
        elif compute_loss is None:
            self.forward = training_forward(loss_fn)
        else:
            # A compute_loss runs the model itself: only metrics other than the loss need outputs.
            self.forward = _no_outputs if self.metric_names() == ["loss"] else forward_batch

    def metric_names(self) -> List[Optional[str]]:
        return [_metric_name(m) for m in self.metrics]

    @property
    def reports_loss(self) -> bool:
        """Whether ``eval_step`` reports the loss: always, but where the forward
        generates and ``metrics`` leave the loss out."""
        return self.generate is None or "loss" in self.metric_names()

    def build_evaluator(self) -> Any:
        """A new evaluator of ``metrics`` (the loss computed as training does);
        of a qurious ``eval_step``'s results."""
        if self.step_results is not None:
            return StepResultsEvaluator()
        return self._metrics_evaluator()

    def _metrics_evaluator(self) -> Any:
        metrics = _with_model_labels(self.metrics, self.model)
        evaluator = build_evaluator(metrics, **(self.loss_options if "loss" in self.metric_names() else {}))
        return PreparedBatches(evaluator, self.prepare) if self.prepare is not None else evaluator

    def _forward_loss(self, batch: Any) -> torch.Tensor:
        """The loss where the evaluation forward generates: the training
        forward's, on the same batch, explained in one line where the batch
        does not allow it (a decoder-only model's continuation labels)."""
        try:
            outputs = training_forward(self.loss_fn)(self.model, batch)
            return self._training_loss.batch_loss(batch, outputs).mean()
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(
                f"the evaluation 'loss' is the model's forward loss on the batch ({_shapes(batch)}), which this "
                f"batch does not allow ({type(e).__name__}: {first}); with evaluate_with_generate, leave 'loss' "
                "out of metrics where the labels are the text to generate rather than the inputs' next tokens"
            ) from e

    def check_forward_loss(self, loader: Optional[Iterable[Any]], device: torch.device) -> None:
        """Where the forward generates and ``metrics`` ask for the ``loss``,
        computes it on ``loader``'s first batch when the ``Trainer`` is built,
        so that a batch that does not allow it is refused then, not at the
        first evaluation after training. The random states are kept (a
        ``DataLoader`` draws its seed); a one-pass iterator is not read, nor
        is anything on several processes (a forward there may need them all)."""
        if self.generate is None or "loss" not in self.metric_names() or loader is None:
            return
        if isinstance(loader, Iterator) or comm.get_world_size() > 1:
            return
        state = get_rng_state()
        try:
            batch = next(iter(loader), None)
            if batch is not None:
                with torch.no_grad(), inference_context(self.model):
                    self._forward_loss(move_to_device(batch, device))
        finally:
            set_rng_state(state)

    def evaluate(self, loader: Iterable[Any], evaluator: Any, device: torch.device) -> Dict[str, Any]:
        """The metrics over ``loader`` (a qurious ``eval_step``'s results where a subclass overrides it)."""
        step_results = self.step_results
        forward = self.forward if step_results is None else (lambda model, batch: step_results(batch))
        return inference_on_dataset(self.model, loader, evaluator, device=device, forward=forward)

    @torch.no_grad()
    def one_batch(self, batch: Any, evaluator: Any, device: torch.device) -> Dict[str, float]:
        """``eval_step``: the loss (where reported) and the metrics of one batch, as floats."""
        if self.step_results is not None:
            # Called by a subclass's eval_step (super()): the metrics', not the eval_step's, evaluator,
            # built at the first call (it is reset for each batch below).
            if self._step_metrics is None:
                self._step_metrics = self._metrics_evaluator()
            evaluator = self._step_metrics
        batch = move_to_device(batch, device)
        out: Dict[str, float] = {}
        with inference_context(self.model):
            outputs = self.forward(self.model, batch)
            if self.reports_loss:
                out["loss"] = float(self._batch_loss.batch_loss(batch, outputs).float().mean())
            if evaluator is not None:
                evaluator.reset()
                evaluator.process(batch, outputs)
        if evaluator is not None:
            out.update({k: v for k, v in _flat_floats(evaluator.evaluate() or {}).items() if k != "loss"})
        return out

    # ------------------------------------------------------------------ the watched metric
    def watched(self, evaluator: Any, best_metric: Optional[str], best_mode: Optional[str],
                patience: Optional[int], *, recorded: bool = False) -> Tuple[Optional[str], Optional[str]]:
        """The storage name and direction of the metric that best checkpoints
        and early stopping watch, checked against the evaluation's results
        (unless ``recorded``: a subclass records results of its own at the
        evaluation's end, pytorch-accelerated's ``run_history.update_metric``
        in ``eval_epoch_end``, whose names are known only then)."""
        if best_metric is None and not patience:
            return None, None
        # validation.py checks configs (OmegaConf), which a plain Trainer never imports otherwise.
        from treadle.config.validation import check_watched_metric, warn_contradicting_mode

        # The key the warnings name: the metric given, or the one early stopping watches without it.
        given = ("best_metric", best_metric) if best_metric is not None else ("early stopping's metric", "loss")
        name = best_metric or "loss"
        if watches_training(name):
            name = next(name[len(p):] for p in TRAIN_PREFIXES if name.startswith(p))
            name = "total_loss" if name == "loss" else name
            warn_contradicting_mode("best_mode", best_mode, *given, known_metric_mode(name))
            return name, best_mode or metric_mode(name)
        name = next((name[len(p):] for p in EVAL_PREFIXES if name.startswith(p)), name)
        check_watched_metric("best_metric", name, None if recorded else getattr(evaluator, "result_names", None))
        declared = _declared_direction(evaluator, name)
        known = ("max" if declared else "min") if declared is not None else known_metric_mode(name)
        warn_contradicting_mode("best_mode", best_mode, *given, known)
        return name, best_mode or known or metric_mode(name)

    def with_loss_for_early_stopping(self, evaluator: Any, best_metric: Optional[str],
                                     patience: Optional[int]) -> Any:
        """The evaluator early stopping can watch: without ``best_metric`` it
        watches the evaluation ``loss``; where ``metrics`` leave it out, it is
        added, with a warning naming the settings (rather than an error about a
        ``best_metric`` the user never set)."""
        if best_metric is not None or not patience or evaluator is None:
            return evaluator
        known = getattr(evaluator, "result_names", None)
        if known is None or "loss" in known:
            return evaluator
        logger.warning(
            "early_stopping_patience=%r watches the evaluation 'loss' (no best_metric is given), which the "
            "metrics leave out (the evaluation computes: %s): the loss is evaluated too; give best_metric= to "
            "watch another metric", patience, ", ".join(sorted(known)),
        )
        self.metrics.append("loss")
        return self.build_evaluator()


class _OverrideForward:
    """The evaluation forward through a subclass's override that returns a
    batch's outputs and loss together: :meth:`forward` hands the outputs to
    the metrics and keeps the loss, which the ``loss`` metric reads right
    after, for the same batch (:meth:`loss`)."""

    def __init__(self, batch_fn: Callable[[Any], Tuple[Any, Any]]) -> None:
        self.batch_fn = batch_fn
        self._loss: Any = None

    def forward(self, model: Any, batch: Any) -> Any:
        outputs, self._loss = self.batch_fn(batch)
        return outputs

    def loss(self, batch: Any) -> Any:
        return self._loss


def _declared_direction(evaluator: Any, name: str) -> Optional[bool]:
    """``higher_is_better`` of a torchmetrics result ``name``, when one declares it."""
    parts = getattr(evaluator, "evaluators", None) or [evaluator]
    for part in parts:
        declared = getattr(part, "higher_is_better", None)
        if isinstance(declared, dict) and declared.get(name) is not None:
            return bool(declared[name])
    return None


def _flat_floats(results: Dict[str, Any], prefix: str = "") -> Dict[str, float]:
    out: Dict[str, float] = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat_floats(value, f"{name}/"))
        else:
            out[name] = float(value)
    return out
