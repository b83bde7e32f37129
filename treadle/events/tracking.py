"""What the writers for experiment trackers (MLflow, Weights & Biases) share:
the optional import with its one-line error, a background sender that never
blocks training, and the flattening of a config into parameters."""

from __future__ import annotations

import importlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional

__all__ = ["MissingExtraError", "import_extra", "BackgroundSender", "flatten_params"]

logger = logging.getLogger(__name__)


class MissingExtraError(ImportError):
    """An optional integration was asked for without its library; the message
    is one line naming the extra to install."""


def import_extra(module: str, extra: str, what: str) -> Any:
    """Imports ``module`` or raises :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs the '{module}' package, which is not installed ({e.msg if hasattr(e, 'msg') else e}): "
            f"pip install \"treadle[{extra}]\""
        ) from None


class BackgroundSender:
    """Runs a tracker's network calls one at a time, in order, in a thread.

    A tracking server that is slow or down must never stop training: the
    loop only queues work. A call that fails is logged once per outage
    (``"... unreachable ...; retried at the next flush"``) and the caller
    keeps what was not sent; :meth:`drain` waits for the queue at the end,
    up to ``timeout`` seconds.

    A call that had nothing to send (a run that was never created has nothing
    to finish) returns :attr:`NOTHING_SENT`: it says nothing about the server,
    so it neither ends an outage nor counts as having reached it.
    """

    #: What a call that had nothing to send returns.
    NOTHING_SENT: Any = object()

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: Optional[ThreadPoolExecutor] = None
        self._last: Optional["Future[Any]"] = None
        self._lock = threading.Lock()
        self._failing = False
        self._reached = False  # whether a call has ever got through

    def submit(self, fn: Callable[[], Any]) -> "Future[Any]":
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"treadle-{self._name}")
        self._last = self._pool.submit(self._guarded, fn)
        return self._last

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - any client error: the run goes on
            with self._lock:
                if not self._failing:
                    text = str(e).strip().splitlines()
                    logger.warning(
                        "%s: the tracking server is unreachable or refused a call (%s: %s); what was not sent is "
                        "kept and sent again at the next flush. Training goes on; metrics.json is complete.",
                        self._name, type(e).__name__, text[0] if text else "",
                    )
                self._failing = True
            return False
        if result is self.NOTHING_SENT:
            return True
        with self._lock:
            if self._failing:
                # "again" only where it was reached before the outage: a server
                # down from the start is reached for the first time.
                logger.info("%s: the tracking server is reachable %s.", self._name, "again" if self._reached else "now")
            self._failing = False
            self._reached = True
        return True if result is None else result

    def drain(self, timeout: float) -> bool:
        """Waits for every queued call, up to ``timeout`` seconds; whether all ran."""
        last = self._last
        if last is None:
            return True
        try:
            last.result(timeout=timeout)
            return True
        except Exception:  # noqa: BLE001 - a timeout: the caller reports what is left
            return False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def flatten_params(config: Any, max_length: int = 500) -> Dict[str, str]:
    """A config (a dict, an OmegaConf node) as ``{"train.max_iter": "1000", ...}``:
    what trackers take as a run's parameters. Values are text, cut to
    ``max_length`` characters."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(config, (DictConfig, ListConfig)):
            config = OmegaConf.to_container(config, resolve=False)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    out: Dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            text = str(value)
            out[prefix or "value"] = text if len(text) <= max_length else text[: max_length - 3] + "..."

    walk("", config)
    return out


def chunks(items: List[Any], size: int) -> List[List[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
