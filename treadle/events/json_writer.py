"""``metrics.json``: one JSON object per line, with an ``iteration`` key (rule: see ``writer``)."""

from __future__ import annotations

import json
import logging
import math
from typing import Dict, Optional

from treadle.utils.file_io import PathManager

from .storage import get_event_storage
from .writer import DEFAULT_FILE_FLUSH_SECS, ITERATION_KEY, atomic_write_text, AppendingFileWriter, lines_before, read_lines

__all__ = ["JSONWriter"]

logger = logging.getLogger(__name__)


def _json_line_iteration(line: str) -> Optional[int]:
    """The iteration of a metrics.json line, or None when it is not one."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    it = record.get(ITERATION_KEY)
    return it if isinstance(it, int) and not isinstance(it, bool) else None


class JSONWriter(AppendingFileWriter):
    """Appends scalars to a JSON-lines file (``metrics.json``).

    Each line is one JSON object: ``"iteration"`` first, then the scalars of
    that iteration by name. Lines are in increasing iteration order and no
    iteration has two lines. Which scalars a line holds follows the rule of
    this module's docstring: with a writer every 20 iterations, training
    scalars appear on lines 19, 39, ... (medians over ``window_size``), and an
    evaluation put every 5 iterations adds lines 4, 9, 14, and keys to line 19.

    NaN and infinite values are written as ``null`` (JSON has no NaN).

    The file is opened in append mode through ``PathManager`` at the first
    write. Lines reach it at the first write, then at most ``flush_secs``
    apart, and all of them at :meth:`flush` (before every checkpoint) and
    :meth:`close`. :meth:`set_start_iter` first removes the lines at or after
    the start iteration, which an interrupted run wrote after its last
    checkpoint.

    Args:
        json_file: path of the file, e.g. ``output_dir/metrics.json``.
        window_size: number of values the median of a training scalar covers.
        flush_secs: the longest a written line waits in the file's buffer
            (0: every write goes to the file at once).
    """

    def __init__(self, json_file: str, window_size: int = 20, *, flush_secs: float = DEFAULT_FILE_FLUSH_SECS) -> None:
        super().__init__(json_file, window_size, flush_secs)
        # Each scalar name as a JSON string, made once.
        self._keys: Dict[str, str] = {}

    def write(self) -> None:
        if self._main_process is not True and self._only_reads_here():  # not the main process (a call only until known)
            return
        rows = self._new_rows(get_event_storage())
        if not rows:
            return
        self._append("".join([self._line(it, scalars) for it, scalars in rows.items()]))
        self._commit(rows)

    def _line(self, iteration: int, scalars: Dict[str, float]) -> str:
        """``json.dumps({"iteration": ..., **sorted scalars}) + "\\n"``, put
        together from each name's encoding (made once) and each value's
        ``repr``, which is how ``json`` writes a float. NaN and infinities
        are not JSON: null is read by every parser (and by pandas as NaN);
        the console line tells which it was."""
        keys = self._keys
        fields = [f'"{ITERATION_KEY}": {int(iteration)}']
        for name in sorted(scalars):
            key = keys.get(name)
            if key is None:
                key = keys[name] = json.dumps(name)
            value = scalars[name]
            if type(value) is float:
                text = float.__repr__(value) if math.isfinite(value) else "null"
            else:  # a number of another type, from a producer's own series
                text = json.dumps(value if math.isfinite(value) else None)
            fields.append(f"{key}: {text}")
        return "{" + ", ".join(fields) + "}\n"

    def set_start_iter(self, start_iter: int) -> None:
        """Drops the lines of iterations ``>= start_iter`` from the file.

        Other lines are kept byte for byte. A last line cut short by a crash is
        dropped with a warning; a line that is not a metrics record is kept,
        with a warning. The file is replaced atomically, and only if a line is
        dropped.
        """
        super().set_start_iter(start_iter)
        if not self._is_main_process():
            return  # its file is the main process's
        self.close()  # the file may be replaced: do not keep a handle on the old one
        if not PathManager.exists(self._path):
            return
        lines, tail = read_lines(self._path)
        kept, changed = lines_before(
            self._path,
            lines,
            start_iter,
            _json_line_iteration,
            f"is not a JSON object with an integer '{ITERATION_KEY}'",
        )
        if tail:
            changed = True
            it = _json_line_iteration(tail)
            if it is None:
                logger.warning(
                    "%s ends in an incomplete line (an interrupted write); dropped: %.80r",
                    self._path,
                    tail,
                )
            elif it < start_iter:
                kept.append(tail + "\n")  # complete record, only its newline was lost
        if changed:
            atomic_write_text(self._path, "".join(kept))
