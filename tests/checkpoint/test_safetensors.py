"""safetensors: model_final exported as .safetensors, and weights read from
.safetensors files and Hugging Face model folders (sharded with an index)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.tiny_models import classification
from treadle.checkpoint import CheckpointError, Checkpointer, init_weights_from
from treadle.checkpoint.safetensors_io import load_safetensors_weights, save_safetensors_weights
from treadle.data import build_train_loader
from treadle.engine import EagerStep, TrainerBase
from treadle.hooks import PeriodicCheckpointer

transformers = pytest.importorskip("transformers")


def tiny_bert(num_labels: int, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=40,
        max_position_embeddings=64, num_labels=num_labels,
    )
    return transformers.BertForSequenceClassification(config)


def test_model_final_is_exported_as_safetensors_and_loads_into_a_fresh_model(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = build_train_loader(classification(), total_batch_size=16, shuffle=True, seed=0)
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy))
    checkpointer = Checkpointer(model, str(tmp_path), optimizer=optimizer, trainer=trainer)
    trainer.register_hooks([PeriodicCheckpointer(checkpointer, 100, export_safetensors=True)])
    trainer.train(0, 7)
    exported = load_file(str(tmp_path / "model_final.safetensors"))
    assert sorted(exported) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(exported[key], value), key

    torch.manual_seed(9)
    fresh = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    Checkpointer(fresh).load(str(tmp_path / "model_final.safetensors"), strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_tied_weights_are_exported_as_copies(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    save_safetensors_weights(model.state_dict(), str(tmp_path / "gpt2.safetensors"))
    loaded = load_safetensors_weights(str(tmp_path / "gpt2.safetensors"))
    assert torch.equal(loaded["lm_head.weight"], loaded["transformer.wte.weight"])
    assert torch.equal(loaded["lm_head.weight"], model.lm_head.weight)


def test_a_sharded_hugging_face_folder_loads_with_the_mismatch_table(tmp_path, treadle_caplog):
    pretrained = tiny_bert(num_labels=3)
    folder = tmp_path / "bert"
    pretrained.save_pretrained(str(folder), max_shard_size="40KB")
    names = sorted(os.listdir(folder))
    assert "model.safetensors.index.json" in names
    assert len([n for n in names if n.endswith(".safetensors")]) > 1, names

    finetuned = tiny_bert(num_labels=5, seed=1)  # a new head: 5 labels
    report = init_weights_from(finetuned, str(folder))
    assert sorted(m.key for m in report.shape_mismatched) == ["classifier.bias", "classifier.weight"]
    assert not report.missing and not report.unexpected
    own = finetuned.state_dict()
    for key, value in pretrained.state_dict().items():
        if not key.startswith("classifier."):
            assert torch.equal(own[key], value), key
    table = treadle_caplog.text
    assert "shape mismatch" in table and "classifier.weight" in table and "(3, 32)" in table and "(5, 32)" in table

    # The same folder through the Checkpointer (train.init_checkpoint's path).
    other = tiny_bert(num_labels=3, seed=2)
    Checkpointer(other).load(str(folder), checkpointables=[], strict=True)
    for key, value in pretrained.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


def test_broken_safetensors_sources_are_one_line_errors(tmp_path):
    folder = tmp_path / "bert"
    tiny_bert(num_labels=3).save_pretrained(str(folder), max_shard_size="40KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (folder / shard).unlink()
    with pytest.raises(CheckpointError, match=f"Weights file '.*{shard}' does not exist") as raised:
        load_safetensors_weights(str(folder))
    assert "\n" not in str(raised.value)

    cut = tmp_path / "cut.safetensors"
    save_safetensors_weights({"w": torch.ones(100)}, str(cut))
    cut.write_bytes(cut.read_bytes()[:-50])
    with pytest.raises(CheckpointError, match="is truncated or not a safetensors file") as raised:
        load_safetensors_weights(str(cut))
    assert "\n" not in str(raised.value)


def test_export_safetensors_is_a_config_key_and_the_file_initializes_a_run(tmp_path):
    from treadle.tools.train_net import cli

    first = tmp_path / "first"
    assert cli([f"train.output_dir={first}", "train.max_iter=10", "train.eval_period=0",
                "train.checkpointer.export_safetensors=True"]) == 0
    weights = first / "model_final.safetensors"
    assert weights.is_file()
    saved = torch.load(first / "model_final.pth", weights_only=True)["model"]
    exported = load_file(str(weights))
    assert all(torch.equal(exported[k], v) for k, v in saved.items())
    # Evaluated from the .safetensors file: the same results as from model_final.pth.
    assert cli(["--eval-only", f"train.output_dir={tmp_path / 'e1'}", f"train.init_checkpoint={weights}"]) == 0
    assert cli(["--eval-only", f"train.output_dir={tmp_path / 'e2'}", f"train.init_checkpoint={first / 'model_final.pth'}"]) == 0
    results = [json.loads(next((tmp_path / e).rglob("results.json")).read_text())["results"] for e in ("e1", "e2")]
    assert results[0] == results[1] and "accuracy" in results[0]
