"""The Python and PyTorch versions treadle is tried with.

``python -m nox -l`` lists the sessions; ``python -m nox -s "tests-3.13(torch='2.14.1')"``
runs one. Each makes a fresh virtualenv, installs treadle with its ``[dev]``
extra and the PyTorch release of the session, and runs the README's test
command (the tests not marked slow):

- the oldest Python that ``setup.py`` admits with the oldest PyTorch it admits;
- the newest Python with the newest PyTorch;
- Python 3.11 with the newest PyTorch, and with ``constraints.txt``'s (what
  ``.ci/run`` runs, every other package at its pinned version too);
- Python 3.12 with the newest PyTorch.

The ``docs`` session builds the documentation site as ``.ci/run`` does
(warnings are errors, every reference must resolve).

Only the last session keeps ``constraints.txt``'s pins for the other
packages: some (numpy 2.4) admit no Python 3.10. The results of the last
run are in docs/development.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
OLDEST_TORCH = "2.13.0"
NEWEST_TORCH = "2.14.1"
PINNED_TORCH = re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]


def _tests(session: nox.Session, torch: str, *, pinned: bool) -> None:
    if pinned:
        session.install("-c", "constraints.txt", "-e", ".[dev]")
    else:
        session.install(f"torch=={torch}", "-e", ".[dev]")
    session.run("python", "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)")
    session.run("python", "-m", "pytest", "-q", "-m", "not slow", *session.posargs)


@nox.session(python="3.10")
@nox.parametrize("torch", [OLDEST_TORCH])
def oldest(session: nox.Session, torch: str) -> None:
    """Python 3.10 with the oldest PyTorch that setup.py admits."""
    _tests(session, torch, pinned=False)


@nox.session(python="3.13")
@nox.parametrize("torch", [NEWEST_TORCH])
def newest(session: nox.Session, torch: str) -> None:
    """Python 3.13 with the newest PyTorch."""
    _tests(session, torch, pinned=False)


@nox.session(python="3.12")
@nox.parametrize("torch", [NEWEST_TORCH])
def py312(session: nox.Session, torch: str) -> None:
    """Python 3.12 with the newest PyTorch."""
    _tests(session, torch, pinned=False)


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """The documentation site, built as .ci/run builds it, into docs/_build/html."""
    session.install("-c", "constraints.txt", "-e", ".[docs]")
    session.run("python", "-m", "sphinx", "-E", "-W", "-n", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session(python="3.11")
@nox.parametrize("torch", [NEWEST_TORCH, PINNED_TORCH])
def tests(session: nox.Session, torch: str) -> None:
    """Python 3.11 with the newest PyTorch, and with constraints.txt's (as .ci/run)."""
    _tests(session, torch, pinned=torch == PINNED_TORCH)
