"""docs/architecture.md's table of layers says what the package's imports are."""

import os
import re
from pathlib import Path

import treadle
from tests.engine.test_import_footprint import _treadle_imports

PAGE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _package(module):
    return module.split(".")[1] if module.count(".") else None


def package_imports():
    """``{package: {packages of treadle it imports}}``, from every import of every module."""
    found = {}
    for module, targets in _treadle_imports(os.path.dirname(treadle.__file__)).items():
        package = _package(module)
        found.setdefault(package, set()).update(p for p in map(_package, targets) if p not in (package, None))
    return {package: imports for package, imports in found.items() if package is not None}


def table_of_layers(text):
    """The page's table: ``{package: {packages}}`` (``nothing``: an empty set)."""
    section = text[text.index("## The layers"):text.index("## One iteration")]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        imports = set(re.findall(r"`(\w+)`", cells[1]))
        for package in re.findall(r"`(\w+)`", cells[0]):
            table[package] = imports
    return table


def test_the_table_of_layers_is_the_packages_imports():
    table = table_of_layers(PAGE.read_text())
    actual = package_imports()
    assert table == {package: actual.get(package, set()) for package in table}
    assert set(table) == set(actual)


def test_the_reader_sees_a_wrong_row():
    text = PAGE.read_text().replace("| `solver` | `config` |", "| `solver` | `config`, `engine` |")
    assert table_of_layers(text)["solver"] == {"config", "engine"} != package_imports()["solver"]
