"""The writers of treadle, and the usual set of them.

Each writer has its module (``json_writer``, ``csv_writer``,
``tensorboard_writer``, ``printer``); the rule for which scalars a write emits
is in ``writer``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

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


#: The files a run can write into its logs folder, by the name that asks for them.
FILE_WRITERS: Dict[str, Callable[[str, int], EventWriter]] = {
    "json": lambda folder, window: JSONWriter(os.path.join(folder, "metrics.json"), window),
    "tensorboard": lambda folder, window: TensorboardWriter(folder, window),
    "csv": lambda folder, window: CSVWriter(os.path.join(folder, "metrics.csv"), window),
}


def _tracker(name: str, options: Mapping[str, Any]) -> EventWriter:
    # Imported here: each tracker's client is an optional extra.
    if name == "mlflow":
        from .mlflow_writer import MLflowWriter

        return MLflowWriter(**options)
    if name == "wandb":
        from .wandb_writer import WandbWriter

        return WandbWriter(**options)
    raise ValueError(f"Unknown tracker {name!r}; choose 'mlflow' or 'wandb'")


def get_default_writers(
    output_dir: Optional[str],
    max_iter: Optional[int] = None,
    window_size: int = 20,
    *,
    samples_per_iter: Optional[float] = None,
    files: Sequence[str] = ("json", "tensorboard"),
    console: bool = True,
    trackers: Optional[Mapping[str, Mapping[str, Any]]] = None,
    writers: Sequence[EventWriter] = (),
) -> List[EventWriter]:
    """The writers of a run, the same assembly for ``DefaultTrainer`` and the
    plain ``Trainer``: the console (unless ``console=False``: a progress bar
    shows the losses), the ``files`` (``"json"``: ``metrics.json``,
    ``"tensorboard"``, ``"csv"``: ``metrics.csv``) in ``output_dir`` (none
    without it), the ``trackers`` (``{"mlflow": {...}, "wandb": {...}}``, each
    writer's options), then ``writers`` given as objects.

    detectron2's ``default_writers(output_dir, max_iter)``: console,
    ``metrics.json`` and TensorBoard. Returns an empty list on processes other
    than the main one: only the main process writes. (The storage must still
    be read on every rank when a cross-rank reducer is installed; that is the
    calling hook's job.)
    """
    if not is_main_process():
        return []
    out: List[EventWriter] = []
    if console:
        out.append(CommonMetricPrinter(max_iter, window_size, samples_per_iter=samples_per_iter))
    if output_dir:
        out += [FILE_WRITERS[name](output_dir, window_size) for name in files]
    out += [_tracker(name, options) for name, options in (trackers or {}).items()]
    return out + list(writers)
