"""The digits example (``configs/digits_mlp.py``) with one process killed by SIGKILL at a chosen moment.

A config for ``tools/train_net.py`` under ``torchrun --max-restarts N``, used by
``benchmarks/restart_trials.py`` and ``tests/engine/test_restarts.py``. The
fault is read from the variable ``TREADLE_RESTART_FAULT`` (JSON), so that
every process of every attempt sees it:

- ``rank``: the process that dies;
- ``moment``: ``"startup"`` (``delay`` seconds after this config is loaded,
  before or while the group forms), ``"step"`` (in iteration ``at``),
  ``"save"`` (the ``at``-th periodic checkpoint, 1-based), ``"eval"`` (the
  ``at``-th evaluation) or ``"final"`` (the save of ``model_final``);
- ``delay``: seconds from the start of that moment to the kill (a timer
  thread sends SIGKILL, as ``kill -9`` from outside would, wherever the
  process is by then); for a save, ``"publish"`` instead: the kill comes at
  the save's first rename, when its data is written but not yet in place
  (in the background thread of an asynchronous save);
- ``signal`` (optional): ``"SIGSTOP"`` to stop the process instead (a hung
  peer, alive but silent), ``"SIGKILL"`` by default;
- ``marker``: a file created just before the kill; while it exists, no
  process kills itself again, so the restarted group runs to the end.

Without the variable, this is the digits example.
"""

import json
import os
import signal
import threading
import time

from treadle.config import LazyConfig

_base = LazyConfig.load(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "configs", "digits_mlp.py"))
model, optimizer, lr_multiplier, dataloader, train = (
    _base.model, _base.optimizer, _base.lr_multiplier, _base.dataloader, _base.train
)

_FAULT = json.loads(os.environ.get("TREADLE_RESTART_FAULT", "null"))


def _kill_later(delay: float) -> None:
    def kill() -> None:
        if os.path.exists(_FAULT["marker"]):
            return
        with open(_FAULT["marker"], "w") as f:
            f.write(f"{_FAULT['moment']} rank {_FAULT['rank']}\n")
        os.kill(os.getpid(), getattr(signal, _FAULT.get("signal", "SIGKILL")))

    timer = threading.Timer(delay, kill)
    timer.daemon = True
    timer.start()


def _kill_at_the_next_rename() -> None:
    for name in ("replace", "rename"):
        original = getattr(os, name)

        def renaming(src, dst, *args, _original=original, **kwargs):
            _kill_later(0.0)
            time.sleep(5)  # the timer's kill comes first
            return _original(src, dst, *args, **kwargs)

        setattr(os, name, renaming)


def _count_calls(owner, name, fires):
    """Wraps ``owner.name``: a timer starts when ``fires(count, *args, **kwargs)`` is true."""
    original = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if fires(calls[0], *args, **kwargs):
            if _FAULT["delay"] == "publish":
                _kill_at_the_next_rename()
            else:
                _kill_later(float(_FAULT["delay"]))
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _install() -> None:
    moment, at = _FAULT["moment"], int(_FAULT.get("at", 1))
    if moment == "startup":
        _kill_later(float(_FAULT["delay"]))
    elif moment == "step":
        from treadle.engine.train_loop import TrainerBase

        # run_step is called once per iteration; the trainer's iter says which.
        _count_calls(TrainerBase, "run_step", lambda n, trainer: trainer.iter == at)
    elif moment in ("save", "final"):
        from treadle.checkpoint import Checkpointer

        def fires(n, checkpointer, name, *args, **kwargs):
            if moment == "final":
                return name == "model_final"
            return name != "model_final" and not name.startswith("model_best") and _periodic_count(name) == at

        _count_calls(Checkpointer, "save", fires)
    elif moment == "eval":
        import treadle.engine.defaults as defaults

        _count_calls(defaults, "inference_on_dataset", lambda n, *args, **kwargs: n == at)
    else:
        raise ValueError(f"unknown moment {moment!r}")


_seen_periodic = []


def _periodic_count(name):
    # The periodic checkpoints of this process, counted once per name (a
    # preemption may save a name again).
    if name not in _seen_periodic:
        _seen_periodic.append(name)
    return _seen_periodic.index(name) + 1


if _FAULT and os.environ.get("RANK") == str(_FAULT["rank"]) and not os.path.exists(_FAULT["marker"]):
    _install()
