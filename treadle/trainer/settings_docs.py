"""The plain ``Trainer``'s settings as its readers see them, made from the
table (:mod:`treadle.trainer.settings`): the settings sections of its
docstring and its signature (:func:`document_settings`, which the API
reference shows), and the tables of ``docs/trainer.md`` (:func:`describe`)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
import typing
from typing import Any, Dict, List, TypeVar

from .settings import GROUPS, SETTINGS, TrainerSettingsDict

__all__ = ["document_settings", "describe", "section_title"]

_T = TypeVar("_T", bound=type)


def section_title(group: str) -> str:
    """The heading of ``group``'s settings (``"Checkpoint settings"``: its
    dataclass's name), in the ``Trainer``'s docstring and in ``docs/trainer.md``."""
    name = dict(GROUPS)[group].__name__
    return f"{name[:-len('Settings')]} settings"


def _types() -> Dict[str, str]:
    """Each setting's type as a caller gives it, as :class:`~treadle.trainer.settings.TrainerSettingsDict`
    declares it (what mypy checks; a path also as an ``os.PathLike``)."""
    fields = {f.name: str(f.type) for _, group in GROUPS for f in dataclasses.fields(group)}
    # A setting the TypedDict lacks shows its field's type: tests/trainer/test_typed_settings.py names the drift.
    return {**fields, **{name: _written(annotation) for name, annotation in TrainerSettingsDict.__annotations__.items()
                         if name in fields}}


def _written(annotation: Any) -> str:
    """An annotation as its source writes it: under ``from __future__ import annotations`` a
    ``TypedDict`` keeps each as a ``ForwardRef`` of that text."""
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def document_settings(cls: _T) -> _T:
    """Gives ``cls`` (the ``Trainer``) its settings from the table: its
    ``__init__``'s signature (``**settings`` shown as each setting, with its
    default and its type as :class:`~treadle.trainer.settings.TrainerSettingsDict`
    declares it, for ``inspect.signature`` and ``help``) and, ending its
    docstring, a section per group that lists each setting (for the API
    reference; ``docs/conf.py`` names the sections)."""
    init: Any = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    types_ = _types()
    parameters = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD] + [
        inspect.Parameter(row.name, inspect.Parameter.KEYWORD_ONLY, default=row.default, annotation=types_[row.name])
        for row in SETTINGS
    ]
    init.__signature__ = signature.replace(parameters=parameters)
    sections = []
    for group, _ in GROUPS:
        lines = [f"{section_title(group)}:"]
        for row in SETTINGS:
            if row.group == group:
                shared = f" As ``train.{row.train_key}``." if row.train_key else ""
                text = f"{row.name}: ``{types_[row.name]}``, default ``{row.default!r}``. {_rst(row.doc)}{shared}"
                lines += textwrap.wrap(text, 116, initial_indent=" " * 4, subsequent_indent=" " * 8,
                                       break_on_hyphens=False, break_long_words=False)
        sections.append("\n".join(lines))
    cls.__doc__ = inspect.cleandoc(cls.__doc__ or "") + "\n\n" + "\n\n".join(sections)
    return cls


def _rst(text: str) -> str:
    """``text`` as reStructuredText reads it literally: a ``*`` or a word's last ``_`` is not markup."""
    return re.sub(r"(?<=\w)_(?!\w)", r"\\_", text.replace("*", r"\*"))


def describe() -> str:
    """The table in Markdown, as ``docs/trainer.md`` shows it, a table per
    group: each setting, its default, what it does (the ``train.*`` key it
    shares its meaning with) and what it needs to act (refused or warned
    without it)."""
    lines: List[str] = []
    for group, cls in GROUPS:
        purpose = inspect.cleandoc(cls.__doc__ or "").replace("\n", " ").replace("``", "`")
        lines += [f"### {section_title(group)}", "", purpose, "",
                  "| setting | default | what it does | needs, or else |", "|---|---|---|---|"]
        for row in SETTINGS:
            if row.group != group:
                continue
            doc = row.doc + (f" As `train.{row.train_key}`." if row.train_key else "")
            needs = "; ".join(f"{need.key}: {'refused' if need.refuse else 'warned'}" for need in row.needs)
            lines.append(f"| `{row.name}` | `{row.default!r}` | {doc} | {needs} |")
        lines.append("")
    return "\n".join(lines[:-1])
