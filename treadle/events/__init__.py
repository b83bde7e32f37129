"""Scalars published during training, and the writers that flush them."""

from .history import HistoryBuffer
from .mlflow_writer import MLflowWriter
from .wandb_writer import WandbWriter
from .storage import (
    EventStorage,
    NonFiniteLossError,
    ScalarKind,
    get_event_storage,
    has_event_storage,
)
from .writers import (
    CommonMetricPrinter,
    CSVWriter,
    EventWriter,
    JSONWriter,
    TensorBoardXWriter,
    TensorboardWriter,
    TensorboardXWriter,
    get_default_writers,
)

__all__ = [
    "CommonMetricPrinter",
    "CSVWriter",
    "EventWriter",
    "MLflowWriter",
    "WandbWriter",
    "JSONWriter",
    "TensorboardWriter",
    "TensorboardXWriter",
    "TensorBoardXWriter",
    "get_default_writers",
    "EventStorage",
    "HistoryBuffer",
    "NonFiniteLossError",
    "ScalarKind",
    "get_event_storage",
    "has_event_storage",
]
