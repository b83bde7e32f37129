"""Logging set-up: a colored console on the main process, one file per rank."""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Optional

from termcolor import colored

from .file_io import PathManager

__all__ = ["setup_logger", "log_once", "strip_ansi"]

_LOGGED_ONCE: set = set()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI color codes (termcolor's, torch's error messages')."""
    return _ANSI.sub("", text)


class _PlainFormatter(logging.Formatter):
    """No color codes in files: colored console lines are stripped."""

    def format(self, record: logging.LogRecord) -> str:
        return strip_ansi(super().format(record))


class _ColorfulFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        log = super().formatMessage(record)
        if record.levelno == logging.WARNING:
            prefix = colored("WARNING", "red", attrs=["blink"])
        elif record.levelno >= logging.ERROR:
            prefix = colored("ERROR", "red", attrs=["blink", "underline"])
        else:
            return log
        return prefix + " " + log


class _ConsoleHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is when a record is emitted, so that a
    replaced stdout (a notebook, a test's capture) is followed."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


class _FileHandler(logging.StreamHandler):
    """A stream handler on a file opened through ``PathManager``, which it owns:
    ``logging.FileHandler`` opens local paths only, and ``StreamHandler.close``
    leaves its stream open."""

    def close(self) -> None:
        try:
            self.acquire()
            try:
                if not self.stream.closed:
                    self.flush()
                    self.stream.close()
            finally:
                self.release()
        finally:
            super().close()


def setup_logger(
    output: Optional[str] = None,
    distributed_rank: int = 0,
    *,
    color: bool = True,
    name: str = "treadle",
    abbrev_name: Optional[str] = None,
) -> logging.Logger:
    """Configures the ``name`` logger.

    Calling it again (a second job in one process) replaces the handlers the
    previous call installed, so that a run never logs into another run's file.

    Args:
        output: a file name ending in ``.txt``/``.log``, or a directory in which
            ``log.txt`` is written. Ranks other than 0 write ``log.txt.rank{N}``.
        distributed_rank: only rank 0 logs to the console.
        color: color the console output (only when it is a terminal).
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    for old in [h for h in logger.handlers if getattr(h, "_treadle_handler", False)]:
        logger.removeHandler(old)
        old.close()
    abbrev_name = abbrev_name or ("tr" if name == "treadle" else name)
    plain = _PlainFormatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s", datefmt="%m/%d %H:%M:%S")
    handlers: list = []
    if distributed_rank == 0:
        handler = _ConsoleHandler()
        handler.setLevel(logging.DEBUG)
        if color and sys.stdout.isatty():
            handler.setFormatter(
                _ColorfulFormatter(
                    colored("[%(asctime)s %(name)s]: ", "green") + "%(message)s",
                    datefmt="%m/%d %H:%M:%S",
                )
            )
        else:
            handler.setFormatter(plain)
        handlers.append(handler)
    if output is not None:
        if output.endswith((".txt", ".log")):
            filename = output
        else:
            filename = os.path.join(output, "log.txt")
        if distributed_rank > 0:
            filename = f"{filename}.rank{distributed_rank}"
        PathManager.mkdirs(os.path.dirname(filename) or ".")
        stream = PathManager.open(filename, "a")
        file_handler = _FileHandler(stream)
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(plain)
        handlers.append(file_handler)
    for h in handlers:
        h._treadle_handler = True  # type: ignore[attr-defined]
        logger.addHandler(h)
    return logger


def log_once(logger: logging.Logger, level: int, msg: str, *args) -> None:
    """Logs ``msg`` the first time it is seen in this process, then never again."""
    key = (logger.name, msg)
    if key in _LOGGED_ONCE:
        return
    _LOGGED_ONCE.add(key)
    logger.log(level, msg, *args)
