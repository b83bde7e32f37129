"""The writers of treadle, and the usual set of them.

Each writer has its module (``json_writer``, ``csv_writer``,
``tensorboard_writer``, ``printer``); the rule for which scalars a write emits
is in ``writer``.
"""

from __future__ import annotations

import os
from typing import List, Optional

from treadle.utils.comm import is_main_process

from .csv_writer import CSVWriter
from .json_writer import JSONWriter
from .printer import CommonMetricPrinter
from .tensorboard_writer import TensorBoardXWriter, TensorboardWriter, TensorboardXWriter
from .writer import EventWriter

__all__ = [
    "EventWriter",
    "JSONWriter",
    "CSVWriter",
    "TensorboardWriter",
    "TensorboardXWriter",
    "TensorBoardXWriter",
    "CommonMetricPrinter",
    "get_default_writers",
]


def get_default_writers(
    output_dir: str,
    max_iter: Optional[int] = None,
    window_size: int = 20,
    *,
    samples_per_iter: Optional[float] = None,
) -> List[EventWriter]:
    """The usual writers: console, ``output_dir/metrics.json`` and TensorBoard in ``output_dir``.

    Returns an empty list on processes other than the main one: only the main
    process writes. (The storage must still be read on every rank when a
    cross-rank reducer is installed; that is the calling hook's job.)
    """
    if not is_main_process():
        return []
    return [
        CommonMetricPrinter(max_iter, window_size, samples_per_iter=samples_per_iter),
        JSONWriter(os.path.join(output_dir, "metrics.json"), window_size),
        TensorboardWriter(output_dir, window_size),
    ]
