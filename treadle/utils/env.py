"""Seeding and environment reporting."""

from __future__ import annotations

import importlib
import logging
import os
import platform
import random
import sys
import warnings
from types import ModuleType
from typing import Optional

import numpy as np
import torch
from tabulate import tabulate

import treadle

__all__ = ["seed_all_rng", "collect_env_info", "import_fvcore_nn"]

logger = logging.getLogger(__name__)


def seed_all_rng(seed: Optional[int] = None) -> int:
    """Seeds python, numpy and torch (all devices); returns the seed used.

    ``None`` or a negative seed picks one from the OS and logs it, so that a
    run can be repeated from its log.
    """
    if seed is None or seed < 0:
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        logger.info("Using a generated random seed %d", seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


def import_fvcore_nn(module: str = "fvcore.nn") -> ModuleType:
    """Imports ``module`` (``fvcore.nn`` or one of its modules) without
    torch's deprecation warning about ``torch.jit.script``: fvcore decorates
    some of its functions with it when imported, which torch 2.14 deprecates
    with a ``FutureWarning``, two lines on every user's console about code
    treadle does not call (parameter counting and PreciseBN use none of it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit\.script")
        return importlib.import_module(module)


def collect_env_info(cpu_threads: Optional[str] = None) -> str:
    """A table of the software and devices this process runs with;
    ``cpu_threads``: the row of the CPU threads (a run's count and why,
    :meth:`~treadle.utils.threads.ThreadChoice.describe`), else torch's count."""
    rows = [
        ("sys.platform", sys.platform),
        ("treadle", f"{treadle.__version__} @{os.path.dirname(treadle.__file__)}"),
        ("Python", sys.version.replace("\n", " ")),
        ("numpy", np.__version__),
        ("PyTorch", f"{torch.__version__} @{os.path.dirname(torch.__file__)}"),
        ("machine", platform.machine()),
        ("CUDA available", torch.cuda.is_available()),
    ]
    if torch.cuda.is_available():
        rows.append(("CUDA", torch.version.cuda))
        for i in range(torch.cuda.device_count()):
            rows.append((f"GPU {i}", torch.cuda.get_device_name(i)))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        rows.append(("MPS available", True))
    rows.append(("CPU threads", cpu_threads or torch.get_num_threads()))
    return tabulate(rows, tablefmt="psql")
