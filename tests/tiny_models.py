"""Small models built from configs (random weights, nothing downloaded) and small data, for tests."""

from __future__ import annotations

import torch

VOCAB = 32
SEQ = 16


def tiny_gpt2(seed: int = 0):
    """A two-layer GPT-2 from a config: Hugging Face's own class, no wrapper."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


class CountingTokens(torch.utils.data.Dataset):
    """Sequences that count up modulo the vocabulary from a random start, as
    Hugging Face batches (``input_ids``, ``attention_mask``, ``labels``): the
    next token is learnable, so the loss falls within a few dozen steps."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (n, 1), generator=g)
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def classification(n: int = 256, seed: int = 0) -> torch.utils.data.TensorDataset:
    """Six features, two classes: the sign of the first three's sum."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    return torch.utils.data.TensorDataset(x, y)


def _recurse(depth: int, x: torch.Tensor) -> torch.Tensor:
    return x if depth == 0 else _recurse(depth - 1, x)


class DeepForward(torch.nn.Module):
    """A linear layer whose forward goes 300 Python frames deep: more than
    one 16 KiB chunk of CPython's frame stack, wherever it starts."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(_recurse(300, x))


def minor_faults() -> int:
    """The process's minor page faults so far (Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
