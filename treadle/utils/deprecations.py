"""The one table of what treadle still answers under an old name, and the
version each goes in.

A name that moved (a module, a package's attribute, a keyword argument)
keeps working until the version its row names, and warns with a
``DeprecationWarning`` naming what to write instead; a module that left the
package is refused in one line saying where it went. The modules that keep
an old name read their rows from here (:func:`moved_modules` for
:func:`~treadle.utils.moved_modules.keep_old_paths`, :func:`warn_deprecated`
for a name or an argument), so that a row is the whole of a deprecation:
``tests/utils/test_deprecations.py`` imports (or calls) every row and checks
its warning, and ``docs/migrating.md`` shows the table.

To retire a row in the version it names: delete it and the code that
answers the old name; the test then says what still uses it.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Dict, Tuple

__all__ = ["Deprecated", "DEPRECATED", "GONE", "deprecated", "moved_modules", "warn_deprecated"]


@dataclasses.dataclass(frozen=True)
class Deprecated:
    """One old name and its replacement.

    Attributes:
        old: what a user writes today: a module (``treadle.engine.trainer``),
            a package's attribute (``treadle.engine.Trainer``) or a keyword
            argument (``LRScheduler(stepper=...)``).
        new: what to write instead.
        kind: ``"module"``, ``"attribute"`` (imported), ``"read"`` (an
            attribute of an object, read) or ``"argument"``. ``old`` and
            ``new`` of a row for many names hold ``{fields}`` filled when
            it warns (``trainer.settings.{name}``).
        removed_in: the treadle version in which ``old`` stops working.
        since: the first version that warns.
    """

    old: str
    new: str
    kind: str
    removed_in: str
    since: str

    def message(self, **fill: str) -> str:
        """The warning's one line: the old name, the version it goes in, what
        to write instead (``fill``: the row's ``{fields}``)."""
        old, new = self.old.format(**fill), self.new.format(**fill)
        instead = {"module": f"import {new} instead", "attribute": f"import {new} instead",
                   "read": f"read {new}"}.get(self.kind, new)
        return f"{old} is deprecated and is removed in treadle {self.removed_in}: {instead}"


def _moved(old: str, new: str) -> Deprecated:
    # The plain Trainer's modules and the other trainers' names left the engine in 0.9.
    return Deprecated(old, new, "module", removed_in="0.10", since="0.9")


#: Every old name treadle answers, with the version it goes in.
DEPRECATED: Tuple[Deprecated, ...] = (
    _moved("treadle.engine.trainer", "treadle.trainer.trainer"),
    _moved("treadle.engine.trainer_settings", "treadle.trainer.settings"),
    _moved("treadle.engine.trainer_data", "treadle.trainer.data"),
    _moved("treadle.engine.trainer_eval", "treadle.trainer.evaluation"),
    _moved("treadle.engine.seed_names", "treadle.compat.names"),
    _moved("treadle.engine.seed_overrides", "treadle.compat.overrides"),
    Deprecated("treadle.engine.Trainer", "treadle.trainer.Trainer", "attribute", removed_in="0.10", since="0.9"),
    Deprecated("trainer.settings.{name}", "trainer.settings.{group}.{name}", "read", removed_in="0.10",
               since="0.9"),
    Deprecated("LRScheduler(stepper=...)", "subclass LRScheduler and override its step_schedule() instead",
               "argument", removed_in="0.10", since="0.9"),
)

#: Modules that left the package, and where they went: refused in one line.
GONE: Dict[str, str] = {
    "treadle.engine.seed_pages": "the pages generator is the documentation tool tools/seed_pages.py",
}

_BY_OLD: Dict[str, Deprecated] = {row.old: row for row in DEPRECATED}


def deprecated(old: str) -> Deprecated:
    """The row of ``old``."""
    return _BY_OLD[old]


def moved_modules(package: str) -> Dict[str, Deprecated]:
    """The rows of the modules that lived in ``package`` (old name -> row)."""
    return {row.old: row for row in DEPRECATED
            if row.kind == "module" and row.old.rpartition(".")[0] == package}


def warn_deprecated(old: str, stacklevel: int = 3, **fill: str) -> None:
    """Warns (``DeprecationWarning``) that ``old`` (a row's, with ``fill``
    in its ``{fields}``) goes in its row's version, naming what to write instead;
    ``stacklevel`` 3 points at the caller of the function that calls this
    one (the user's line)."""
    warnings.warn(_BY_OLD[old].message(**fill), DeprecationWarning, stacklevel=stacklevel)
