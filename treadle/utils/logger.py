"""Logging set-up: a colored console on the main process, one file per rank."""

from __future__ import annotations

import logging
import os
import re
import site
import sys
import sysconfig
import time
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from termcolor import colored

from .file_io import PathManager, describe_os_error

__all__ = [
    "setup_logger", "start_log_files", "forget_kept_warnings", "log_once", "strip_ansi", "one_line_error",
    "write_info_line",
]

_LOGGED_ONCE: set = set()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI color codes (termcolor's, torch's error messages')."""
    return _ANSI.sub("", text)


# The record fields setup_logger's formats use: a line in them needs no LogRecord.
_LINE_FIELDS = frozenset({"asctime", "name", "levelname", "message"})
_FIELD = re.compile(r"%\((\w+)\)")


class _LineFormatterMixin:
    """A formatter of :func:`setup_logger` that can also format a plain INFO
    line without a ``LogRecord`` (:func:`write_info_line`), to the same text."""

    # (format, date format, converter) last checked, and the answer.
    _line_check: Tuple[Any, ...] = ()
    _formats_lines = False
    # (second, date format, converter) of the last line's time, and its text:
    # lines come every few milliseconds, the text changes once a second.
    _asctime_key: Tuple[Any, ...] = ()
    _asctime = ""

    def formats_lines(self) -> bool:
        """Whether :meth:`format_info_line` gives what ``format`` would: the
        format and date format are still setup_logger's kind (a user may
        replace them), and the class is one of this module's."""
        style = self._style  # type: ignore[attr-defined]
        key = (style, style._fmt, self.datefmt)  # type: ignore[attr-defined]
        if key != self._line_check:
            self._line_check = key
            self._formats_lines = (
                type(self) in _LINE_FORMATTERS
                and type(style) is logging.PercentStyle
                and not getattr(style, "_defaults", None)
                and bool(self.datefmt)  # type: ignore[attr-defined]
                and _LINE_FIELDS.issuperset(_FIELD.findall(style._fmt))
            )
        return self._formats_lines

    def format_info_line(self, name: str, message: str, created: float) -> str:
        # Formatter.format for a record without exception or stack: the
        # style's % substitution, the time as formatTime gives it with a datefmt.
        datefmt, converter = self.datefmt, self.converter  # type: ignore[attr-defined]
        key = (int(created), datefmt, converter)
        if key != self._asctime_key:
            self._asctime_key, self._asctime = key, time.strftime(datefmt, converter(created))
        fields = {"asctime": self._asctime, "name": name, "levelname": "INFO", "message": message}
        text = self._style._fmt % fields  # type: ignore[attr-defined]
        return strip_ansi(text) if isinstance(self, _PlainFormatter) else text


class _PlainFormatter(_LineFormatterMixin, logging.Formatter):
    """No color codes in files: colored console lines are stripped."""

    def format(self, record: logging.LogRecord) -> str:
        return strip_ansi(super().format(record))


# A collective's error from gloo or c10d: "[/path/pair.cc:553] Connection
# closed by peer [10.0.0.2]:1234. This is typically caused by ... GLHF!".
_NATIVE_SOURCE = re.compile(r"^\[[^\]\s]+\.(?:cc|cpp|h):\d+\]\s*")
_NATIVE_ADVICE = re.compile(r"\.?\s*This is typically caused by.*$")


def one_line_error(error: BaseException) -> str:
    """``Type: first line of the message``, for a console that shows one line per error.

    An error of torch's distributed C++ layer (gloo's "Connection closed by
    peer" in a collective, a store's timeout) loses its source file and
    boilerplate advice, and says what it means: another process of the
    group is gone or stuck."""
    lines = [line.strip() for line in strip_ansi(str(error)).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    first = lines[0]
    if _NATIVE_SOURCE.match(first):
        first = _NATIVE_ADVICE.sub("", _NATIVE_SOURCE.sub("", first))
        return f"{type(error).__name__}: {first} (another process of the group is gone or stuck)"
    return f"{type(error).__name__}: {first}"


class _OneLineConsoleMixin:
    """Console formatting: an exception shows as ``(Type: message)`` after the
    record's message; its traceback is left to the log file.

    ``logging.Formatter`` caches the formatted traceback on the record for the
    next handler; this formatter neither reads nor writes that cache, so the
    file handler still writes the whole traceback.
    """

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        error = record.exc_info[1] if record.exc_info else None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            text = super().format(record)  # type: ignore[misc]
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
        return f"{text} ({one_line_error(error)})" if error is not None else text


class _PlainConsoleFormatter(_OneLineConsoleMixin, _PlainFormatter):
    pass


class _ColorfulFormatter(_LineFormatterMixin, _OneLineConsoleMixin, logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        log = super().formatMessage(record)
        if record.levelno == logging.WARNING:
            prefix = colored("WARNING", "red", attrs=["blink"])
        elif record.levelno >= logging.ERROR:
            prefix = colored("ERROR", "red", attrs=["blink", "underline"])
        else:
            return log
        return prefix + " " + log


_LINE_FORMATTERS = (_PlainFormatter, _PlainConsoleFormatter, _ColorfulFormatter)


class _TextStreamHandler(logging.StreamHandler):
    """``StreamHandler`` whose writing of a formatted line is its own method,
    shared by ``emit`` and :func:`write_info_line`."""

    def write_text(self, text: str) -> None:
        self.stream.write(text + self.terminator)
        self.flush()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write_text(self.format(record))
        except RecursionError:  # as logging's StreamHandler
            raise
        except Exception:
            self.handleError(record)


class _ConsoleHandler(_TextStreamHandler):
    """Writes to whatever ``sys.stdout`` is when a record is emitted, so that a
    replaced stdout (a notebook, a test's capture) is followed.

    One set up without a log file (``train_net``'s, while it checks the job)
    keeps the warnings it shows, up to :attr:`MAX_KEPT`: the job's own
    :func:`setup_logger`, which replaces it, puts them first in its deferred
    log file, so that ``log.txt`` has what the console said about the config.
    While a job is checked (:func:`show_warnings_once`) it shows each
    warning once: ``train_net`` looks at a job's inputs twice (before it
    starts its processes, and again in each), and the second look says
    nothing new.
    """

    MAX_KEPT = 1000

    def __init__(self, keep_warnings: bool = False) -> None:
        super().__init__(sys.stdout)
        self.kept_warnings: Optional[List[logging.LogRecord]] = [] if keep_warnings else None
        # The warnings shown, by (logger, level, text), once show_warnings_once was called.
        self.shown: Optional[Set[Tuple[str, int, str]]] = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.kept_warnings is not None and record.levelno >= logging.WARNING:
            try:
                new = self._keep(record)
            except Exception:  # a malformed call: logging's own handling reports it
                new = True
            if not new:
                return
        super().emit(record)

    def note_shown(self, records: Sequence[logging.LogRecord]) -> None:
        """Takes ``records`` as shown already (by the process that started
        this one): kept for the log file, not shown again."""
        if self.kept_warnings is None:
            return
        if self.shown is None:
            self.shown = set()
        for record in records:
            self._keep(record)

    def _keep(self, record: logging.LogRecord) -> bool:
        """Keeps a warning for the log file; False if it was shown already
        (once :func:`show_warnings_once` asked for each to be shown once)."""
        shown = self.shown
        if shown is not None:
            key = (record.name, record.levelno, record.getMessage())
            if key in shown:
                return False
            if len(shown) < self.MAX_KEPT:
                shown.add(key)
        if len(self.kept_warnings) < self.MAX_KEPT:  # type: ignore[arg-type]
            self.kept_warnings.append(record)  # type: ignore[union-attr]
        return True

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


class _GivesUpOnIOError:
    """A log file that cannot be written (a full disk) is given up after its
    first failure, with one console warning naming it and the OS error,
    instead of ``logging``'s traceback on stderr for every record."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.give_up(sys.exc_info()[1])

    def give_up(self, error: Optional[BaseException]) -> None:
        """Stops writing the file, with the one warning naming it and ``error``."""
        if self.failed:
            return
        self.failed = True
        self.setLevel(logging.CRITICAL + 1)  # type: ignore[attr-defined]
        reason = describe_os_error(error) if isinstance(error, OSError) else error
        name = getattr(self, "filename", None) or getattr(getattr(self, "stream", None), "name", "the log file")
        logging.getLogger("treadle").warning("Cannot write the log file %s (%s); logging to the console only.", name, reason)


class _FileHandler(_GivesUpOnIOError, _TextStreamHandler):
    """A stream handler on a file opened through ``PathManager``, which it owns:
    ``logging.FileHandler`` opens local paths only, and ``StreamHandler.close``
    leaves its stream open."""

    def close(self) -> None:
        try:
            self.acquire()
            try:
                if not self.stream.closed:
                    try:
                        self.flush()
                    finally:
                        self.stream.close()
            except OSError:
                pass  # a full disk: reported once by handleError
            finally:
                self.release()
        finally:
            super().close()


class _DeferredFileHandler(_GivesUpOnIOError, logging.Handler):
    """A file handler that keeps its records in memory until :meth:`start`.

    A job logs from its first line (environment, model, config errors), but
    must not write into its output directory before its inputs are checked
    and the directory is claimed: an invalid job leaves an earlier run's
    ``log.txt`` as it was. :func:`start_log_files` opens the file and writes
    what was kept, in order and with the original times.
    """

    # Records kept before the start; a job that logs more before training
    # starts keeps the last ones and says how many were dropped.
    MAX_PENDING = 50_000

    def __init__(self, filename: str, earlier: Sequence[logging.LogRecord] = ()) -> None:
        super().__init__(logging.DEBUG)
        self.filename = filename
        # Records logged before this handler was set up, to begin the file with.
        self._pending: List[logging.LogRecord] = list(earlier)
        self._dropped = 0
        self._stream: Optional[IO[str]] = None

    @property
    def started(self) -> bool:
        return self._stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if self._stream is None:
            if len(self._pending) >= self.MAX_PENDING:
                self._pending.pop(0)
                self._dropped += 1
            self._pending.append(record)
            return
        try:
            self.write_text(self.format(record))
        except Exception:
            self.handleError(record)

    def write_text(self, text: str) -> None:
        """Writes a formatted line; the file must be started."""
        self._stream.write(text + "\n")  # type: ignore[union-attr]
        self._stream.flush()  # type: ignore[union-attr]

    def start(self, output: Optional[str] = None) -> None:
        """Opens the file (appending) and writes the records kept so far;
        ``output`` moves the file to another directory (same file name)."""
        if self._stream is not None or self.failed:
            return
        if output is not None:
            self.filename = os.path.join(output, os.path.basename(self.filename))
        pending, self._pending = self._pending, []
        stream: Optional[IO[str]] = None
        try:
            PathManager.mkdirs(os.path.dirname(self.filename) or ".")
            stream = PathManager.open(self.filename, "a")
            if self._dropped:
                stream.write(f"[{self._dropped} earlier log records were not kept]\n")
            for record in pending:
                stream.write(self.format(record) + "\n")
            stream.flush()
        except OSError as e:  # a full disk: as when a write fails later, the run goes on with the console
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
            self.give_up(e)
            return
        self._dropped = 0
        self._stream = stream

    def close(self) -> None:
        try:
            if self._stream is not None and not self._stream.closed:
                try:
                    self._stream.flush()
                finally:
                    self._stream.close()
        except OSError:
            pass  # a full disk: reported once by handleError
        finally:
            self._pending = []
            super().close()


_LINE_HANDLERS = (_ConsoleHandler, _FileHandler, _DeferredFileHandler)


def _line_handlers(logger: logging.Logger) -> Optional[List[logging.Handler]]:
    """The handlers an INFO record of ``logger`` reaches, when they are all
    :func:`setup_logger`'s own, unfiltered and with its formats, and nothing
    else (a filter, a record factory) would see the record; else ``None``."""
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    handlers: List[logging.Handler] = []
    current: Optional[logging.Logger] = logger
    while current is not None:
        if current.filters or current.disabled:
            return None
        for handler in current.handlers:
            if logging.INFO < handler.level:
                continue
            if (
                type(handler) not in _LINE_HANDLERS
                or handler.filters
                or not isinstance(handler.formatter, _LineFormatterMixin)
                or not handler.formatter.formats_lines()
                or (isinstance(handler, _DeferredFileHandler) and not handler.started)
            ):
                return None
            handlers.append(handler)
        current = current.parent if current.propagate else None  # type: ignore[assignment]
    return handlers or None


def write_info_line(logger: logging.Logger, line: str, make_record: Callable[[], logging.LogRecord]) -> bool:
    """Writes ``line`` as ``logger.info(line)`` would, without a ``LogRecord``,
    when only :func:`setup_logger`'s handlers would see it; returns ``False``,
    having written nothing, otherwise (the caller then logs it).

    For a line logged every few milliseconds (the training status line):
    right after a training step, logging's path through record, handlers and
    formatters runs with cold CPU caches and costs a fifth of a flush. The
    text is the same, handler locks are taken, and a failed write goes to
    the handler's ``handleError`` with the record ``make_record()`` builds.
    The caller checks ``logger.isEnabledFor(logging.INFO)``.
    """
    handlers = _line_handlers(logger)
    if handlers is None:
        return False
    created = time.time()
    name = logger.name
    for handler in handlers:
        text = handler.formatter.format_info_line(name, line, created)  # type: ignore[union-attr]
        handler.acquire()
        try:
            handler.write_text(text)  # type: ignore[attr-defined]
        except RecursionError:
            raise
        except Exception:
            handler.handleError(make_record())
        finally:
            handler.release()
    return True


def _installation_dirs() -> Tuple[str, ...]:
    """Where Python's installation keeps code: the standard library and site-packages."""
    paths = sysconfig.get_paths()
    dirs = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)}
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    dirs.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


class _UserRecords(logging.Handler):
    """The root logger's handler that :func:`setup_logger` installs: hands
    the records of the user's own loggers, whatever their names, to the
    ``treadle`` logger's console and log file.

    A record is passed on when it is a warning or worse; when its logger's
    top-level name is not a package imported from Python's installation
    (the standard library, site-packages): ``__main__``, a script's or a
    project's module, a name that is no module (``libai.trainer``); or when
    a level was set on its logger or a parent below the root (a library
    asked to be heard: ``logging.getLogger("urllib3").setLevel(logging.INFO)``).
    A library's INFO chatter (matplotlib, urllib3, numexpr) stays out.
    Where the root logger has a console of the user's own (``logging.basicConfig``),
    records go to the log file only: that console shows them already.
    """

    def __init__(self, target: logging.Logger) -> None:
        super().__init__(logging.DEBUG)
        self.target = target
        self._installation = _installation_dirs()
        # Top-level name -> is a library's; kept for names that are imported modules.
        self._libraries: Dict[str, bool] = {}

    def _is_library(self, name: str) -> bool:
        top = name.partition(".")[0]
        known = self._libraries.get(top)
        if known is not None:
            return known
        module = sys.modules.get(top)
        if module is None or top == "__main__":
            return False  # no module (yet): a name of the user's choosing; the script or notebook run
        found = [getattr(module, "__file__", None)] + list(getattr(module, "__path__", None) or ())
        files = [os.path.realpath(f) for f in found if f]
        # A built-in module (sys) has no file: the installation's.
        library = not files or any(f.startswith(self._installation) for f in files)
        self._libraries[top] = library
        return library

    def wanted(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is one the user's console and log file show."""
        if record.levelno >= logging.WARNING or not self._is_library(record.name):
            return True
        logger: Optional[logging.Logger] = logging.getLogger(record.name)
        while logger is not None and logger is not logging.root:
            if logger.level != logging.NOTSET:
                return True
            logger = logger.parent  # type: ignore[assignment]
        return False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.wanted(record):
            return
        users_console = any(_is_console(h) for h in logging.root.handlers)
        for handler in self.target.handlers:
            # setup_logger's own only: a handler someone else put on the logger takes what they chose.
            if not getattr(handler, "_treadle_handler", False) or (users_console and isinstance(handler, _ConsoleHandler)):
                continue
            if record.levelno >= handler.level:
                handler.handle(record)


def _is_console(handler: logging.Handler) -> bool:
    """A stream handler of the user's own on the terminal (``logging.basicConfig``'s)."""
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return (isinstance(handler, logging.StreamHandler) and not getattr(handler, "_treadle_handler", False)
            and getattr(handler, "stream", None) in streams)


def _is_users_file(handler: logging.Handler) -> bool:
    """A log file of the user's own (``logging.basicConfig(filename=...)``'s);
    a handler writing to the null device (pytest's default) is no one's file."""
    return (isinstance(handler, logging.FileHandler) and not getattr(handler, "_treadle_handler", False)
            and handler.baseFilename != os.path.abspath(os.devnull))


def _hear_user_loggers(logger: logging.Logger) -> None:
    """Replaces the root logger's :class:`_UserRecords` with one for
    ``logger``'s handlers, and lets the root pass INFO records (its default
    is WARNING) unless the user configured a console or a file there (then
    its level is theirs: their file must not get every library's INFO)."""
    root = logging.root
    for old in [h for h in root.handlers if isinstance(h, _UserRecords)]:
        root.removeHandler(old)
    if all(isinstance(h, logging.NullHandler) for h in logger.handlers):
        return  # a rank without console or file: quiet, as Python is by default
    handler = _UserRecords(logger)
    handler._treadle_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    if root.level > logging.INFO and not any(_is_console(h) or _is_users_file(h) for h in root.handlers):
        root.setLevel(logging.INFO)


def start_log_files(name: str = "treadle", *, output: Optional[str] = None) -> None:
    """Starts the log files that :func:`setup_logger` deferred (``defer_file=True``)
    on the ``name`` logger: they are written from now on, beginning with every
    record logged so far. ``output`` puts them in that directory instead of
    the one given to ``setup_logger``."""
    for handler in logging.getLogger(name).handlers:
        if isinstance(handler, _DeferredFileHandler):
            handler.start(output)


def setup_logger(
    output: Optional[str] = None,
    distributed_rank: int = 0,
    *,
    color: bool = True,
    name: str = "treadle",
    abbrev_name: Optional[str] = None,
    defer_file: bool = False,
) -> logging.Logger:
    """Configures the ``name`` logger.

    Calling it again (a second job in one process) replaces the handlers the
    previous call installed, so that a run never logs into another run's file.

    The console shows one line per record: an exception logged with its
    traceback shows there as ``Type: message``; the traceback goes to the log
    file only. The console shows INFO and above; the file DEBUG records too.

    The user's own loggers are heard too, whatever their names (LiBai's
    ``logging.getLogger("libai." + __name__)``, a script's ``__name__``):
    with the default ``name``, the root logger gets a handler that passes
    their records, INFO and above, to this logger's console and file, and
    the root's level is lowered to INFO (unless the user put a console of
    their own on it, ``logging.basicConfig``: that console shows their
    records, the file gets them too). Libraries' loggers (a package imported
    from the standard library or site-packages: matplotlib, urllib3, torch)
    reach them with warnings and errors only, or at the level set on them.
    A rank without console or file leaves the root logger as it is.

    Args:
        output: a file name ending in ``.txt``/``.log``, or a directory in which
            ``log.txt`` is written. Ranks other than 0 write ``log.txt.rank{N}``.
        distributed_rank: only rank 0 logs to the console.
        color: color the console output (only when it is a terminal).
        defer_file: keep the file's records in memory until
            :func:`start_log_files` is called, so that nothing is written
            before the job has checked its inputs and claimed its folder.
            The file then begins with the warnings shown by a console this
            call replaces that was set up without a file (``output=None``).
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    earlier = _remove_own_handlers(logger)
    abbrev_name = abbrev_name or ("tr" if name == "treadle" else name)
    handlers: list = []
    if distributed_rank == 0:
        handlers.append(_console_handler(keep_warnings=output is None, color=color))
    if output is not None:
        handlers.append(_file_handler(output, distributed_rank, defer_file, earlier))
    if not handlers:
        # A rank other than 0 without a file: it shows nothing. Without a
        # handler, Python's last resort would print its warnings bare on stderr.
        handlers.append(logging.NullHandler())
    for h in handlers:
        h._treadle_handler = True  # type: ignore[attr-defined]
        logger.addHandler(h)
    if name == "treadle":
        _hear_user_loggers(logger)
    return logger


def _remove_own_handlers(logger: logging.Logger) -> List[logging.LogRecord]:
    """Removes and closes the handlers an earlier :func:`setup_logger` put on
    ``logger``; returns the warnings its file-less console kept, for the new file."""
    earlier: List[logging.LogRecord] = []
    for old in [h for h in logger.handlers if getattr(h, "_treadle_handler", False)]:
        if isinstance(old, _ConsoleHandler) and old.kept_warnings:
            earlier += old.kept_warnings
        logger.removeHandler(old)
        old.close()
    return earlier


def _console_handler(*, keep_warnings: bool, color: bool) -> _ConsoleHandler:
    """Rank 0's console: INFO and above, one line per record, colored on a terminal."""
    handler = _ConsoleHandler(keep_warnings=keep_warnings)
    # DEBUG records (the full timing table, ...) go to the file only.
    handler.setLevel(logging.INFO)
    if color and sys.stdout.isatty():
        handler.setFormatter(
            _ColorfulFormatter(
                colored("[%(asctime)s %(name)s]: ", "green") + "%(message)s",
                datefmt="%m/%d %H:%M:%S",
            )
        )
    else:
        handler.setFormatter(
            _PlainConsoleFormatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s", datefmt="%m/%d %H:%M:%S")
        )
    return handler


def _file_handler(
    output: str, distributed_rank: int, defer_file: bool, earlier: Sequence[logging.LogRecord]
) -> logging.Handler:
    """The log file of this rank in ``output`` (see :func:`setup_logger`), with DEBUG records too."""
    if output.endswith((".txt", ".log")):
        filename = output
    else:
        filename = os.path.join(output, "log.txt")
    if distributed_rank > 0:
        filename = f"{filename}.rank{distributed_rank}"
    file_handler: logging.Handler
    if defer_file:
        file_handler = _DeferredFileHandler(filename, earlier)
    else:
        PathManager.mkdirs(os.path.dirname(filename) or ".")
        file_handler = _FileHandler(PathManager.open(filename, "a"))
    file_handler.setLevel(logging.DEBUG)
    file_handler.setFormatter(
        _PlainFormatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s", datefmt="%m/%d %H:%M:%S")
    )
    return file_handler


def shown_warnings(name: str = "treadle") -> List[Dict[str, Any]]:
    """The warnings the ``name`` logger's console showed while no log file
    was set up (a job's checks), as picklable attributes: for the processes
    the job then starts (see :func:`note_warnings_shown`)."""
    fields = ("name", "levelno", "levelname", "pathname", "lineno", "created", "msecs", "relativeCreated")
    shown = []
    for handler in logging.getLogger(name).handlers:
        for record in getattr(handler, "kept_warnings", None) or ():
            try:
                text = record.getMessage()
            except Exception:  # a malformed call, reported by logging where it was made
                continue
            shown.append({**{key: getattr(record, key) for key in fields}, "msg": text, "args": None})
    return shown


def show_warnings_once(name: str = "treadle") -> None:
    """From now until the ``name`` logger's console is replaced (the job's
    own :func:`setup_logger`), the console set up without a log file shows a
    warning it has shown already no more: for a job's checks, which
    ``train_net`` runs twice."""
    for handler in logging.getLogger(name).handlers:
        if isinstance(handler, _ConsoleHandler) and handler.kept_warnings is not None and handler.shown is None:
            handler.shown = set()


def note_warnings_shown(shown: Sequence[Dict[str, Any]], name: str = "treadle") -> None:
    """In a process a job started: takes the warnings that the starting
    process showed (:func:`shown_warnings`) as shown by this one's console,
    which does not print them again when this process checks the job, and
    keeps them for the beginning of ``log.txt``."""
    records = [logging.makeLogRecord(dict(attributes)) for attributes in shown]
    for handler in logging.getLogger(name).handlers:
        if isinstance(handler, _ConsoleHandler):
            handler.note_shown(records)


def forget_kept_warnings(name: str = "treadle") -> None:
    """Drops the warnings (and errors) that the ``name`` logger's console
    without a log file kept for the next log file: a run that ended took
    them with it, and the next run's ``log.txt`` must not begin with an
    earlier run's error (a ``Trainer`` without ``output_dir`` that failed,
    then one with it, in one process)."""
    for handler in logging.getLogger(name).handlers:
        if isinstance(handler, _ConsoleHandler) and handler.kept_warnings:
            handler.kept_warnings.clear()


def is_set_up(name: str = "treadle") -> bool:
    """Whether :func:`setup_logger` configured the ``name`` logger in this process."""
    return any(getattr(h, "_treadle_handler", False) for h in logging.getLogger(name).handlers)


def log_once(logger: logging.Logger, level: int, msg: str, *args) -> None:
    """Logs ``msg`` the first time it is seen in this process, then never again."""
    key = (logger.name, msg)
    if key in _LOGGED_ONCE:
        return
    _LOGGED_ONCE.add(key)
    logger.log(level, msg, *args)
