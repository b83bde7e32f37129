"""The plain ``Trainer``'s process, set up when it is built: the console
(before the settings are checked, so that what the checks warn about shows
as every record does), the folders of its run, and, under ``torchrun``, the
process group it joins (after the checks).

``log.txt`` starts only when ``train()`` has claimed the run's folder
(:mod:`treadle.engine.session`): nothing is written into it before.
"""

from __future__ import annotations

import datetime
import logging
import os
import weakref
from typing import Any, Mapping, Optional

from treadle.utils import comm
from treadle.utils.logger import forget_kept_warnings, setup_logger

from treadle.engine.launch import join_env_process_group

from .settings import ProcessSettings

__all__ = ["start_console", "join_processes", "inside"]


# The handlers the last Trainer's console set up: what they kept is that Trainer's.
_TRAINERS_HANDLERS: "weakref.WeakSet[logging.Handler]" = weakref.WeakSet()


def start_console(values: Mapping[str, Any]) -> None:
    """The console of this process, its ``log.txt`` deferred, from settings not checked yet.

    A console an earlier ``Trainer`` set up without ``output_dir`` kept that
    Trainer's warnings for a log file: they are not this run's (a Trainer
    built and never trained; one that trained gave them up at its end)."""
    logger = logging.getLogger("treadle")
    if any(h in _TRAINERS_HANDLERS for h in logger.handlers):
        forget_kept_warnings()
    rank = comm.get_rank() if comm.get_world_size() > 1 else int(os.environ.get("RANK", "0") or 0)
    setup_logger(output=_logs_dir(values), distributed_rank=rank, defer_file=True)
    _TRAINERS_HANDLERS.update(logger.handlers)


def join_processes(settings: ProcessSettings) -> None:
    """Under torchrun the processes meet here (``launch()`` has joined them before calling the user's function)."""
    join_env_process_group(datetime.timedelta(seconds=settings.dist_timeout), leave_at_exit=True)


def _logs_dir(values: Mapping[str, Any]) -> Optional[str]:
    """Where log.txt goes, from settings not checked yet (a bad one: nowhere; the check then says why)."""
    output_dir, sub = values["output_dir"], values["logs_dir"]
    if not isinstance(output_dir, (str, os.PathLike)) or not isinstance(sub, (str, os.PathLike, type(None))):
        return None
    return inside(os.fspath(output_dir), os.fspath(sub) if sub else None)


def inside(output_dir: Optional[str], sub: Optional[str]) -> Optional[str]:
    """The folder ``sub`` of ``output_dir`` (``output_dir`` itself without one); None without an ``output_dir``."""
    if output_dir is None:
        return None
    return os.path.join(output_dir, sub) if sub else output_dir
