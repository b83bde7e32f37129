"""The ``treadle-train`` command and ``tools/train_net.py``: the job's process entry.

A scheduler may send SIGTERM at any moment, also while Python is still
importing torch. Until the job installs its own handlers, a signal here ends
the process with status 75 ("temporary failure, retry later", as after a
preemption) instead of the default death by signal (143), which a requeue
loop would take for a crash. This module imports nothing heavy, so the
handler is in place before torch is imported.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, List, Optional

__all__ = ["main"]

#: Also treadle.hooks.PREEMPTED_EXIT_CODE; repeated here to import nothing.
_RETRY_LATER = 75


def _exit_for_retry(signum: int, frame: Any) -> None:
    # os._exit, not SystemExit: an exception raised by a signal handler lands
    # wherever the main thread is, most often inside torch's or numpy's
    # imports, where it can abort the process in a half-loaded C extension or
    # be swallowed by a bare except (the job then trained on). Nothing has
    # been written yet: there is nothing to close or clean up.
    os.write(2, f"{os.path.basename(sys.argv[0])}: received {signal.Signals(signum).name} while starting; "
                f"exiting with status {_RETRY_LATER}\n".encode())
    os._exit(_RETRY_LATER)


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the training job of the command line and exits with its status."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _exit_for_retry)
    from treadle.tools.train_net import cli

    status = cli(argv, standalone=True)
    # The status is decided. Python's shutdown puts back the default action
    # of the signals it handles, but leaves ignored ones ignored: a signal
    # while torch and the interpreter shut down (a second) changes nothing.
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(status)
