"""setup_logger: files per run, closed when replaced, no color codes in files."""

import errno
import logging
import pickle

from termcolor import colored

from treadle.utils.logger import setup_logger, strip_ansi


def _file_streams(logger):
    return [h.stream for h in logger.handlers if str(getattr(h.stream, "name", "")).endswith("log.txt")]


def test_a_second_setup_closes_the_first_runs_file(tmp_path):
    name = "treadle_test_logger"
    first = setup_logger(str(tmp_path / "run1"), name=name)
    (old_stream,) = _file_streams(first)
    first.info("into run 1")
    second = setup_logger(str(tmp_path / "run2"), name=name)
    second.info("into run 2")
    try:
        assert old_stream.closed
        run1 = (tmp_path / "run1" / "log.txt").read_text()
        assert "into run 1" in run1 and "into run 2" not in run1
        assert "into run 2" in (tmp_path / "run2" / "log.txt").read_text()
    finally:
        for handler in list(second.handlers):
            second.removeHandler(handler)
            handler.close()


def test_log_files_hold_no_color_codes(tmp_path):
    name = "treadle_test_logger_color"
    logger = setup_logger(str(tmp_path), name=name)
    try:
        logger.info("loss: %s", colored("0.5", "cyan"))
        text = (tmp_path / "log.txt").read_text()
        assert "loss: 0.5" in text and "\x1b[" not in text
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
    assert strip_ansi(colored("x", "red", attrs=["bold"])) == "x"


class _FullDisk:
    """A log file's stream on a full disk."""

    def __init__(self, path):
        self.name, self.closed = str(path), False

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self.closed = True


def test_a_log_file_that_cannot_be_written_is_one_warning(tmp_path, capfd):
    import logging

    name = "treadle"
    logger = setup_logger(str(tmp_path), name=name)
    handler = next(h for h in logger.handlers if str(getattr(getattr(h, "stream", None), "name", "")).endswith("log.txt"))

    real, handler.stream = handler.stream, _FullDisk(tmp_path / "log.txt")
    try:
        for i in range(5):
            logger.info("record %d", i)
        out, err = capfd.readouterr()
        assert err == ""  # no "--- Logging error ---" tracebacks
        assert out.count("Cannot write the log file") == 1 and "No space left on device" in out
        assert out.count("record") == 5  # the console goes on
    finally:
        real.close()
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()
        logging.getLogger(name).propagate = True


# ---------------------------------------------------------------- status lines without a record
def _close(logger):
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()


def _frozen_clock(monkeypatch):
    import time

    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000 * 10**9)


def test_a_line_written_without_a_record_reads_as_logging_writes_it(tmp_path, capsys, monkeypatch):
    import logging

    from treadle.utils.logger import _ColorfulFormatter, write_info_line

    _frozen_clock(monkeypatch)
    parent = setup_logger(str(tmp_path), name="treadle_test_lines")
    child = logging.getLogger("treadle_test_lines.printer")
    line = "iter: 19/100  total_loss: " + colored("0.5", "cyan", attrs=["bold"], force_color=True)
    try:
        for colorful in (False, True):
            if colorful:  # what setup_logger gives a terminal
                console = next(h for h in parent.handlers if not hasattr(h, "filename"))
                console.setFormatter(
                    _ColorfulFormatter(colored("[%(asctime)s %(name)s]: ", "green", force_color=True) + "%(message)s",
                                       datefmt="%m/%d %H:%M:%S")
                )
            child.info(line)
            assert write_info_line(child, line, lambda: None) is True
            out = capsys.readouterr().out.splitlines()
            # A console that is not a terminal gets no color codes either.
            assert len(out) == 2 and out[0] == out[1] and out[0].endswith(line if colorful else strip_ansi(line)), out
            assert ("\x1b[32m" in out[0]) is colorful  # the green prefix
        logged = (tmp_path / "log.txt").read_text().splitlines()
        assert len(logged) == 4 and len(set(logged)) == 1, logged
        assert logged[0].endswith("iter: 19/100  total_loss: 0.5")  # no color codes in the file
        # A minute later: the time in the line moves on (it is kept per second).
        import time

        monkeypatch.setattr(time, "time", lambda: 1_700_000_061.0)
        monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_061 * 10**9)
        child.info(line)
        assert write_info_line(child, line, lambda: None) is True
        later = (tmp_path / "log.txt").read_text().splitlines()[4:]
        assert len(later) == 2 and later[0] == later[1] and later[0] != logged[0], later
    finally:
        _close(parent)


