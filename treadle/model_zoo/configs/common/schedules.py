"""Learning-rate multipliers (fvcore ParamSchedulers over the whole run)."""

from treadle.config import LazyCall as L
from treadle.solver import build_lr_multiplier

cosine_with_warmup = L(build_lr_multiplier)(
    name="cosine", max_iter="${train.max_iter}", warmup_iters=50, warmup_factor=0.001
)

step_with_warmup = L(build_lr_multiplier)(
    name="step", max_iter="${train.max_iter}", warmup_iters=50, warmup_factor=0.001, gamma=0.1
)
