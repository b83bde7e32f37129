"""A CSV file of the scalars, one row per iteration (rule: see ``writer``)."""

from __future__ import annotations

import csv
import io
import logging
from typing import List, Optional, Set, cast

from treadle.utils.file_io import PathManager

from .storage import get_event_storage
from .writer import DEFAULT_FILE_FLUSH_SECS, ITERATION_KEY, atomic_write_text, AppendingFileWriter, lines_before, read_lines

__all__ = ["CSVWriter"]

logger = logging.getLogger(__name__)


def _csv_line(fields: List[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def _csv_fields(line: str) -> List[str]:
    return next(csv.reader([line]), [])


class CSVWriter(AppendingFileWriter):
    """Writes scalars to a CSV file, one row per iteration.

    The header is ``iteration`` then the scalar names in sorted order; a
    scalar absent from an iteration leaves its cell empty. Rows follow the
    same rule as :class:`JSONWriter`. When a write brings a name the header
    lacks (an evaluation metric appearing at the first evaluation, say), the
    file is rewritten atomically with the widened header, the existing rows
    gaining empty cells. Floats are written with ``repr`` (shortest exact
    form; ``nan``, ``inf``, ``-inf`` for non-finite values).

    :meth:`set_start_iter` drops rows at or after the start iteration, and a
    last row cut short by a crash (any last line without its newline: a cut
    CSV row may still parse), like :class:`JSONWriter`.

    Args:
        csv_file: path of the file.
        window_size: number of values the median of a training scalar covers.
        flush_secs: the longest a written row waits in the file's buffer, as
            for :class:`JSONWriter`.
    """

    def __init__(self, csv_file: str, window_size: int = 20, *, flush_secs: float = DEFAULT_FILE_FLUSH_SECS) -> None:
        super().__init__(csv_file, window_size, flush_secs)
        # Scalar columns of the file's header (without "iteration"); None until read.
        self._columns: Optional[List[str]] = None

    def write(self) -> None:
        if self._main_process is not True and self._only_reads_here():  # not the main process (a call only until known)
            return
        rows = self._new_rows(get_event_storage())
        if not rows:
            return
        if self._columns is None:
            self._columns = self._read_columns()
        names: Set[str] = set().union(*rows.values())
        if self._columns is None or not names <= set(self._columns):
            self._rewrite_with_columns(sorted(set(self._columns or ()) | names))
        columns = cast(List[str], self._columns)  # set by the read or the rewrite above
        text = "".join(
            _csv_line([str(it)] + [repr(scalars[c]) if c in scalars else "" for c in columns])
            for it, scalars in rows.items()
        )
        self._append(text)
        self._commit(rows)

    def set_start_iter(self, start_iter: int) -> None:
        """Drops rows of iterations ``>= start_iter`` and a torn last row; see the class."""
        super().set_start_iter(start_iter)
        if not self._is_main_process():
            return  # its file is the main process's
        self.close()
        self._columns = None  # no file or no header yet: read at the next write
        if not PathManager.exists(self._path):
            return
        lines, tail = read_lines(self._path)
        changed = bool(tail)
        if tail:
            logger.warning("%s ends in an incomplete row (an interrupted write); dropped: %.80r", self._path, tail)
        if not lines:
            if changed:
                atomic_write_text(self._path, "")
            return
        self._columns = self._check_header(lines[0])
        rows, dropped = lines_before(
            self._path, lines[1:], start_iter, self._row_iteration, "does not start with an iteration", first_lineno=2
        )
        if changed or dropped:
            atomic_write_text(self._path, "".join([lines[0]] + rows))

    @staticmethod
    def _row_iteration(line: str) -> Optional[int]:
        fields = _csv_fields(line)
        try:
            return int(fields[0]) if fields else None
        except ValueError:
            return None

    def _check_header(self, line: str) -> List[str]:
        fields = _csv_fields(line)
        if not fields or fields[0] != ITERATION_KEY:
            raise ValueError(
                f"{self._path} exists but is not a CSVWriter file: its header {line.strip()[:80]!r} "
                f"does not start with '{ITERATION_KEY}'. Move it away or choose another csv_file."
            )
        return fields[1:]

    def _read_columns(self) -> Optional[List[str]]:
        """The scalar columns of the file's header; None when there is no header yet."""
        if not PathManager.exists(self._path):
            return None
        with PathManager.open(self._path, "r", encoding="utf-8", newline="") as f:
            header = f.readline()
        # A header cut short by a crash counts as none: the next write rewrites it.
        return self._check_header(header) if header.endswith("\n") else None

    def _rewrite_with_columns(self, columns: List[str]) -> None:
        self.close()
        out = [_csv_line([ITERATION_KEY] + columns)]
        if PathManager.exists(self._path):
            lines, tail = read_lines(self._path)
            if tail:
                logger.warning("%s ends in an incomplete row (an interrupted write); dropped: %.80r", self._path, tail)
            if lines:
                old_columns = self._check_header(lines[0])
                for line in lines[1:]:
                    fields = _csv_fields(line)
                    if not fields:
                        continue
                    cells = dict(zip(old_columns, fields[1:]))
                    out.append(_csv_line([fields[0]] + [cells.get(c, "") for c in columns]))
        atomic_write_text(self._path, "".join(out))
        self._columns = columns
