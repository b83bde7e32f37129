#!/usr/bin/env python
"""Train or evaluate a model from a lazy config: ``python tools/train_net.py --help``.

The job itself is ``treadle.tools.train_net`` (also the ``treadle-train`` command).
"""

from treadle.tools.script import main

if __name__ == "__main__":
    main()
