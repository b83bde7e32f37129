"""setup_logger: files per run, closed when replaced, no color codes in files."""

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


def test_a_log_file_that_cannot_be_written_is_one_warning(tmp_path, capfd):
    import errno
    import logging

    name = "treadle"
    logger = setup_logger(str(tmp_path), name=name)
    handler = next(h for h in logger.handlers if str(getattr(getattr(h, "stream", None), "name", "")).endswith("log.txt"))

    class FullDisk:
        name = str(tmp_path / "log.txt")
        closed = False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.closed = True

    real, handler.stream = handler.stream, FullDisk()
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
