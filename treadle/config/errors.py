"""The one exception type of :mod:`treadle.config`."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A problem with a config: a file, a key, an override or a ``_target_``.

    The message is always a single line that names the culprit (the file and
    line, the full key, the config path of a node), so that a command line tool
    can print ``str(error)`` without a traceback. Multi-line messages coming from
    other libraries are folded onto one line. When the error was caused by
    another exception, that exception is chained (``raise ... from``) for the
    cases where a traceback is wanted.
    """

    def __init__(self, message: str) -> None:
        lines = [line.strip() for line in str(message).splitlines() if line.strip()]
        super().__init__("; ".join(lines))


def first_line(error: BaseException) -> str:
    """The first line of ``str(error)``: OmegaConf appends ``full_key: ...`` and
    ``object_type=...`` lines, which treadle's messages name in their own words."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
