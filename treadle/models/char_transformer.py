"""A small causal transformer language model, the example model for character corpora.

Written to be a fair workload for the engine's step objects: the forward has
no Python control flow that depends on tensor values, so ``torch.compile``
captures it in one graph (``fullgraph=True`` works), and it runs under bf16
autocast (layer norms and the loss stay in float32).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CharTransformerLM", "lm_cross_entropy", "LMCrossEntropy"]


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"CharTransformerLM: {name} must be a positive int, got {value!r}")
    return value


class _CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` sees positions ``<= t`` only."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.attn_dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        # (N, T, 3C) -> three (N, heads, T, C / heads)
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        # is_causal: the mask is implied, never materialized; fused kernels apply.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(n, t, c)
        return self.resid_dropout(self.proj(y))


class _FeedForward(nn.Module):
    """The position-wise MLP of a block: ``Linear -> GELU -> Linear``."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x))))


class _Block(nn.Module):
    """A pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = _CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = _FeedForward(dim, hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformerLM(nn.Module):
    """A decoder-only transformer that predicts the next token at every position.

    Token embedding plus a learned positional embedding, ``depth`` pre-LayerNorm
    blocks of causal self-attention (``scaled_dot_product_attention(is_causal=True)``)
    and GELU MLP, a final LayerNorm and a linear head. ``forward(ids)`` maps
    int64 ids ``(N, T)``, ``T <= seq_len``, to logits ``(N, T, vocab_size)``;
    the logits at position ``t`` depend on ``ids[:, :t + 1]`` only.

    Weights are initialized GPT-2 style: normal(0, 0.02), the projections
    that write into the residual stream scaled by ``1 / sqrt(2 * depth)`` so
    that its variance does not grow with depth.

    Args:
        vocab_size: number of token ids (98 for :class:`treadle.data.datasets.CharCorpusDataset`).
        seq_len: longest input; the size of the positional embedding.
        dim: model width; a multiple of ``heads``.
        depth: number of blocks.
        heads: attention heads per block.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        dropout: dropout on embeddings, attention weights and residual branches.
        tie_weights: share the head's weight with the token embedding
            (fewer parameters; the state dict then holds the tensor under both names).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int = 128,
        dim: int = 128,
        depth: int = 2,
        heads: int = 4,
        mlp_ratio: Union[int, float] = 4,
        dropout: float = 0.0,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        self.vocab_size = _check_positive_int("vocab_size", vocab_size)
        self.seq_len = _check_positive_int("seq_len", seq_len)
        self.dim = _check_positive_int("dim", dim)
        self.depth = _check_positive_int("depth", depth)
        self.heads = _check_positive_int("heads", heads)
        if dim % heads != 0:
            raise ValueError(f"CharTransformerLM: dim={dim} is not a multiple of heads={heads}")
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or int(dim * mlp_ratio) < 1:
            raise ValueError(f"CharTransformerLM: mlp_ratio must be a positive number, got {mlp_ratio!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"CharTransformerLM: dropout must be a float in [0, 1), got {dropout!r}")
        self.tie_weights = bool(tie_weights)

        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Parameter(torch.empty(seq_len, dim))
        self.drop = nn.Dropout(dropout)
        hidden = int(dim * mlp_ratio)
        self.blocks = nn.ModuleList(_Block(dim, heads, hidden, float(dropout)) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.reset_parameters()
        if self.tie_weights:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """(Re)initializes every weight as the class docstring says."""
        std = 0.02
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.pos_emb, mean=0.0, std=std)
        # Each block adds two branches to the residual stream.
        residual_std = std / math.sqrt(2 * self.depth)
        for block in self.blocks:
            assert isinstance(block, _Block)
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.fc2.weight, mean=0.0, std=residual_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Returns logits ``(N, T, vocab_size)`` for int64 ids ``(N, T)``."""
        # Shape checks only (guards under torch.compile); ids' values are
        # checked by the embedding.
        if ids.dim() != 2:
            raise ValueError(f"CharTransformerLM: expected ids of shape (N, T), got {tuple(ids.shape)}")
        t = ids.shape[1]
        if t > self.seq_len:
            raise ValueError(f"CharTransformerLM: sequence length {t} exceeds seq_len={self.seq_len}")
        x = self.drop(self.tok_emb(ids) + self.pos_emb[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(
        self,
        ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Extends ``ids`` ``(N, T0)`` by ``max_new_tokens`` sampled tokens; returns ``(N, T0 + max_new_tokens)``.

        Each step feeds the last ``seq_len`` tokens and samples from the
        softmax of the last logits divided by ``temperature``, restricted to
        the ``top_k`` most likely tokens when given. For looking at what a
        model learned, not for speed (no key/value cache). The caller sets
        eval mode.
        """
        if ids.dim() != 2 or ids.shape[1] < 1:
            raise ValueError(f"generate: expected ids of shape (N, T) with T >= 1, got {tuple(ids.shape)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if not temperature > 0:
            raise ValueError(f"generate: temperature must be positive, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"generate: top_k must be a positive int or None, got {top_k!r}")
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.seq_len :])[:, -1, :].float() / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            next_id = torch.multinomial(probs, 1, generator=generator)
            ids = torch.cat([ids, next_id], dim=1)
        return ids


_REDUCTIONS = ("mean", "sum", "none")


def lm_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """Next-token cross-entropy of logits ``(N, T, V)`` against targets ``(N, T)``.

    The positions are flattened, so ``"mean"`` (the default) is the mean over
    all ``N * T`` tokens; ``"sum"`` their sum; ``"none"`` the per-token losses,
    shape ``(N, T)``. Targets equal to ``ignore_index`` do not count (and are 0
    with ``"none"``). Computed in float32 whatever the logits' dtype: bf16
    logits lose too much precision in the log-softmax. Usable as the
    ``loss_fn`` of a step object or an evaluator.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"lm_cross_entropy: expected logits (N, T, V) and targets (N, T), got "
            f"{tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if reduction not in _REDUCTIONS:
        raise ValueError(f"lm_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=ignore_index,
        reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss


class LMCrossEntropy(nn.Module):
    """:func:`lm_cross_entropy` as a module, for configs: ``L(LMCrossEntropy)()``.

    Like ``torch.nn.CrossEntropyLoss`` for ``(N, C)`` logits, but for a
    language model's ``(N, T, V)`` logits and ``(N, T)`` targets.
    """

    def __init__(self, *, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"LMCrossEntropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of ``(N, T, V)`` logits against ``(N, T)`` targets."""
        return lm_cross_entropy(logits, targets, ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
