"""Sharded evaluation over two gloo processes equals single-process evaluation."""

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from treadle.evaluation import build_evaluator, inference_on_dataset

WORLD = 2
N = 7  # odd, so the shards differ in size


def _datasets():
    g = torch.Generator().manual_seed(1234)
    words = ["a", "b", "c", "dd", "e"]

    def sentence():
        n = int(torch.randint(1, 5, (1,), generator=g))
        return " ".join(words[int(i)] for i in torch.randint(0, len(words), (n,), generator=g))

    # float64 logits: the per-batch losses computed by loss_fn then differ
    # between batchings only at float64 rounding.
    return {
        "classification": (torch.randn(N, 5, generator=g, dtype=torch.float64), torch.randint(0, 5, (N,), generator=g)),
        # Multiples of 1/4: their float64 sums are exact in any order.
        "regression": (torch.randint(-8, 8, (N,), generator=g) / 4, torch.randint(-8, 8, (N,), generator=g) / 4),
        "lm": (torch.randn(N, 3, 6, generator=g, dtype=torch.float64), torch.randint(-1, 6, (N, 3), generator=g)),
        "text": ([sentence() for _ in range(N)], [sentence() for _ in range(N)]),
        # Token classification: 5 IOB tags, -100 at padded positions.
        "tags": (torch.randn(N, 6, 5, generator=g), torch.randint(0, 5, (N, 6), generator=g).masked_fill(
            torch.rand(N, 6, generator=g) < 0.2, -100)),
    }


def _batches(pair, indices, size):
    inputs, targets = pair
    out = []
    for start in range(0, len(indices), size):
        idx = indices[start : start + size]
        if isinstance(inputs, list):
            out.append(([inputs[i] for i in idx], [targets[i] for i in idx]))
        else:
            out.append((inputs[idx], targets[idx]))
    return out


def _evaluate_all(indices, batch_size):
    """Every built-in metric over the samples at `indices` of each dataset."""
    data = _datasets()
    model = nn.Identity()

    def run(name, metrics, **options):
        loader = _batches(data[name], indices, batch_size)
        return inference_on_dataset(model, loader, build_evaluator(metrics, **options))

    results = {}
    results.update(run("classification", ["accuracy", "top2_accuracy", "precision", "recall", "f1"]))
    results.update(run("regression", ["mse", "mae"]))
    results.update(run("classification", ["loss"], loss_fn=F.cross_entropy))
    results.update(run("lm", ["perplexity"], ignore_index=-1))
    results.update(run("text", ["cer", "wer"]))
    results.update(run("tags", ["seqeval"], id2label=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]))
    return results


def _worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        # Interleaved shards (as an inference sampler gives), in batches of 2.
        sharded = _evaluate_all(list(range(rank, N, WORLD)), batch_size=2)
        # Rank 1 sees no batch at all, with num_classes left to be inferred.
        indices = list(range(N)) if rank == 0 else []
        empty_rank = inference_on_dataset(
            nn.Identity(), _batches(_datasets()["classification"], indices, 3), build_evaluator(["f1", "accuracy"])
        )
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"sharded": sharded, "empty_rank": empty_rank}, f)
    finally:
        dist.destroy_process_group()


def test_two_process_evaluation_equals_single_process(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0] == ranks[1]  # every rank returns the same results

    single = _evaluate_all(list(range(N)), batch_size=3)
    sharded = ranks[0]["sharded"]
    assert list(sharded) == list(single)
    # Integer statistics (counts, confusion matrix, edit distances) and sums of
    # exactly representable values are equal bit for bit.
    exact = ["accuracy", "top2_accuracy", "precision", "recall", "f1", "mse", "mae", "cer", "wer", "seqeval"]
    assert {k: sharded[k] for k in exact} == {k: single[k] for k in exact}
    # Sums of arbitrary floats differ only by float64 rounding of the order of addition.
    assert sharded["loss"] == pytest.approx(single["loss"], rel=1e-12)
    assert sharded["perplexity"] == pytest.approx(single["perplexity"], rel=1e-12)

    whole = _evaluate_all(list(range(N)), batch_size=3)
    assert ranks[0]["empty_rank"] == {"f1": whole["f1"], "accuracy": whole["accuracy"]}
