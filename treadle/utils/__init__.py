"""Utilities at the bottom of treadle's layers: they import nothing else of treadle."""
