"""What a checkpoint records of the trainer: the iteration, random states, the
step's and the hooks' states, and the storage's recent values.

With several processes each rank's random state (``rng_per_rank``) and,
when the ranks' step states differ (a queue of each rank's features, a
per-rank generator), each rank's step state (``step_per_rank``) are
gathered at checkpoint time, and each rank gets its own back.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from treadle.checkpoint import ResumeRefusedError
from treadle.hooks.base import HookBase
from treadle.utils import comm
from treadle.utils.rng import get_rng_state, set_rng_state


__all__ = [
    "hook_state_keys", "capture_state", "restore_hook_states", "restore_rng", "step_state_of_this_rank", "same_state",
]

logger = logging.getLogger("treadle.engine.train_loop")


def hook_state_keys(hooks: Sequence[HookBase]) -> Dict[str, HookBase]:
    """``{key: hook}``: the class name, with ``#2``, ``#3``, ... for the second
    and later hooks of one class, so two ``EvalHook`` hooks keep separate states."""
    keys: Dict[str, HookBase] = {}
    seen: Dict[str, int] = defaultdict(int)
    for h in hooks:
        name = type(h).__qualname__
        seen[name] += 1
        keys[name if seen[name] == 1 else f"{name}#{seen[name]}"] = h
    return keys


def capture_state(
    *, last_run_iter: int, finished: bool, max_iter: int, hooks: Sequence[HookBase], step: Any, storage: Any
) -> Dict[str, Any]:
    """A trainer's state (see :meth:`~treadle.engine.TrainerBase.state_dict`), from its parts:
    ``step`` may be None (no step object yet), ``storage`` None (outside training)."""
    rng = get_rng_state()
    state: Dict[str, Any] = {
        "iteration": last_run_iter,
        "rng": rng,
        "finished": finished,
        "max_iter": max_iter,
    }
    step_state = step.state_dict() if step is not None else {}
    if comm.get_world_size() > 1:
        # Each rank draws its own dropout masks, and a step may keep state of
        # its rank's own (a queue of its batches' features): all of them are
        # needed for an exact resume. One collective, on the host (a CUDA
        # tensor would unpickle onto its sender's device): every rank calls
        # this together.
        gathered = comm.all_gather((rng, on_cpu(step_state)))
        state["rng_per_rank"] = [rank_rng for rank_rng, _ in gathered]
        step_states = [rank_step for _, rank_step in gathered]
        if not all(same_state(other, step_states[0]) for other in step_states[1:]):
            state["step_per_rank"] = step_states
    hook_states = {key: h.state_dict() for key, h in hook_state_keys(hooks).items()}
    hook_states = {key: hook_state for key, hook_state in hook_states.items() if hook_state}
    if hook_states:
        state["hooks"] = hook_states
    if step_state:
        state["step"] = step_state  # this rank's: rank 0's in the file, for readers without step_per_rank
    if storage is not None:
        # The recent values of every scalar: after a resume, smoothed
        # values (medians over a window) are those of an uninterrupted run.
        state["storage"] = storage.recent_state()
    return state


def restore_hook_states(hooks: Sequence[HookBase], states: Dict[str, Any]) -> None:
    """Give each hook its state from a checkpoint's ``states`` (keyed as
    :func:`hook_state_keys` keys them), when a run resumes; a state of a hook
    that is not registered is ignored with a warning."""
    keyed = hook_state_keys(hooks)
    for key, hook_state in states.items():
        if key in keyed:
            keyed[key].load_state_dict(hook_state)
        else:
            logger.warning("Checkpoint has a state for hook '%s', which is not registered; ignored.", key)


def restore_rng(state: Dict[str, Any]) -> None:
    """Sets this process's random states from a trainer state: its own rank's
    when the checkpoint has one per rank of this world size, else rank 0's."""
    per_rank = state.get("rng_per_rank")
    if per_rank is not None and len(per_rank) == comm.get_world_size():
        set_rng_state(per_rank[comm.get_rank()])
    elif "rng" in state:
        if per_rank is not None or comm.get_world_size() > 1:
            logger.warning(
                "The checkpoint's random states are of %d process(es) and this run has %d: every rank "
                "restarts from rank 0's state, so the resumed run is not bit-identical to an "
                "uninterrupted one.",
                len(per_rank) if per_rank is not None else 1,
                comm.get_world_size(),
            )
        set_rng_state(state["rng"])


def step_state_of_this_rank(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The step state this rank resumes from (``None``: none saved): its own
    when the checkpoint has one per rank of this world size, else rank 0's
    (which is every rank's where the ranks' states are equal).

    Raises:
        ResumeRefusedError: the ranks' step states differ and the checkpoint
            was saved by another number of processes than this run has.
    """
    per_rank = state.get("step_per_rank")
    if per_rank is None:
        return state.get("step")
    world = comm.get_world_size()
    if len(per_rank) != world:
        if all(same_state(other, per_rank[0]) for other in per_rank[1:]):
            return per_rank[0] or None  # no rank's own after all: rank 0's fits every rank
        raise ResumeRefusedError(
            f"Cannot resume on {world} process(es) from a checkpoint saved by {len(per_rank)}: the step's state "
            f"({', '.join(_differing_keys(per_rank))}) differs between those {len(per_rank)} ranks, so none of "
            f"them is this run's. Resume with {len(per_rank)} processes, or start a new run from its weights "
            "(train.init_checkpoint)."
        )
    return per_rank[comm.get_rank()] or None


def _differing_keys(per_rank: List[Any]) -> List[str]:
    """The keys of the step states whose values differ between ranks, shown."""
    states = [rank_state if isinstance(rank_state, dict) else {} for rank_state in per_rank]
    keys = list(dict.fromkeys(key for rank_state in states for key in rank_state))
    differ = [key for key in keys if not all(same_state(other.get(key), states[0].get(key)) for other in states[1:])]
    return [repr(key) for key in differ] or ["all of it"]


def on_cpu(value: Any) -> Any:
    """``value`` with every tensor in it copied to the host (dicts, lists and
    tuples rebuilt, anything else as it is)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: on_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [on_cpu(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(on_cpu(item) for item in value)
    return value


def same_state(a: Any, b: Any) -> bool:
    """Whether two states are equal: tensors and arrays element by element
    (and of one dtype and shape), containers item by item, the rest by
    ``==``; a value that cannot say counts as different."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_state(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001  # a value whose == is no verdict
        return False
