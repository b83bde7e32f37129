"""Data workers that survive a scheduler's SIGTERM until the main process stops them."""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["ignore_foreign_sigterm"]


def ignore_foreign_sigterm() -> None:
    """Makes this data worker ignore a SIGTERM that its parent did not send.

    Schedulers deliver a preemption SIGTERM to every process of a job (SLURM
    signals the whole job step, ``kill -TERM -<pgid>`` a process group).
    torch's data workers die on a SIGTERM that does not come from their
    parent, and the main process then fails at its next batch, before
    :class:`~treadle.hooks.PreemptionHandler` can write its checkpoint.

    Here SIGTERM is blocked and taken by a thread with ``sigwaitinfo``, which
    tells who sent it: from the parent (DataLoader shutdown, multiprocessing's
    exit) the worker exits at once, as torch's own handler does; from anyone
    else it is ignored, and the worker ends when the main process shuts it
    down or dies (workers watch their parent). Called in the worker's main
    thread, before any other thread starts, so every later thread inherits
    the blocked signal. A no-op where ``sigwaitinfo`` does not exist.
    """
    if not hasattr(signal, "sigwaitinfo") or threading.current_thread() is not threading.main_thread():
        return
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent or os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=wait, name="treadle-sigterm", daemon=True).start()
