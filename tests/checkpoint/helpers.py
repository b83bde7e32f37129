"""What the checkpoint tests share: small models, checkpointables, log and folder readers."""

import os

import torch
from torch import nn

from treadle.checkpoint import (
    unwrap_model,
)


class Net(nn.Module):
    """A backbone and a head, like a classifier being fine-tuned."""

    def __init__(self, num_classes: int = 3, width: int = 4):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(2, width), nn.BatchNorm1d(width))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


class Counter:
    """A custom checkpointable (an EMA, a hook, a data position...)."""

    def __init__(self, value: int = 0):
        self.value = value
        self.history = [float(value)]

    def state_dict(self):
        return {"value": self.value, "history": list(self.history)}

    def load_state_dict(self, state):
        self.value = state["value"]
        self.history = list(state["history"])


class StateOf:
    """A checkpointable whose state is whatever the test puts in it."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def trained(seed: int = 0, num_classes: int = 3):
    """A model and an Adam optimizer after one step, so that the optimizer has state."""
    torch.manual_seed(seed)
    model = Net(num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 2)).sum().backward()
    opt.step()
    return model, opt


def assert_same_weights(a: nn.Module, b: nn.Module):
    sa, sb = unwrap_model(a).state_dict(), unwrap_model(b).state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def messages(caplog, level=None):
    """Distinct log messages (the 'treadle' handler and the root one both see each record)."""
    return list(dict.fromkeys(r.getMessage() for r in caplog.records if level is None or r.levelno == level))


def read_pointer(d) -> str:
    return (d / "last_checkpoint").read_text()


def visible_and_hidden(d):
    return sorted(os.listdir(d))
