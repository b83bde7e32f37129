#!/usr/bin/env python
"""Train or evaluate a model from a lazy config: ``python tools/train_net.py --help``.

The job itself is ``treadle.tools.train_net`` (also the ``treadle-train`` command).
"""

import sys

from treadle.tools.train_net import cli

if __name__ == "__main__":
    sys.exit(cli())
