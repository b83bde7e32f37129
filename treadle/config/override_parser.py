"""Parsing of command-line overrides (``key=value``) without hydra.

The value language is a small, predictable subset of YAML flow syntax:

==========================  =====================================
text                        value
==========================  =====================================
``1``, ``-3``, ``1_000``    int
``0.5``, ``1e-3``, ``inf``  float (also ``-inf``, ``nan``, ``.inf``)
``true``, ``False``         bool (only true/false, any case)
``None``, ``null``, ``~``   None
``'a b'``, ``"a,b"``        str, quotes removed (``\\'`` escapes)
``[1, a, [2]]``             list
``{a: 1, b: [x]}``          dict (keys are strings)
anything else               str, as written (``a=b``, ``http://x``)
(empty)                     ``""``
==========================  =====================================

Unlike YAML 1.1, ``yes``/``no``/``on``/``off`` stay strings and ``010`` is 10.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from .errors import ConfigError

__all__ = ["Override", "parse_override", "parse_value"]

logger = logging.getLogger(__name__)

_INT = re.compile(r"[-+]?\d+(_\d+)*")
_DIGITS = r"\d+(_\d+)*"
_FLOAT = re.compile(rf"[-+]?({_DIGITS}(\.({_DIGITS})?)?|\.{_DIGITS})([eE][-+]?\d+)?")
_SPECIAL_FLOATS = {
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    ".inf": math.inf,
    "+.inf": math.inf,
    "-.inf": -math.inf,
    "nan": math.nan,
    ".nan": math.nan,
}
_NONE = {"None", "null", "Null", "NULL", "~"}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}
# A plain (unquoted) item inside [...] or {...} ends at one of these.
_PLAIN_STOPS = ",]}"
_KEY_STOPS = ":,[]{}"


@dataclass(frozen=True)
class Override:
    """One parsed override.

    Attributes:
        key: the dotted key, without the ``+`` prefix (``"train.max_iter"``).
        value: the parsed value.
        add: whether the override was written ``+key=value`` (the key must be new).
        text: the override as the user wrote it, for error messages.
    """

    key: str
    value: Any
    add: bool
    text: str


def _scalar(text: str) -> Any:
    """Converts one unquoted, stripped token."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if text in _NONE:
        return None
    if _INT.fullmatch(text):
        return int(text)
    if lowered in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[lowered]
    if _FLOAT.fullmatch(text) and ("." in text or "e" in lowered):
        return float(text.replace("_", ""))
    return text


class _ParseError(Exception):
    pass


class _Parser:
    """Recursive descent over one value: lists, dicts, quoted strings, plain tokens."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _expect(self, char: str) -> None:
        self._skip_ws()
        if self._peek() != char:
            found = repr(self._peek()) if self._peek() else "the end"
            raise _ParseError(f"expected '{char}' at position {self.pos}, found {found}")
        self.pos += 1

    def parse_top(self) -> Any:
        value = self.item()
        self._skip_ws()
        if self.pos != len(self.text):
            rest = self.text[self.pos :]
            raise _ParseError(f"unexpected text after position {self.pos}: {rest!r}")
        return value

    def item(self) -> Any:
        self._skip_ws()
        char = self._peek()
        if char == "[":
            return self._list()
        if char == "{":
            return self._dict()
        if char in ("'", '"'):
            return self._quoted()
        return _scalar(self._plain(_PLAIN_STOPS))

    def _plain(self, stops: str) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in stops:
            self.pos += 1
        token = self.text[start : self.pos].strip()
        if not token:
            raise _ParseError(f"empty item at position {start}")
        return token

    def _quoted(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        chars: List[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            self.pos += 1
            if char == quote:
                return "".join(chars)
            if char == "\\" and self.pos < len(self.text) and self.text[self.pos] in _ESCAPES:
                chars.append(_ESCAPES[self.text[self.pos]])
                self.pos += 1
            else:
                # Other backslashes are literal, so that C:\data stays C:\data.
                chars.append(char)
        raise _ParseError(f"unterminated {quote} quote")

    def _sequence(self, close: str, parse_entry: Any) -> None:
        """Parses ``entry (, entry)* [,] close``, the opening bracket already consumed."""
        self._skip_ws()
        if self._peek() == close:
            self.pos += 1
            return
        while True:
            parse_entry()
            self._skip_ws()
            char = self._peek()
            if char == ",":
                self.pos += 1
                self._skip_ws()
                if self._peek() == close:  # a trailing comma, as Python allows
                    self.pos += 1
                    return
            elif char == close:
                self.pos += 1
                return
            else:
                found = repr(char) if char else "the end"
                raise _ParseError(
                    f"expected ',' or '{close}' at position {self.pos}, found {found}"
                )

    def _list(self) -> List[Any]:
        self.pos += 1
        items: List[Any] = []
        self._sequence("]", lambda: items.append(self.item()))
        return items

    def _dict(self) -> Dict[str, Any]:
        self.pos += 1
        result: Dict[str, Any] = {}

        def entry() -> None:
            self._skip_ws()
            key = self._quoted() if self._peek() in ("'", '"') else self._plain(_KEY_STOPS)
            if key in result:
                raise _ParseError(f"duplicate key {key!r}")
            self._expect(":")
            result[key] = self.item()

        self._sequence("}", entry)
        return result


def parse_value(text: str) -> Any:
    """Parses the value part of an override (see the module docstring for the rules).

    Text that starts like a list, dict or quoted string but does not parse as
    one is kept as the plain string, with a warning that says why.
    """
    stripped = text.strip()
    if not stripped:
        return ""
    if stripped[0] not in "[{'\"":
        return _scalar(stripped)
    try:
        return _Parser(stripped).parse_top()
    except _ParseError as e:
        logger.warning(
            "Override value %r does not parse (%s); it is kept as a plain string.", stripped, e
        )
        return stripped


def _split(text: str) -> Tuple[str, str]:
    if "=" not in text:
        raise ConfigError(
            f"Malformed override {text!r}: expected KEY=VALUE (e.g. train.max_iter=100)"
        )
    # The FIRST '=' separates: values may contain '=' (path=a=b), keys never do.
    key, value = text.split("=", 1)
    return key.strip(), value


def parse_override(text: str) -> Override:
    """Parses one ``key=value`` or ``+key=value`` override.

    Raises:
        ConfigError: naming the override when it has no ``=``, an empty key or an
            empty part in the dotted key, or uses hydra syntax that is not
            supported here (``~key`` deletion, ``++key`` forced add).
    """
    if not isinstance(text, str):
        raise ConfigError(
            f"Malformed override {text!r}: overrides are strings like 'train.max_iter=100'"
        )
    key, raw_value = _split(text)
    add = key.startswith("+")
    if key.startswith(("++", "~")):
        raise ConfigError(
            f"Unsupported override {text!r}: '~key' (delete) and '++key' (force add) are not "
            f"supported; write KEY=VALUE to change a key or +KEY=VALUE to add one"
        )
    if add:
        key = key[1:].strip()
    if not key:
        raise ConfigError(f"Malformed override {text!r}: the key before '=' is empty")
    parts = key.split(".")
    if any(not part or part != part.strip() or any(c.isspace() for c in part) for part in parts):
        raise ConfigError(
            f"Malformed override {text!r}: key {key!r} must be dot-separated names "
            f"without empty parts or spaces (e.g. model.backbone.depth)"
        )
    return Override(key=key, value=parse_value(raw_value), add=add, text=text)
