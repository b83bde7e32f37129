"""Tests of treadle.models: the MLP classifier and the causal character transformer."""

import pytest
import torch
import torch.nn.functional as F

from treadle.data.datasets import DigitsDataset
from treadle.models import CharTransformerLM, LMCrossEntropy, MLPClassifier, lm_cross_entropy


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run as fast on one thread, and one thread does not stall when
    other processes share the cores (conftest restores the thread count)."""
    torch.set_num_threads(1)

# ------------------------------------------------------------------------ MLP


@pytest.mark.parametrize("norm", [None, "batch", "layer"])
def test_mlp_shapes_and_layers(norm):
    model = MLPClassifier(64, 10, hidden_dims=(32, 16), dropout=0.1, norm=norm)
    assert model(torch.randn(5, 64)).shape == (5, 10)
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)  # flattened from dim 1
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.LayerNorm))]
    assert len(norms) == (0 if norm is None else 2)
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(64, 32), (32, 16), (16, 10)]


def test_mlp_without_hidden_layers_is_linear():
    model = MLPClassifier(4, 3, hidden_dims=(), dropout=0.0)
    x = torch.randn(2, 4)
    (layer,) = model.layers
    assert torch.equal(model(x), layer(x))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(input_dim=0, num_classes=10), "input_dim must be a positive int"),
        (dict(input_dim=64, num_classes=10, hidden_dims=(32, 0)), r"hidden_dims\[1\] must be"),
        (dict(input_dim=64, num_classes=10, dropout=1.0), "dropout must be"),
        (dict(input_dim=64, num_classes=10, norm="group"), "norm must be None, 'batch' or 'layer'"),
    ],
)
def test_mlp_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLPClassifier(**kwargs)


def test_mlp_names_the_expected_input_shape():
    with pytest.raises(ValueError, match=r"MLPClassifier: expected inputs of shape \(N, 64\), got \(2, 63\)"):
        MLPClassifier(64, 10)(torch.randn(2, 63))


def test_mlp_learns_digits_above_90_percent():
    # 8 epochs of 23 batches: well under a second on one idle core (~96%
    # accuracy); no wall-clock assertion, which shared CI machines would flake.
    train, test = DigitsDataset("train"), DigitsDataset("test")
    model = MLPClassifier(train.input_dim, train.num_classes, hidden_dims=(128, 64), dropout=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True)
    model.train()
    for _ in range(8):
        for images, labels in loader:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    images, labels = next(iter(torch.utils.data.DataLoader(test, batch_size=len(test))))
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    assert accuracy > 0.9


# ---------------------------------------------------------------- transformer


def _tiny_lm(**kwargs):
    defaults = dict(vocab_size=98, seq_len=16, dim=32, depth=2, heads=4, dropout=0.0)
    defaults.update(kwargs)
    return CharTransformerLM(**defaults)


def test_transformer_shapes():
    model = _tiny_lm()
    ids = torch.randint(0, 98, (3, 16))
    assert model(ids).shape == (3, 16, 98)
    assert model(ids[:, :5]).shape == (3, 5, 98)  # shorter than seq_len is fine
    with pytest.raises(ValueError, match="sequence length 17 exceeds seq_len=16"):
        model(torch.randint(0, 98, (1, 17)))
    with pytest.raises(ValueError, match=r"expected ids of shape \(N, T\)"):
        model(torch.randint(0, 98, (16,)))


def test_transformer_is_causal():
    model = _tiny_lm().eval()
    ids = torch.randint(0, 98, (2, 16))
    changed = ids.clone()
    changed[:, 10] = (ids[:, 10] + 1) % 98
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_transformer_weight_tying():
    tied, untied = _tiny_lm(tie_weights=True), _tiny_lm()
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 98 * 32
    # The checkpoint format is unchanged: both names, loadable into a tied model.
    fresh = _tiny_lm(tie_weights=True)
    fresh.load_state_dict(tied.state_dict())
    assert torch.equal(fresh.head.weight, tied.tok_emb.weight)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=30, heads=4), "dim=30 is not a multiple of heads=4"),
        (dict(depth=0), "depth must be a positive int"),
        (dict(dropout=-0.1), "dropout must be"),
    ],
)
def test_transformer_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _tiny_lm(**kwargs)


def test_lm_cross_entropy_flattens_and_checks_shapes():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    expected = F.cross_entropy(logits.reshape(10, 7), targets.reshape(10))
    torch.testing.assert_close(lm_cross_entropy(logits, targets), expected)
    targets[0, 0] = -100
    masked = F.cross_entropy(logits.reshape(10, 7)[1:], targets.reshape(10)[1:])
    torch.testing.assert_close(lm_cross_entropy(logits, targets), masked)
    assert lm_cross_entropy(logits.bfloat16(), targets).dtype == torch.float32
    with pytest.raises(ValueError, match=r"expected logits \(N, T, V\) and targets \(N, T\)"):
        lm_cross_entropy(logits, targets[:, :4])


def test_lm_cross_entropy_reductions_and_module_form():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    per_token = lm_cross_entropy(logits, targets, reduction="none")
    assert per_token.shape == (2, 5)
    torch.testing.assert_close(per_token.mean(), lm_cross_entropy(logits, targets))
    torch.testing.assert_close(per_token.sum(), lm_cross_entropy(logits, targets, reduction="sum"))
    torch.testing.assert_close(LMCrossEntropy()(logits, targets), lm_cross_entropy(logits, targets))
    torch.testing.assert_close(LMCrossEntropy(reduction="none")(logits, targets), per_token)
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        LMCrossEntropy(reduction="avg")


def test_transformer_trains_on_a_repeating_sequence():
    torch.manual_seed(0)
    model = _tiny_lm()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pattern = torch.arange(17) % 5
    inputs, targets = pattern[:-1].expand(4, 16), pattern[1:].expand(4, 16)
    first = None
    for _ in range(60):
        loss = lm_cross_entropy(model(inputs), targets)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1 * first


def test_transformer_runs_under_bf16_autocast():
    model = _tiny_lm(dropout=0.1)
    ids = torch.randint(0, 98, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids)
        loss = lm_cross_entropy(logits, ids)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_transformer_compiles_in_one_graph():
    model = _tiny_lm()
    ids = torch.randint(0, 98, (2, 16))
    # fullgraph=True makes any graph break an error; aot_eager traces forward
    # and backward without needing a C++ compiler.
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    logits = compiled(ids)
    torch.testing.assert_close(logits, model(ids))
    lm_cross_entropy(logits, ids).backward()
    assert model.head.weight.grad is not None


@pytest.mark.slow
def test_transformer_compiles_with_inductor():
    model = _tiny_lm()
    ids = torch.randint(0, 98, (2, 16))
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(ids), model(ids), atol=1e-4, rtol=1e-4)


def test_generate_extends_the_prompt():
    model = _tiny_lm().eval()
    prompt = torch.randint(0, 98, (2, 3))
    out = model.generate(prompt, 20, top_k=5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 23) and torch.equal(out[:, :3], prompt)
    again = model.generate(prompt, 20, top_k=5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    assert int(out.max()) < 98
