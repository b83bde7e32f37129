"""What a checkpoint records of the trainer: the iteration, random states, the
step's and the hooks' states, and the storage's recent values."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Dict, Sequence

from treadle.hooks.base import HookBase
from treadle.utils import comm
from treadle.utils.rng import get_rng_state, set_rng_state


__all__ = ["hook_state_keys", "capture_state", "restore_hook_states", "restore_rng"]

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
    if comm.get_world_size() > 1:
        # Each rank draws its own dropout masks: all of them are needed for
        # an exact resume. A collective: every rank calls this together.
        state["rng_per_rank"] = comm.all_gather(rng)
    hook_states = {key: h.state_dict() for key, h in hook_state_keys(hooks).items()}
    hook_states = {key: hook_state for key, hook_state in hook_states.items() if hook_state}
    if hook_states:
        state["hooks"] = hook_states
    if step is not None:
        step_state = step.state_dict()
        if step_state:
            state["step"] = step_state
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
