"""The code examples of the documentation: which there are, and how each runs.

An example is a ```python block of README.md or a page of docs/, or a
literal block introduced by ``Example::`` (or ``Examples::``) in a docstring
of treadle. Each runs, by these rules, so that no page can drift from the
code:

- The blocks of one page run in order in one namespace (a later block may use
  what an earlier one made), in an empty folder, after the page's **setup**:
  the code of :data:`tests.docs.examples_setup.SETUP` for that page, which
  makes the objects the page's text has already introduced (``model``,
  ``optimizer``, ``train_set`` ...). The setup is the one thing a reader does
  not see; it holds stand-ins, never the example's own calls.
- A block whose first line is a comment naming a Python file
  (``# configs/mlp.py``) is that file's content: it is written there, before
  the page's code runs, and not run itself.
- A block that is not code (a signature, the layout of a file, an excerpt of
  treadle's source with the rest elided) is skipped only with a stated reason:
  a line ``<!-- not run by tests: REASON -->`` just before it (the rule of the
  README's shell commands, ``tests/tools/test_readme_commands.py``). Such
  blocks stay rare (``test_examples.py`` checks the count).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]

SKIP_MARKER = re.compile(r"<!--\s*not run by tests:\s*(?P<reason>.*?)\s*-->")
FILE_LINE = re.compile(r"^# (?P<path>[\w./-]+\.py)\s*$")
EXAMPLE_INTRO = re.compile(r"^(?P<indent>\s*)Examples?::\s*$")


class Block(NamedTuple):
    where: str  # "docs/config.md:108" or "treadle.trainer.trainer.Trainer"
    code: str
    skipped: Optional[str]  # the marker's reason, when not run

    @property
    def file(self) -> Optional[str]:
        """The path a file block is written to, else None."""
        match = FILE_LINE.match(self.code.splitlines()[0]) if self.code.strip() else None
        return match.group("path") if match else None


def page_blocks(page: Path) -> List[Block]:
    """The ```python blocks of a Markdown page, in order."""
    lines = page.read_text().splitlines()
    blocks: List[Block] = []
    i = 0
    while i < len(lines):
        if not re.match(r"^```python\s*$", lines[i]):
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = SKIP_MARKER.search(lines[before]) if before >= 0 else None
        name = page.relative_to(ROOT).as_posix()
        blocks.append(Block(f"{name}:{start + 1}", "\n".join(body) + "\n", marker.group("reason") if marker else None))
        i += 1
    return blocks


def docstring_blocks(docstring: str, where: str) -> List[Block]:
    """The ``Example::`` literal blocks of a docstring (already dedented)."""
    lines = docstring.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        intro = EXAMPLE_INTRO.match(line)
        if not intro:
            continue
        body: List[str] = []
        for following in lines[i + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= len(intro.group("indent")):
                break
            body.append(following)
        text = "\n".join(body).strip("\n")
        indent = min(len(x) - len(x.lstrip()) for x in text.splitlines() if x.strip())
        blocks.append(Block(where, "\n".join(x[indent:] for x in text.splitlines()) + "\n", None))
    return blocks


def docstring_examples() -> Dict[str, List[Block]]:
    """``{qualified name: blocks}`` for every docstring of treadle with an ``Example::``."""
    import treadle

    found: Dict[str, List[Block]] = {}
    for info in pkgutil.walk_packages(treadle.__path__, "treadle."):
        if ".model_zoo.configs" in info.name:
            continue
        module = importlib.import_module(info.name)
        objects = [(info.name, module)]
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != info.name:
                continue
            objects.append((f"{info.name}.{name}", value))
            if inspect.isclass(value):
                objects += [(f"{info.name}.{name}.{m}", v) for m, v in vars(value).items() if callable(v)]
        for where, value in objects:
            blocks = docstring_blocks(inspect.getdoc(value) or "", where)
            if blocks:
                found[where] = blocks
    return found


def script_for(where: str, blocks: List[Block], setup: str) -> str:
    """The Python program that runs ``blocks`` (of a page or a docstring) after ``setup``."""
    parts = [
        "import os, pathlib",
        f"SETUP = {setup!r}",
        f"exec(compile(SETUP, {'setup of ' + where!r}, 'exec'), globals())",
    ]
    for block in blocks:
        if block.skipped is not None:
            continue
        if block.file:
            parts.append(f"pathlib.Path({block.file!r}).parent.mkdir(parents=True, exist_ok=True)")
            parts.append(f"pathlib.Path({block.file!r}).write_text({block.code!r})")
    for block in blocks:
        if block.skipped is None and not block.file:
            parts.append(f"print('--- running', {block.where!r}, flush=True)")
            parts.append(f"exec(compile({block.code!r}, {block.where!r}, 'exec'), globals())")
    return "\n".join(parts) + "\n"
