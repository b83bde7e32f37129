"""Capture and restore of every random number generator a run draws from.

States are plain data (ints, lists, uint8 tensors) so that checkpoints load
with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch

__all__ = ["get_rng_state", "set_rng_state"]


def get_rng_state() -> Dict[str, Any]:
    """The states of python's ``random``, numpy's global generator, torch's CPU
    generator and, when CUDA is initialized, every CUDA generator."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: Dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restores what :func:`get_rng_state` returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
