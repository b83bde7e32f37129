"""Worked examples of extending treadle, importable so that configs can name them."""

from .sam import SAMStep

__all__ = ["SAMStep"]