def test_a_line_goes_through_logging_when_anything_else_would_see_it(tmp_path, capsys, monkeypatch):
    import logging

    from treadle.utils.logger import _PlainFormatter, write_info_line

    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record)

    def user_factory(*args, **kwargs):
        return logging.LogRecord(*args, **kwargs)

    parent = setup_logger(str(tmp_path), name="treadle_test_fallback")
    child = logging.getLogger("treadle_test_fallback.printer")
    file_handler = next(h for h in parent.handlers if hasattr(h, "filename") or "log.txt" in str(getattr(h.stream, "name", "")))
    changes = {
        "a filter on the logger": (lambda: child.addFilter(lambda r: True), lambda: child.filters.clear()),
        "another handler": (lambda: parent.addHandler(Collect()), lambda: parent.removeHandler(parent.handlers[-1])),
        "a filter on a handler": (lambda: file_handler.addFilter(lambda r: True), lambda: file_handler.filters.clear()),
        "a record factory": (lambda: logging.setLogRecordFactory(user_factory),
                             lambda: logging.setLogRecordFactory(logging.LogRecord)),
        "a format with other fields": (
            lambda: file_handler.setFormatter(_PlainFormatter("%(process)d %(message)s", datefmt="%H")),
            lambda: file_handler.setFormatter(_PlainFormatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s",
                                                              datefmt="%m/%d %H:%M:%S")),
        ),
    }
    try:
        before = (tmp_path / "log.txt").read_text()
        for reason, (change, undo) in changes.items():
            change()
            try:
                assert write_info_line(child, "a line", lambda: None) is False, reason
            finally:
                undo()
        assert capsys.readouterr().out == "" and (tmp_path / "log.txt").read_text() == before and not seen
        assert write_info_line(child, "a line", lambda: None) is True
    finally:
        _close(parent)


def test_a_line_before_the_log_file_starts_is_kept_as_a_record(tmp_path, capsys):
    import logging

    from treadle.utils.logger import start_log_files, write_info_line

    parent = setup_logger(str(tmp_path), name="treadle_test_deferred", defer_file=True)
    child = logging.getLogger("treadle_test_deferred.printer")
    try:
        # The deferred file keeps records: the caller must make one.
        assert write_info_line(child, "early", lambda: None) is False
        child.info("early")
        start_log_files("treadle_test_deferred")
        assert write_info_line(child, "late", lambda: None) is True
        assert [line.split(": ", 1)[1] for line in (tmp_path / "log.txt").read_text().splitlines()] == ["early", "late"]
    finally:
        _close(parent)


def test_warnings_shown_before_the_log_file_was_set_up_begin_it(tmp_path):
    # train_net: a console while the job is checked, then the job's own logger.
    from treadle.utils.logger import start_log_files

    console = setup_logger(None, name="treadle_test_early")
    console.warning("train.new_key is not a key")
    console.info("checked")
    job = setup_logger(str(tmp_path / "run"), name="treadle_test_early", defer_file=True)
    try:
        job.info("environment")
        start_log_files("treadle_test_early")
        lines = [line.split(": ", 1)[1] for line in (tmp_path / "run" / "log.txt").read_text().splitlines()]
        assert lines == ["train.new_key is not a key", "environment"]
        # A later job's file does not begin with the earlier job's warnings.
        job.warning("in the first run")
        second = setup_logger(str(tmp_path / "second"), name="treadle_test_early", defer_file=True)
        second.info("second run")
        start_log_files("treadle_test_early")
        assert (tmp_path / "second" / "log.txt").read_text().count(": ") == 1
    finally:
        _close(logging.getLogger("treadle_test_early"))


