"""The shape of evaluation results, and helpers to publish and print them.

Results are dicts keyed by metric name (``{"accuracy": 0.93, "f1": 0.91}``);
a value may be a nested dict (e.g. per-class scores), which
:func:`flatten_results` turns into ``"outer/inner"`` keys for scalar writers.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping

from tabulate import tabulate

__all__ = ["Results", "flatten_results", "format_results", "print_csv_format"]

logger = logging.getLogger(__name__)

#: Evaluation results: metric name -> a float, or a nested dict of them.
Results = Dict[str, Any]


def flatten_results(results: Mapping[str, Any], sep: str = "/") -> Dict[str, float]:
    """``{"a": {"b": 1.0}, "c": 2.0}`` -> ``{"a/b": 1.0, "c": 2.0}``.

    Leaves must be numbers; anything else is an error naming the key, since a
    writer would fail on it later with less context.
    """
    flat: Dict[str, float] = {}
    _flatten_into(flat, results, "", sep)
    return flat


def _flatten_into(out: Dict[str, float], value: Mapping[str, Any], prefix: str, sep: str) -> None:
    for key, v in value.items():
        name = f"{prefix}{key}"
        if isinstance(v, Mapping):
            _flatten_into(out, v, name + sep, sep)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
        else:
            raise TypeError(f"result {name!r} is a {type(v).__name__}; expected a number or a dict")


def format_results(results: Mapping[str, Any], digits: int = 4) -> str:
    """A two-column table (metric, value) of the flattened results."""
    rows = list(flatten_results(results).items())
    return tabulate(rows, headers=["metric", "value"], tablefmt="pipe", floatfmt=f".{digits}f")


def print_csv_format(results: Mapping[str, Any]) -> None:
    """Logs ``results`` as comma-separated lines that paste into a spreadsheet
    (detectron2's function, for a ported ``do_test``).

    A nested dict is a task (``{"bbox": {"AP": 40.1, "AP50": 60.2}}``): a
    ``copypaste: Task: bbox`` line, then its metric names and values, each
    line comma-separated; names with a ``-`` (per-class scores) are left out
    of that summary, as detectron2 does. A top-level number is logged as
    ``copypaste: name=value``.
    """
    if not isinstance(results, Mapping):
        raise TypeError(f"print_csv_format takes a dict of results, got {type(results).__name__}")
    for task, value in results.items():
        if isinstance(value, Mapping):
            summary = [(name, v) for name, v in value.items() if "-" not in name]
            logger.info("copypaste: Task: %s", task)
            logger.info("copypaste: %s", ",".join(name for name, _ in summary))
            logger.info("copypaste: %s", ",".join(f"{float(v):.4f}" for _, v in summary))
        else:
            logger.info("copypaste: %s=%s", task, value)
