"""CHANGELOG.md is in Keep a Changelog's form, and its newest version is the package's.

A user reads the changelog to learn what changed between the version they
have (``treadle.__version__``) and another: so every section is a version
with its date, newest first, its changes under Keep a Changelog's headings,
and nothing in it points at what a user cannot look up (issue numbers).
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import List, Tuple

import treadle

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
VERSION_HEADING = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})$")
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def sections() -> List[Tuple[str, List[str]]]:
    """Each ``## `` heading of the file with the lines under it."""
    found: List[Tuple[str, List[str]]] = []
    for line in CHANGELOG.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            found.append((line, []))
        elif found:
            found[-1][1].append(line)
    return found


def released() -> List[Tuple[Tuple[int, ...], date]]:
    """The versions with their dates, in the file's order."""
    versions = []
    for heading, _ in sections():
        match = VERSION_HEADING.match(heading)
        if match:
            versions.append((tuple(int(n) for n in match["version"].split(".")), date.fromisoformat(match["date"])))
    return versions


def test_header_names_the_format_and_semantic_versioning():
    header = CHANGELOG.read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert header.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in header
    assert "https://semver.org/" in header


def test_every_section_is_unreleased_or_a_dated_version_newest_first():
    headings = [heading for heading, _ in sections()]
    bad = [h for h in headings if h != "## [Unreleased]" and not VERSION_HEADING.match(h)]
    assert bad == [], f"not '## [Unreleased]' nor '## [X.Y.Z] - YYYY-MM-DD': {bad}"
    assert "## [Unreleased]" not in headings[1:], "Unreleased comes first"
    versions = released()
    assert len(versions) >= 2
    assert [v for v, _ in versions] == sorted((v for v, _ in versions), reverse=True)
    assert len({v for v, _ in versions}) == len(versions)
    assert [d for _, d in versions] == sorted((d for _, d in versions), reverse=True)


def test_changes_are_under_keep_a_changelog_headings():
    for heading, lines in sections():
        kinds = [line[4:] for line in lines if line.startswith("### ")]
        assert kinds, f"{heading}: no ### Added/Changed/... subsection"
        assert set(kinds) <= KINDS, f"{heading}: {sorted(set(kinds) - KINDS)} is not one of {sorted(KINDS)}"
        assert len(kinds) == len(set(kinds)), f"{heading}: a subsection twice"
        first_text = next(line for line in lines if line.strip())
        assert first_text.startswith("### "), f"{heading}: text before its first subsection: {first_text!r}"


def test_no_issue_numbers():
    text = CHANGELOG.read_text(encoding="utf-8")
    assert re.findall(r"issues? \d+", text, flags=re.IGNORECASE) == []


def test_newest_version_is_the_package_version():
    newest = ".".join(str(n) for n in released()[0][0])
    assert newest == treadle.__version__
