#!/usr/bin/env python
"""Plot runs' ``metrics.json`` scalars: ``python tools/plot_metrics.py --help``.

The tool itself is ``treadle.tools.plot_metrics`` (also the ``treadle-plot`` command).
"""

import os
import sys

try:
    from treadle.tools.plot_metrics import *  # noqa: F401,F403 (the tool's public names, for importers of this file)
    from treadle.tools.plot_metrics import main
except ImportError:  # run from a checkout where treadle is not installed: the checkout's treadle
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from treadle.tools.plot_metrics import *  # noqa: F401,F403
    from treadle.tools.plot_metrics import main

if __name__ == "__main__":
    sys.exit(main())
