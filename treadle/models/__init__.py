"""Example models for treadle's examples, tests and benchmarks.

They import only torch: a model is a plain ``nn.Module`` that any trainer can
use. See ``docs/examples_data.md``.
"""

from .char_transformer import CharTransformerLM, LMCrossEntropy, lm_cross_entropy
from .mlp import MLPClassifier

__all__ = ["MLPClassifier", "CharTransformerLM", "lm_cross_entropy", "LMCrossEntropy"]
