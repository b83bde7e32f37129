"""A small character-level transformer language model on the Python standard
library's source files. Reports validation loss and perplexity.

A good workload for CompiledStep and bf16:
    python tools/train_net.py --config-file configs/charlm_transformer.py \\
        train.step.kind=compiled train.step.precision=bf16
"""

from treadle.config import LazyCall as L
from treadle.models import CharTransformerLM, LMCrossEntropy

from .common.data.charlm import corpus, dataloader
from .common.optim import AdamW as optimizer
from .common.schedules import cosine_with_warmup as lr_multiplier
from .common.train import train

model = L(CharTransformerLM)(vocab_size=98, seq_len="${corpus.seq_len}", dim=128, depth=2, heads=4, dropout=0.0)

optimizer.lr = 3e-3
optimizer.weight_decay = 0.01

train.output_dir = "./output/charlm_transformer"
train.max_iter = 1000
train.eval_period = 250
train.checkpointer.period = 250
train.step.loss_fn = L(LMCrossEntropy)()
train.step.clip_grad_norm = 1.0
train.best_checkpointer.metric = "perplexity"
train.best_checkpointer.mode = "min"
