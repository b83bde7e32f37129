"""The one ``PathManager`` through which treadle reads and writes files.

iopath lets users register handlers (``manifold://``, ``s3://``, ...) on this
object and have every checkpoint, metric and config file go through them.
"""

from iopath.common.file_io import PathManager as _PathManagerClass

__all__ = ["PathManager"]

PathManager = _PathManagerClass()
