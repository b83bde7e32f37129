"""What each page's examples take as given: the setup of tests/docs/examples.py.

One entry per page (its path) or docstring (the object's qualified name)
that has examples; a page whose examples need nothing has none. A setup
makes the objects the page's text introduces before its code (a ``model``,
an ``optimizer``, a dataset), small enough to run in seconds; it never
makes the calls the example shows.
"""

from __future__ import annotations

from typing import Dict

#: Every setup starts with this.
COMMON = """
import argparse, shutil, sys
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
REPO = pathlib.Path(os.environ["TREADLE_REPO"])
"""

#: A small classifier on the digits data, with its optimizer and loaders.
DIGITS = """
from treadle.data.datasets import DigitsDataset
train_set, test_set = DigitsDataset("train"), DigitsDataset("test")
train_dataset, val_dataset = train_set, test_set
model = nn.Linear(64, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scheduler = sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
train_loader = loader = torch.utils.data.DataLoader(train_set, batch_size=16, shuffle=True)
val_loader = torch.utils.data.DataLoader(test_set, batch_size=64)
"""

#: A trainer around DIGITS' model, and the command line of a script that resumes.
TRAINER = """
from treadle.engine import EagerStep, TrainerBase
from treadle.events import CommonMetricPrinter, JSONWriter
from treadle.hooks import IterationTimer, LRScheduler, PeriodicWriter
trainer = TrainerBase(EagerStep(model, train_loader, optimizer, loss_fn=F.cross_entropy))
writers = [CommonMetricPrinter(1000), JSONWriter("out/metrics.json")]
args = argparse.Namespace(resume=False, config_file="configs/mlp.py", opts=[])
cfg = argparse.Namespace(train=argparse.Namespace(init_checkpoint=""))
output_dir, max_iter = "output/run1", 20
"""

SETUP: Dict[str, str] = {
    "README.md": COMMON,  # its blocks run on their own: no stand-ins (tests/tools/test_readme_examples.py)
    "docs/checkpoints.md": COMMON + DIGITS + TRAINER + """
# init_weights_from's inputs: a backbone saved from another model.
model = nn.Sequential()
model.add_module("backbone", nn.Linear(64, 32))
model.add_module("head", nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
torch.save(model.state_dict(), "imagenet_backbone.pth")
backbone_sd = model.backbone.state_dict()
""",
    "docs/config.md": COMMON + """
shutil.copytree(REPO / "configs" / "common", "configs/common")
args = argparse.Namespace(config_file="configs/mlp.py", opts=["optimizer.lr=0.01"])
""",
    "docs/data.md": COMMON + DIGITS,
    "docs/engine.md": COMMON + DIGITS + TRAINER,
    "docs/evaluation.md": COMMON + DIGITS,
    "docs/resume.md": COMMON + DIGITS + TRAINER + """
from treadle.checkpoint import Checkpointer
from treadle.hooks import PeriodicCheckpointer, PreemptionHandler
""",
    "docs/coming_from/hezar.md": COMMON + """
# Hezar's CRNN example, in small: a dataset that brings its collator, a
# model that computes its loss, a decoder, and the model it starts from.
from treadle.data.datasets import DigitsDataset

class PlateDataset(torch.utils.data.Dataset):
    def __init__(self, split, size):
        self.digits = DigitsDataset(split)
        self.size = size
    def __len__(self):
        return self.size
    def __getitem__(self, i):
        return self.digits[i]
    def data_collator(self, samples):
        images, labels = zip(*samples)
        return {"pixel_values": torch.stack(images), "labels": torch.stack(labels)}

class Recognizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.head = nn.Linear(64, 32), nn.Linear(32, 10)
    def forward(self, pixel_values, labels=None):
        logits = self.head(torch.relu(self.encoder(pixel_values)))
        return {"logits": logits, "loss": F.cross_entropy(logits, labels) if labels is not None else None}

def decode(logits):
    return [str(int(i)) for i in logits.argmax(-1)]

def decode_targets(labels):
    return [str(int(i)) for i in labels]

train_dataset, eval_dataset = PlateDataset("train", 32), PlateDataset("test", 16)
torch.save({"model": Recognizer().state_dict()}, "base_model.pth")
model = Recognizer()
from treadle.trainer import Trainer
""",
    "treadle.trainer.trainer.Trainer": COMMON + DIGITS + """
from treadle.trainer import Trainer
""",
}
