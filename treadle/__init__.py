"""treadle: a hook-based training iteration engine for PyTorch."""

# The newest released version in CHANGELOG.md (a test checks they agree);
# setup.py and the docs site read it from here.
__version__ = "0.8.0"
