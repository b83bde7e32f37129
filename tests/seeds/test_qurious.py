"""qurious' ``Trainer(model, optimizer, loss_fn)`` documentation, translated to treadle.

Source: ``shared/seeds/003_*.txt``. Each test is one of its documented
workflows, with treadle's names (``docs/coming_from/qurious.md``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from treadle.trainer import Trainer

from tests.tiny_models import CountingTokens, tiny_gpt2


def regression_data(n=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def test_basic_usage(tmp_path):
    # 1. Define your model
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    # 2. Prepare your dataset and dataloader
    dataloader = DataLoader(regression_data(), batch_size=32, shuffle=True)
    # 3. Define optimizer and loss function
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    loss_fn = nn.MSELoss()
    # 4.-5. Initialize the trainer and train: num_epochs is max_epochs, save_dir is output_dir
    trainer = Trainer(model, optimizer, dataloader, loss_fn=loss_fn, max_epochs=5,
                      output_dir=str(tmp_path / "checkpoints"), progress_bar=False)
    history = trainer.train().to_dict()

    assert history["epoch"] == [0, 1, 2, 3, 4]
    assert len(history["train_loss"]) == 5 and history["train_loss"][-1] < history["train_loss"][0] / 2
    assert (tmp_path / "checkpoints" / "model_final.pth").exists()


def test_training_with_callbacks_best_model_and_early_stopping(tmp_path):
    logged = []

    def log_metrics_callback(trainer, epoch, metrics):
        """Custom callback to log metrics"""
        logged.append((epoch + 1, metrics["train_loss"], metrics.get("eval_loss")))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    trainer = Trainer(
        model, torch.optim.Adam(model.parameters(), lr=0.01), DataLoader(regression_data(), batch_size=32, shuffle=True),
        loss_fn=nn.MSELoss(), eval_loader=DataLoader(regression_data(200, seed=1), batch_size=50),
        max_epochs=10, callbacks=[log_metrics_callback], best_metric="eval_loss", early_stopping_patience=2,
        output_dir=str(tmp_path), progress_bar=False,
    )
    trainer.train()
    assert [epoch for epoch, _, _ in logged][:3] == [1, 2, 3]
    assert all(eval_loss is not None for _, _, eval_loss in logged)  # each epoch's evaluation, the last included
    best = torch.load(tmp_path / "model_best.pth", weights_only=True)
    assert best["trainer"]["hooks"]["BestCheckpointer"]["best_metric"] == min(e for _, _, e in logged)


def _epochs_by_hand(lr, data, max_epochs, patience):
    """The same training as a plain PyTorch loop, with qurious' early stopping on the epoch's
    ``train_loss`` (the mean over its batches): each epoch's mean and weights, until it stops."""
    torch.manual_seed(0)
    model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    train_loss, weights, best, waited = [], [], None, 0
    for _ in range(max_epochs):
        losses = []
        for x, y in DataLoader(data, batch_size=16):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        train_loss.append(sum(losses) / len(losses))
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        if best is None or train_loss[-1] < best:
            best, waited = train_loss[-1], 0
        else:
            waited += 1
            if waited >= patience:
                break
    return train_loss, weights


@pytest.mark.parametrize("with_eval", [False, True])
def test_best_model_and_early_stopping_on_train_loss_read_the_epochs_train_loss(tmp_path, with_eval):
    """best_model_metric="train_loss" is the history's train_loss, the epoch's mean: it was the epoch's last
    batch, whose lowest is epoch 1 here (the mean's is epoch 2), and which stops a run of 4 epochs after 3."""
    data = regression_data(96)
    torch.manual_seed(0)
    model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    trainer = Trainer(
        model, optimizer, DataLoader(data, batch_size=16), loss_fn=nn.MSELoss(),
        eval_loader=DataLoader(regression_data(32, seed=1), batch_size=16) if with_eval else None,
        max_epochs=6, best_metric="train_loss", early_stopping_patience=1, output_dir=str(tmp_path),
        progress_bar=False,
    )
    history = trainer.train().to_dict()

    train_loss, weights = _epochs_by_hand(0.25, data, max_epochs=6, patience=1)
    assert len(train_loss) == 4  # epoch 3 is no better than epoch 2
    assert history["train_loss"] == pytest.approx(train_loss)
    best = min(range(len(train_loss)), key=train_loss.__getitem__)
    assert best == 2
    saved = torch.load(tmp_path / "model_best.pth", weights_only=True)
    assert saved["iteration"] == 6 * best + 5
    for name, value in weights[best].items():
        torch.testing.assert_close(saved["model"][name], value)


def test_single_steps_and_load_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data = DataLoader(regression_data(), batch_size=32)
    trainer = Trainer(model, optimizer, data, loss_fn=nn.MSELoss(), eval_loader=data, max_epochs=1, progress_bar=False)
    batch = next(iter(data))
    first = trainer.train_step(batch)["loss"]
    for _ in range(20):
        last = trainer.train_step(batch)["loss"]
    assert isinstance(last, float) and last < first
    assert trainer.eval_step(batch)["loss"] < first
    trainer.save_checkpoint(str(tmp_path / "step20.pt"))

    torch.manual_seed(1)
    other_model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    other = Trainer(other_model, torch.optim.Adam(other_model.parameters(), lr=0.01), data, loss_fn=nn.MSELoss(),
                    max_epochs=1, progress_bar=False)
    other.load_checkpoint(str(tmp_path / "step20.pt"), load_optimizer=True, load_scheduler=True)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other_model.parameters()))


def test_fine_tuning_a_hugging_face_model(tmp_path):
    """``loss_fn=None``: Hugging Face models compute their loss from the batch's labels."""
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    trainer = Trainer(model, optimizer, DataLoader(CountingTokens(64), batch_size=8, shuffle=True), loss_fn=None,
                      eval_loader=DataLoader(CountingTokens(16, seed=1), batch_size=8), max_epochs=3,
                      output_dir=str(tmp_path), progress_bar=False, seed=0)
    history = trainer.train().to_dict()
    assert history["eval_loss"][-1] < history["eval_loss"][0]