def test_a_console_without_a_file_shows_a_warning_once_and_a_started_process_not_again(tmp_path, capsys):
    # train_net's console while it checks a job, which it checks twice.
    from treadle.utils.logger import note_warnings_shown, show_warnings_once, shown_warnings, start_log_files

    name = "treadle_test_checks"
    console = setup_logger(None, name=name)
    try:
        # A console of one's own (no log file) shows every warning...
        console.warning("repeated")
        console.warning("repeated")
        console.warning("bad %d", "x")  # ... a malformed call goes to logging's error report, as before
        assert capsys.readouterr().out.count("repeated") == 2
        # ... while a job is checked, each once.
        console = setup_logger(None, name=name)
        show_warnings_once(name)
        for _ in range(2):
            console.warning("Override value %r does not parse", "[1,")
        console.info("checked")
        console.info("checked")
        console.warning("bad %d", "x")  # reported by logging, not raised into the caller
        out = capsys.readouterr().out
        assert out.count("Override value '[1,' does not parse") == 1 and out.count("checked") == 2
        shown = shown_warnings(name)
        assert [w["msg"] for w in shown] == ["Override value '[1,' does not parse"]
        # A process the job starts: its console takes them as shown, and its log file begins with them.
        worker = setup_logger(None, name=name)
        note_warnings_shown(pickle.loads(pickle.dumps(shown)), name)  # as the launcher sends them
        worker.warning("Override value %r does not parse", "[1,")
        worker.warning("a warning of the started process")
        out = capsys.readouterr().out
        assert "does not parse" not in out and out.count("a warning of the started process") == 1
        job = setup_logger(str(tmp_path), name=name, defer_file=True)
        job.info("environment")
        start_log_files(name)
        lines = [line.split(": ", 1)[1] for line in (tmp_path / "log.txt").read_text().splitlines()]
        assert lines == ["Override value '[1,' does not parse", "a warning of the started process", "environment"]
    finally:
        _close(logging.getLogger(name))


def test_a_rank_without_console_or_file_prints_nothing(capfd):
    logger = setup_logger(None, distributed_rank=1, name="treadle_test_rank1")
    try:
        logger.warning("a warning rank 0 shows")
        out, err = capfd.readouterr()
        assert "a warning rank 0 shows" not in out + err  # not Python's last-resort stderr either
    finally:
        _close(logger)


def test_a_line_the_log_file_cannot_take_is_one_warning(tmp_path, capfd):
    import logging

    from treadle.utils.logger import write_info_line

    logger = setup_logger(str(tmp_path), name="treadle")
    child = logging.getLogger("treadle.events.printer")
    handler = next(h for h in logger.handlers if str(getattr(getattr(h, "stream", None), "name", "")).endswith("log.txt"))

    def record():
        return child.makeRecord(child.name, logging.INFO, __file__, 1, "status", (), None)

    real, handler.stream = handler.stream, _FullDisk(tmp_path / "log.txt")
    try:
        for i in range(5):
            assert write_info_line(child, f"status {i}", record) is True
        out, err = capfd.readouterr()
        assert err == ""
        assert out.count("Cannot write the log file") == 1 and "No space left on device" in out
        assert out.count("status") == 5  # the console goes on
    finally:
        real.close()
        _close(logger)
        logging.getLogger("treadle").propagate = True


def test_the_printer_writes_its_line_to_the_log_file_and_names_itself_in_records(tmp_path):
    import logging

    from treadle.events import CommonMetricPrinter, EventStorage

    logger = setup_logger(str(tmp_path), name="treadle")
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record)

    try:
        with EventStorage() as storage:
            printer = CommonMetricPrinter(10)
            storage.put_scalar("total_loss", 0.25)
            printer.write()  # only setup_logger's handlers: no record
            logger.addHandler(Collect())
            storage.step()
            storage.put_scalar("total_loss", 0.5)
            printer.write()  # a handler of the user's: a record, from _log
        lines = [line for line in (tmp_path / "log.txt").read_text().splitlines() if "total_loss" in line]
        # The second line's loss is the median of both iterations.
        assert [line.split("iter: ")[1] for line in lines] == ["0/10  total_loss: 0.25", "1/10  total_loss: 0.375"]
        (record,) = seen
        assert record.funcName == "_log" and record.pathname.endswith("printer.py") and record.name == "treadle.events.printer"
    finally:
        _close(logger)
        logging.getLogger("treadle").propagate = True


