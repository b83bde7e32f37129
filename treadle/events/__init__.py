"""Scalars published during training, and the writers that flush them."""

from .history import HistoryBuffer
from .storage import (
    EventStorage,
    NonFiniteLossError,
    ScalarKind,
    get_event_storage,
    has_event_storage,
)

__all__ = [
    "EventStorage",
    "HistoryBuffer",
    "NonFiniteLossError",
    "ScalarKind",
    "get_event_storage",
    "has_event_storage",
]
