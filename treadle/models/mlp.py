"""A multilayer perceptron classifier, the example model for small tabular or image sets."""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import nn

__all__ = ["MLPClassifier"]

_NORMS = (None, "batch", "layer")


def _check_positive_int(owner: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


class MLPClassifier(nn.Module):
    """Maps features of size ``input_dim`` to ``num_classes`` logits.

    Each hidden layer is ``Linear -> norm -> ReLU -> Dropout``; the last layer
    is a plain ``Linear`` (the logits, for ``cross_entropy``). Inputs of shape
    ``(N, input_dim)`` or ``(N, *)`` with ``input_dim`` elements per sample
    (``(N, 1, 8, 8)`` images, say) are accepted: they are flattened from dim 1.

    Args:
        input_dim: features per sample.
        num_classes: number of logits.
        hidden_dims: widths of the hidden layers; ``()`` gives a linear classifier.
        dropout: dropout probability after each hidden layer, in ``[0, 1)``.
        norm: ``None``, ``"batch"`` (``BatchNorm1d``: train with batches of
            more than one sample) or ``"layer"`` (``LayerNorm``).
    """

    def __init__(
        self,
        input_dim: int,
        num_classes: int,
        hidden_dims: Sequence[int] = (128, 64),
        dropout: float = 0.1,
        norm: Optional[str] = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.input_dim = _check_positive_int(owner, "input_dim", input_dim)
        self.num_classes = _check_positive_int(owner, "num_classes", num_classes)
        if isinstance(hidden_dims, (str, bytes)) or not isinstance(hidden_dims, Sequence):
            raise TypeError(f"{owner}: hidden_dims must be a sequence of ints, got {hidden_dims!r}")
        widths = [_check_positive_int(owner, f"hidden_dims[{i}]", d) for i, d in enumerate(hidden_dims)]
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"{owner}: dropout must be a float in [0, 1), got {dropout!r}")
        if norm not in _NORMS:
            raise ValueError(f"{owner}: norm must be None, 'batch' or 'layer', got {norm!r}")

        layers: List[nn.Module] = []
        width_in = self.input_dim
        for width in widths:
            layers.append(nn.Linear(width_in, width))
            if norm == "batch":
                layers.append(nn.BatchNorm1d(width))
            elif norm == "layer":
                layers.append(nn.LayerNorm(width))
            layers.append(nn.ReLU(inplace=True))
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width_in = width
        layers.append(nn.Linear(width_in, self.num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Returns logits of shape ``(N, num_classes)``."""
        x = x.flatten(1) if x.dim() > 2 else x
        # A shape check, not a data check: torch.compile turns it into a guard.
        if x.dim() != 2 or x.shape[1] != self.input_dim:
            raise ValueError(
                f"{type(self).__name__}: expected inputs of shape (N, {self.input_dim}), got {tuple(x.shape)}"
            )
        return self.layers(x)