def test_a_log_file_that_cannot_be_started_is_one_warning_naming_it(tmp_path, capfd, monkeypatch):
    # log.txt is started when training starts (default_setup defers it): a full
    # disk then is said as later, naming the file, and the run goes on.
    from treadle.utils import logger as logger_module
    from treadle.utils.logger import start_log_files

    name = "treadle"
    logger = setup_logger(str(tmp_path), name=name, defer_file=True)
    logger.info("before the start")
    monkeypatch.setattr(logger_module.PathManager, "open", lambda path, mode="r", **kw: _FullDisk(path))
    try:
        start_log_files(name)
        logger.info("after the start")
        out, err = capfd.readouterr()
        assert err == ""
        (warning,) = [line for line in out.splitlines() if "Cannot write the log file" in line]
        assert str(tmp_path / "log.txt") in warning and "No space left on device (ENOSPC)" in warning
        assert "after the start" in out
    finally:
        _close(logger)


def test_a_users_own_logger_reaches_the_console_and_the_log_file_and_a_librarys_info_does_not(tmp_path, capsys):
    """LiBai's ``logging.getLogger("libai." + __name__)`` in a hook, or a
    script's ``__name__``: shown at INFO; a library's INFO (the standard
    library's json, torch) is not, its warning is."""
    import json  # noqa: F401 - imported: a library's logger

    import torch  # noqa: F401

    setup_logger(str(tmp_path))
    logging.getLogger("libai.myhook").info("start training at 0")
    logging.getLogger("__main__").info("from the script")
    logging.getLogger("json").info("json's chatter")
    logging.getLogger("torch.something").info("torch's chatter")
    logging.getLogger("json").warning("json's warning")
    out = capsys.readouterr().out
    log = (tmp_path / "log.txt").read_text()
    for text in (out, log):
        assert "libai.myhook INFO: start training at 0" in text
        assert "__main__ INFO: from the script" in text
        assert "json WARNING: json's warning" in text
        assert "chatter" not in text
    # A library that asked to be heard (a level set on its logger) is shown.
    logging.getLogger("json").setLevel(logging.INFO)
    try:
        logging.getLogger("json.decoder").info("asked for")
    finally:
        logging.getLogger("json").setLevel(logging.NOTSET)
    assert "json.decoder INFO: asked for" in capsys.readouterr().out


def test_a_users_own_console_on_the_root_logger_shows_their_records_once(tmp_path, capsys):
    """``logging.basicConfig``: its console shows the user's records, treadle's
    log file gets them too, and the root's level stays the user's."""
    import sys

    root = logging.getLogger()
    theirs = logging.StreamHandler(sys.stdout)
    theirs.setFormatter(logging.Formatter("THEIRS %(name)s %(message)s"))
    root.addHandler(theirs)
    try:
        root.setLevel(logging.INFO)
        setup_logger(str(tmp_path))
        logging.getLogger("libai.myhook").info("one line")
        out = capsys.readouterr().out
    finally:
        root.removeHandler(theirs)
    assert out.count("one line") == 1 and "THEIRS libai.myhook one line" in out
    assert "libai.myhook INFO: one line" in (tmp_path / "log.txt").read_text()


def test_a_rank_without_console_or_file_leaves_the_root_logger_alone(capfd):
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    setup_logger(None, distributed_rank=1)
    assert (root.level, list(root.handlers)) == before
    logging.getLogger("libai.myhook").info("rank 1 says")
    out, err = capfd.readouterr()
    assert "rank 1 says" not in out + err


def test_a_users_own_log_file_on_the_root_logger_keeps_the_level_they_gave_it(tmp_path):
    """``logging.basicConfig(filename=...)`` at the default WARNING: treadle
    does not lower the root's level, or every library's INFO records would
    land in the user's file."""
    root = logging.getLogger()
    theirs = logging.FileHandler(tmp_path / "theirs.log")
    level = root.level
    root.addHandler(theirs)
    try:
        root.setLevel(logging.WARNING)
        setup_logger(str(tmp_path / "run"))
        logging.getLogger("some_library").info("library chatter")
        logging.getLogger("some_library").warning("library warning")
        theirs.flush()
        assert root.level == logging.WARNING
    finally:
        root.removeHandler(theirs)
        theirs.close()
        root.setLevel(level)
    text = (tmp_path / "theirs.log").read_text()
    assert "library warning" in text and "library chatter" not in text
