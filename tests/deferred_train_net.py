"""``tools/train_net.py`` with the deferred flush forced on: ``PeriodicWriter(defer=True)``.

A GPU run defers by default (its values are on the device); this takes that
path on the CPU. Arguments are train_net's; the tests start it in subprocesses.
"""

import functools
import sys

from treadle.hooks import PeriodicWriter
from treadle.tools.script import main

if __name__ == "__main__":
    # Every PeriodicWriter of the job, the default hooks' included.
    PeriodicWriter.__init__ = functools.partialmethod(PeriodicWriter.__init__, defer=True)  # type: ignore[method-assign]
    sys.argv[0] = "train_net.py"
    main()
