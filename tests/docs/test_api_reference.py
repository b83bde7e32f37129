"""The API reference (docs/api/): every public name has one entry, and every entry has text.

The pages are generated from the code by docs/_ext/treadle_api.py: each
package page has one ``.. treadle-api:: PACKAGE`` directive that documents the
names of the package's ``__all__``, and the modules page the names of each
module's ``__all__`` that no package page holds. The fast tests check what the
pages would show (an entry per name, the text of each, one full entry per
object) without building; the slow one builds the site as ``.ci/run`` does
(warnings are errors, every reference resolves) and reads the built pages.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

pytest.importorskip("sphinx", reason="the [docs] extra builds the reference")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import treadle_api  # noqa: E402

import treadle  # noqa: E402

#: Packages with an ``__all__`` that have no page, each with its reason.
NOT_IN_REFERENCE = {
    "treadle.examples": "example trainers, read as source (docs/examples_data.md)",
}
#: Entries whose text is to be written in code this branch may not edit, with the reason.
#: An entry of a page's reStructuredText: its directive, its name (a function's
#: one-line entry with its parameters), and whether it is a full one.
ENTRY = re.compile(r"^\.\. (auto|py:)(class|function|data):: (?:[\w.]+\.)?(\w+)(?:\(.*\))?$")


def docstring_of(module_name: str, name: str) -> Optional[str]:
    """The text ``module_name.name``'s entry shows (a constant's ``#:`` comment), or None."""
    value = getattr(importlib.import_module(module_name), name)
    text = "\n".join(treadle_api.data_doc(name, value)[1]) if treadle_api.kind_of(value) == "data" else inspect.getdoc(value)
    return (text or "").strip() or None


def pages_of(module_name: str) -> list:
    """The reference pages that hold ``module_name``'s directive."""
    directive = re.compile(rf"^\.\. treadle-api:: {re.escape(module_name)}\s*$", re.M)
    return [p.name for p in sorted((DOCS / "api").glob("*.rst")) if directive.search(p.read_text())]


def page_entries() -> List[Tuple[str, str, str, bool]]:
    """``(module, name, kind, full)`` of every entry of the reference, the modules page's too."""
    found = []
    for module_name, lines in [(m, treadle_api.reference_lines(m)) for m in treadle_api.PAGES] + [
        (m, sum((treadle_api.entry_lines(m, n) for n in treadle_api.module_names(m)), []))
        for m in treadle_api.submodules()
    ]:
        for i, line in enumerate(lines):
            match = ENTRY.match(line)
            if match:
                full = match.group(1) == "auto" or "   :no-index:" not in lines[i + 1 : i + 3]
                found.append((module_name, match.group(3), match.group(2), full))
    return found


def test_every_package_with_an_all_has_a_page_or_a_reason():
    packages = [
        info.name for info in pkgutil.iter_modules(treadle.__path__, "treadle.")
        if info.ispkg and hasattr(importlib.import_module(info.name), "__all__")
    ]
    missing = [p for p in packages if p not in treadle_api.PACKAGES and p not in NOT_IN_REFERENCE]
    assert not missing, f"packages with an __all__ and no page in the reference: {missing}"
    for module_name in treadle_api.PAGES:
        assert len(pages_of(module_name)) == 1, f"{module_name}: one page of docs/api/ documents it"


def test_every_reference_page_is_in_the_sites_table_of_contents():
    index = (DOCS / "index.md").read_text()
    for page in sorted((DOCS / "api").glob("*.rst")):
        assert re.search(rf"^api/{page.stem}$", index, re.M), f"docs/index.md does not list api/{page.stem}"


def test_every_reference_page_starts_with_the_guides_that_explain_it():
    for page in sorted((DOCS / "api").glob("*.rst")):
        first = page.read_text().split("\n\n")[1]
        assert first.startswith("Related tutorial"), f"api/{page.name} does not start with its related tutorials"
        guides = re.findall(r":doc:`\.\./([\w/]+)`", first)
        assert guides and all((DOCS / f"{g}.md").exists() for g in guides), f"api/{page.name}: {first!r}"


def test_every_public_name_has_an_entry():
    entries = {(module_name, name) for module_name, name, _, _ in page_entries()}
    for module_name in treadle_api.PAGES:
        missing = [n for n in treadle_api.public_names(module_name) if (module_name, n) not in entries]
        assert missing == [], f"{module_name}: names of __all__ without an entry on its page: {missing}"
    full = {id(getattr(importlib.import_module(m), n)) for m, n, _, is_full in page_entries() if is_full}
    for module_name in treadle_api.submodules():
        module = importlib.import_module(module_name)
        kinds = {n: treadle_api.kind_of(getattr(module, n)) for n in getattr(module, "__all__", [])}
        theirs = {n for n, kind in kinds.items() if kind == "module" or kind != "data"
                  and not getattr(module, n).__module__.startswith("treadle")}
        missing = [n for n in getattr(module, "__all__", []) if n not in theirs and id(getattr(module, n)) not in full]
        assert missing == [], f"{module_name}: names of __all__ with no full entry in the reference: {missing}"


def test_every_entry_has_text():
    no_text = [
        f"{module_name}.{name}" for module_name, name, _, full in page_entries()
        if full and docstring_of(module_name, name) is None
    ]
    assert no_text == [], f"entries without text (a constant's is a '#:' comment where it is assigned): {no_text}"


