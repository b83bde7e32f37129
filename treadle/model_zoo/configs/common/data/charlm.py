"""Character windows of the Python standard library's own source (always there
offline), for next-character prediction."""

from treadle.config import LazyCall as L
from treadle.data import build_test_loader, build_train_loader
from treadle.data.datasets import CharCorpusDataset
from treadle.evaluation import build_evaluator
from treadle.models import LMCrossEntropy

# Export `corpus` from the runnable config: the datasets read it by
# interpolation, so that `corpus.seq_len=64` on the command line reaches them.
corpus = dict(seq_len=128, max_chars=1_000_000, val_fraction=0.05)
_corpus_args = {key: f"${{corpus.{key}}}" for key in corpus}

dataloader = dict(
    train=L(build_train_loader)(
        dataset=L(CharCorpusDataset)(split="train", **_corpus_args),
        total_batch_size=32,
        num_workers=0,
        seed=None,
    ),
    # The validation text is scored once per character (windows do not overlap).
    test=L(build_test_loader)(dataset=L(CharCorpusDataset)(split="val", **_corpus_args), batch_size=64),
    evaluator=L(build_evaluator)(metrics=["perplexity", "loss"], loss_fn=L(LMCrossEntropy)()),
)
