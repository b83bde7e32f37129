"""treadle: a hook-based training iteration engine for PyTorch."""

__version__ = "0.1.0"