def test_an_object_has_one_full_entry_and_a_re_export_links_to_it():
    full: Dict[object, str] = {}
    for module_name, name, kind, is_full in page_entries():
        value = getattr(importlib.import_module(module_name), name)
        key = (name, id(value)) if kind == "data" else id(value)
        if is_full:
            assert key not in full, f"{module_name}.{name} is documented in full twice (also as {full[key]})"
            full[key] = f"{module_name}.{name}"
    lines = treadle_api.reference_lines("treadle.engine")
    at = lines.index(".. py:class:: HookBase")
    assert lines[at : at + 5] == [
        ".. py:class:: HookBase", "   :module: treadle.engine", "   :no-index:", "",
        "   Another name for :class:`treadle.hooks.HookBase`, documented there.",
    ]
    assert ".. autoclass:: treadle.hooks.HookBase" in treadle_api.reference_lines("treadle.hooks")


def test_a_one_line_entry_of_a_function_shows_how_it_is_called():
    # Without its parameters, Sphinx writes a function's entry with empty
    # parentheses: get_config() of a function called get_config(config_path, trained=False).
    lines = treadle_api.entry_lines("treadle.model_zoo", "get_config")
    assert lines[:3] == [".. py:function:: get_config(config_path, trained=False)",
                         "   :module: treadle.model_zoo", "   :no-index:"]
    one_line = [(m, n, lines[0]) for m, n, lines in
                [(m, n, treadle_api.entry_lines(m, n)) for m, n, kind, full in page_entries()
                 if kind == "function" and not full]]
    assert len(one_line) >= 5, one_line
    for module_name, name, head in one_line:
        value = getattr(importlib.import_module(module_name), name)
        names = list(inspect.signature(value).parameters)
        shown = head.partition(f":: {name}")[2]
        assert shown.startswith("(") and shown.endswith(")"), f"{module_name}.{name}: {head!r}"
        assert re.findall(r"(?:^\(|, )\**(\w+)", shown) == names, f"{module_name}.{name}: {head!r} is not {names}"


def test_the_plain_trainer_has_its_own_page_and_the_engine_links_to_it():
    assert pages_of("treadle.trainer") == ["trainer.rst"]
    assert ".. autoclass:: treadle.trainer.Trainer" in treadle_api.reference_lines("treadle.trainer")
    # treadle.engine.Trainer is deprecated (not in the engine's __all__): the engine's page links to the Trainer's.
    assert ".. py:class:: Trainer" not in treadle_api.reference_lines("treadle.engine")
    assert "The plain ``Trainer`` has its own page: :doc:`trainer`." in (DOCS / "api" / "engine.rst").read_text()
    index = (DOCS / "index.md").read_text()
    assert index.index("\napi/trainer\n") < index.index("\napi/engine\n"), "the Trainer's page comes first"


def test_a_name_without_text_is_found(monkeypatch):
    # The checks above see what the pages would show: a function's missing
    # docstring, and a constant without its '#:' comment, on a package page
    # and on the modules page.
    import treadle.models
    import treadle.utils.frame_stack

    def undocumented() -> None:
        pass

    undocumented.__module__ = "treadle.models"
    monkeypatch.setattr(treadle.models, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(treadle.models, "__all__", [*treadle.models.__all__, "undocumented"])
    monkeypatch.setattr(treadle.utils.frame_stack, "NO_COMMENT", (1, 2), raising=False)
    monkeypatch.setattr(treadle.utils.frame_stack, "__all__", [*treadle.utils.frame_stack.__all__, "NO_COMMENT"])
    with pytest.raises(AssertionError, match=r"\['treadle.models.undocumented', 'treadle.utils.frame_stack.NO_COMMENT'\]"):
        test_every_entry_has_text()
    assert docstring_of("treadle.engine", "GROUP_LOST_EXIT_CODE").startswith("Exit status")


def test_a_name_without_an_entry_is_found(monkeypatch):
    # A module whose names the modules page would leave out.
    monkeypatch.setattr(treadle_api, "module_names", lambda module_name: [])
    with pytest.raises(AssertionError, match=r"names of __all__ with no full entry in the reference: \['"):
        test_every_public_name_has_an_entry()


class _Entries(HTMLParser):
    """The id and text of each entry (``<dl class="py ...">``) of a built page."""

    def __init__(self) -> None:
        super().__init__()
        self.open: List[dict] = []
        self.entries: List[Tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "dl" and "py" in (dict(attrs).get("class") or "").split():
            self.open.append({"id": None, "text": "", "in_dt": False})
        elif self.open and tag == "dt" and self.open[-1]["id"] is None:
            self.open[-1].update(id=dict(attrs).get("id") or "?", in_dt=True)

    def handle_endtag(self, tag: str) -> None:
        if self.open and tag == "dt":
            self.open[-1]["in_dt"] = False
        elif self.open and tag == "dl":
            entry = self.open.pop()
            self.entries.append((entry["id"], entry["text"].strip()))

    def handle_data(self, data: str) -> None:
        if self.open and self.open[-1]["id"] is not None and not self.open[-1]["in_dt"]:
            self.open[-1]["text"] += data


@pytest.mark.slow
def test_the_site_builds_with_every_reference_resolved_and_every_name_shown(tmp_path):
    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "-n", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    for module_name in treadle_api.PAGES:
        (page,) = pages_of(module_name)
        html = (out / "api" / page).with_suffix(".html").read_text()
        for name in treadle_api.public_names(module_name):
            assert re.search(rf'sig-name descname"><span class="pre">{re.escape(name)}</span>', html), (
                f"{name} of {module_name} is not shown on api/{page}"
            )
    # A re-export's one-line entry shows the function's parameters, not "()".
    text = re.sub(r"<[^>]+>", "", (out / "api" / "model_zoo.html").read_text())
    assert "model_zoo.get_config(config_path, trained=False)" in text and "model_zoo.get_config()" not in text
    for page in sorted((out / "api").glob("*.html")):
        parser = _Entries()
        parser.feed(page.read_text())
        no_text = [i for i, text in parser.entries if not text]
        assert no_text == [], f"api/{page.name}: entries without text"
