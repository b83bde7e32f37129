"""The API reference (docs/api/) holds every public name, each with a docstring.

The pages are generated from the code by docs/_ext/treadle_api.py: each
package page has one ``.. treadle-api:: PACKAGE`` directive that documents the
names of the package's ``__all__``. The fast tests check what a page would
show (every name, and a docstring for each) without building; the slow one
builds the site as ``.ci/run`` does (warnings are errors, every reference
resolves) and finds each name in the built pages.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

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
    "treadle.model_zoo": "the packaged configs, documented in docs/config.md",
    "treadle.trainer": "the plain Trainer, documented where users import it (treadle.engine.Trainer)",
}


def pages_of(module_name: str) -> list:
    """The reference pages that hold ``module_name``'s directive."""
    directive = re.compile(rf"^\.\. treadle-api:: {re.escape(module_name)}\s*$", re.M)
    return [p.name for p in sorted((DOCS / "api").glob("*.rst")) if directive.search(p.read_text())]


def test_every_package_with_an_all_has_a_page_or_a_reason():
    packages = [
        info.name for info in pkgutil.iter_modules(treadle.__path__, "treadle.")
        if info.ispkg and hasattr(importlib.import_module(info.name), "__all__")
    ]
    missing = [p for p in packages if p not in treadle_api.PACKAGES and p not in NOT_IN_REFERENCE]
    assert not missing, f"packages with an __all__ and no page in the reference: {missing}"
    for module_name in treadle_api.PACKAGES + treadle_api.UTILS_MODULES:
        assert len(pages_of(module_name)) == 1, f"{module_name}: one page of docs/api/ documents it"


def test_every_reference_page_is_in_the_sites_table_of_contents():
    index = (DOCS / "index.md").read_text()
    for page in sorted((DOCS / "api").glob("*.rst")):
        assert re.search(rf"^api/{page.stem}$", index, re.M), f"docs/index.md does not list api/{page.stem}"


@pytest.mark.parametrize("module_name", treadle_api.PACKAGES + treadle_api.UTILS_MODULES)
def test_every_public_name_is_on_its_page_with_a_docstring(module_name):
    lines = treadle_api.reference_lines(module_name)
    shown = {m.group(1) for m in (re.match(r"\.\. (?:autoclass|autofunction|py:data):: (\w+)$", line) for line in lines) if m}
    names = treadle_api.public_names(module_name)
    assert sorted(set(names) - shown) == [], f"{module_name}: names of __all__ missing from its page"
    undocumented = [name for name in names if treadle_api.docstring_of(module_name, name) is None]
    assert undocumented == [], (
        f"{module_name}: public names without a docstring (a constant's is a '#:' comment where it is assigned): "
        f"{undocumented}"
    )


def test_a_name_without_a_docstring_is_found(monkeypatch):
    # The check above sees what the page would show: a function's missing
    # docstring, and a constant without its '#:' comment.
    import treadle.models

    def undocumented() -> None:
        pass

    monkeypatch.setattr(treadle.models, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(treadle.models, "__all__", [*treadle.models.__all__, "undocumented"])
    assert treadle_api.docstring_of("treadle.models", "undocumented") is None
    assert "undocumented" in "\n".join(treadle_api.reference_lines("treadle.models"))
    assert treadle_api.docstring_of("treadle.engine", "GROUP_LOST_EXIT_CODE").startswith("Exit status")


@pytest.mark.slow
def test_the_site_builds_with_every_reference_resolved_and_every_name_shown(tmp_path):
    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "-n", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    for module_name in treadle_api.PACKAGES + treadle_api.UTILS_MODULES:
        (page,) = pages_of(module_name)
        html = (out / "api" / page).with_suffix(".html").read_text()
        for name in treadle_api.public_names(module_name):
            assert re.search(rf'sig-name descname"><span class="pre">{re.escape(name)}</span>', html), (
                f"{name} of {module_name} is not shown on api/{page}"
            )
