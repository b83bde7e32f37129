"""No page names a file of the repository that the repository does not hold.

The pages (README.md, CHANGELOG.md, docs/*.md) name the repository's files
in code spans (`treadle/engine/steps.py`, `engine/steps.py` inside the
package, `noxfile.py`) and in links. Each such name must be a file or
folder of the repository; a name that is a file the reader makes (an
example's config, a run's output) is listed in :data:`MADE_BY_THE_READER`
with the page that makes it, and one that is another project's file in
:data:`OTHER_PROJECTS`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]

#: The folders a path of the repository starts with, and the package's
#: (``engine/train_loop.py`` is ``treadle/engine/train_loop.py``).
TOP = {"treadle", "tools", "tests", "docs", "benchmarks", "configs", ".ci"}
PACKAGE = {p.name for p in (ROOT / "treadle").iterdir() if p.is_dir() and not p.name.startswith("_")}
EXTENSIONS = r"(?:py|md|txt|toml|cfg|ini|sh|yaml|yml|json|in|csv\.gz)"
# A path: folders and a file name with one of the repository's extensions, or a folder ending with "/".
PATH = re.compile(rf"^(?:\./)?(?P<path>(?:[\w.-]+/)*[\w.-]+\.{EXTENSIONS}|(?:[\w.-]+/)+)$")

#: Files a page has the reader make, not the repository's: name -> the page that makes it.
MADE_BY_THE_READER = {
    "configs/mlp.py": "docs/config.md, 'Writing a Python config'",
}


#: Files of another project that a page names as theirs: name -> whose.
OTHER_PROJECTS = {
    "tools/my_train_net.py": "LiBai's documented training script (docs/coming_from/libai.md)",
    "tools/lazyconfig_train_net.py": "detectron2's training script, ported in docs/coming_from/detectron2.md",
}


def names_in(text: str) -> Iterator[Tuple[int, str]]:
    """``(line, name)`` of each code span and relative link target of a page."""
    for number, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`\s]+)`", line):
            yield number, span
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", line):
            if not re.match(r"^[a-z]+:", target):
                yield number, target


def is_repository_name(name: str) -> bool:
    first = name.lstrip("./").split("/", 1)[0]
    if "/" in name.lstrip("./"):
        return first in TOP or first in PACKAGE
    # A bare file name: the repository's top-level files are the ones a page names so.
    return bool(re.match(r"^(?:[A-Z][A-Z_]+\.md|setup\.py|noxfile\.py|constraints\.txt|pyproject\.toml|pytest\.ini|MANIFEST\.in)$", name))


def exists(name: str, page: Path) -> bool:
    name = name[2:] if name.startswith("./") else name
    candidates = [ROOT / name, page.parent / name, ROOT / "treadle" / name]
    return any(c.exists() for c in candidates)


def missing_names(pages: List[Path]) -> List[str]:
    missing = []
    for page in pages:
        for number, name in names_in(page.read_text()):
            match = PATH.match(name)
            if not match or not is_repository_name(match.group("path")):
                continue
            if exists(match.group("path"), page) or name in MADE_BY_THE_READER or name in OTHER_PROJECTS:
                continue
            where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
            missing.append(f"{where}:{number}: {name}")
    return missing


def test_no_page_names_a_file_the_repository_does_not_hold():
    assert missing_names(PAGES) == []


def test_a_missing_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("The layers of `DESIGN.md` hold; see `engine/train_loop.py`, `engine/nowhere.py`,\n"
                    "[the config](../configs/common/train.py), `output/digits_mlp/metrics.json`.\n")
    assert [m.split(": ", 1)[1] for m in missing_names([page])] == ["DESIGN.md", "engine/nowhere.py"]


def test_every_file_made_by_the_reader_is_made_by_its_page():
    for name, where in MADE_BY_THE_READER.items():
        page = where.split(",")[0]
        assert f"# {name}" in (ROOT / page).read_text(), f"{page} no longer makes {name}"


def test_the_loop_that_docs_engine_md_shows_is_the_code():
    """docs/engine.md shows TrainerBase._run_iterations' loop as an excerpt:
    each of its lines (without the comments) is a line of the loop, in order."""
    import inspect

    from treadle.engine.train_loop import TrainerBase

    page = (ROOT / "docs" / "engine.md").read_text()
    block = page.split("<!-- not run by tests: an excerpt of TrainerBase._run_iterations", 1)[1]
    block = block.split("```python\n", 1)[1].split("```", 1)[0]
    shown = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    source = [line.split("  #")[0].strip() for line in inspect.getsource(TrainerBase._run_iterations).splitlines()]
    position = 0
    for line in shown:
        assert line in source[position:], f"docs/engine.md's loop shows {line!r}, which the code has not (there)"
        position = source.index(line, position) + 1
