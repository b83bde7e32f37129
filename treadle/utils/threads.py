"""The CPU threads a training run computes with: ``train.num_threads`` and
the plain ``Trainer``'s ``num_threads``.

torch's intra-op threads (one per core by default) wait for each other at
the end of every operation. On a small model, beside any other busy process
(a laptop's browser, another job on a shared machine), a thread that is not
scheduled holds up the others: the digits job took 0.19 s per iteration
with two threads beside two busy processes on a 2-core machine, and 0.014 s
with one (docs/performance.md). Hence ``"auto"``: one thread on the CPU.

The rule, in order (``choose_num_threads``):

1. ``OMP_NUM_THREADS`` set in the environment: torch's count is left as torch
   took it from there, whatever the setting says (the log says so);
2. ``None``: torch's count is left as it is;
3. an integer: that many threads;
4. ``"auto"``: a count set with ``torch.set_num_threads`` after treadle was
   imported is kept; else one thread when the model trains on the CPU, and
   torch's count when it trains on a GPU (whose speed does not hang on
   them).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional, Union

import torch

__all__ = ["AUTO", "ThreadChoice", "choose_num_threads", "apply_num_threads", "restore_num_threads"]

logger = logging.getLogger(__name__)

#: The default: one thread on the CPU (see the module's docstring).
AUTO = "auto"
#: The count ``"auto"`` trains a CPU model with: one, since any more wait for
#: each other beside other work (docs/performance.md's figures).
_AUTO_ON_CPU = 1

# torch's count when treadle first read it: a count that differs at a run's
# start was set by the user's torch.set_num_threads, unless treadle set it.
_AT_IMPORT = torch.get_num_threads()
_SET_BY_TREADLE: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    """The count a run trains with, why (for the log), and the count before."""

    count: int
    reason: str
    previous: int

    def describe(self) -> str:
        """The count and its reason, as the environment table shows them."""
        return f"{self.count} ({self.reason})"


def choose_num_threads(setting: Union[int, str, None], device: Union[str, torch.device], *,
                       name: str) -> ThreadChoice:
    """The count a run with ``setting`` (``name`` says where it was given:
    ``"train.num_threads"``, ``"num_threads"``) trains with on ``device``
    (``"auto"`` as ``train.device`` means it); nothing is set. ``setting``
    was checked by its rule (``treadle.config.rules.num_threads``)."""
    device_type = _device_type(device)
    current = torch.get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env:
        return ThreadChoice(current, f"OMP_NUM_THREADS={env} is set; it wins over {name}={setting!r}", current)
    if setting is None:
        return ThreadChoice(current, f"{name}=None: torch's count", current)
    if setting != AUTO:
        return ThreadChoice(int(setting), f"{name}={int(setting)}", current)
    if current not in (_AT_IMPORT, _SET_BY_TREADLE):
        return ThreadChoice(current, f"set by torch.set_num_threads; {name}='auto' keeps it", current)
    if device_type != "cpu":
        return ThreadChoice(current, f"{name}='auto' on {device_type}: torch's count", current)
    return ThreadChoice(_AUTO_ON_CPU, f"{name}='auto': one on the CPU", current)


def apply_num_threads(setting: Union[int, str, None], device: Union[str, torch.device], *,
                      name: str) -> ThreadChoice:
    """Sets torch's count as :func:`choose_num_threads` says, and returns the
    choice; an integer the environment's ``OMP_NUM_THREADS`` overrides is
    warned about in one line. Called in the run's own setup only (a job's
    ``default_setup``, the plain ``Trainer``'s ``train()``, which puts the
    previous count back after), never at import."""
    global _SET_BY_TREADLE
    choice = choose_num_threads(setting, device, name=name)
    if choice.count != choice.previous:
        torch.set_num_threads(choice.count)
        _SET_BY_TREADLE = choice.count
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env and setting not in (None, AUTO) and int(setting) != choice.count:
        logger.warning("%s=%s is not applied: OMP_NUM_THREADS=%s is set, and this run uses %d CPU thread(s)",
                       name, setting, env, choice.count)
    return choice


def restore_num_threads(choice: ThreadChoice) -> None:
    """Puts back the count ``choice`` replaced (the plain ``Trainer`` after ``train()``)."""
    global _SET_BY_TREADLE
    if torch.get_num_threads() != choice.previous:
        torch.set_num_threads(choice.previous)
    _SET_BY_TREADLE = None


def _device_type(device: Union[str, torch.device]) -> str:
    """``"cpu"``, ``"cuda"``, ``"mps"``...: ``device``'s type, ``"auto"``'s as
    :func:`~treadle.utils.device.resolve_device` picks it (without starting CUDA)."""
    if str(device) != "auto":
        return torch.device(device).type
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"
