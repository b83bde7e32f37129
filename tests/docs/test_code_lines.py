"""Every line of code the pages show fits the site's column: at most 88 characters.

The site shows a code block as written, each line on one line (a block wider
than the page's column scrolls sideways; nothing re-wraps it, which would
make a wrapped comment or argument read as the next statement). So each line
of a fenced block (```python, ```bash, ```text, a bare ``` for a message, ...)
of README.md and the pages of docs/ is at most 88 characters, black's
length: a longer one is wrapped where it is written, as Python or the shell
continues it. Tables are not code blocks: the generated ones are long lines.
The ``Example::`` blocks of treadle's docstrings, which the API reference
shows, keep the same limit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
LIMIT = 88
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})")


def long_code_lines(text: str, limit: int = LIMIT) -> List[Tuple[int, int]]:
    """``(line number, length)`` of each line of a fenced code block of ``text`` longer than ``limit``."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group("fence")
            continue
        if match and match.group("fence")[0] == fence[0] and len(match.group("fence")) >= len(fence) \
                and not line[match.end():].strip():
            fence = None  # the closing fence
        elif len(line) > limit:
            found.append((number, len(line)))
    return found


def test_no_code_line_of_a_page_is_longer_than_88_characters():
    too_long = [f"{page.relative_to(ROOT).as_posix()}:{number} ({length} characters)"
                for page in PAGES for number, length in long_code_lines(page.read_text())]
    assert too_long == [], "code lines over 88 characters (wrap them):\n" + "\n".join(too_long)


def test_no_line_of_a_docstring_example_is_longer_than_88_characters():
    from tests.docs.examples import docstring_examples

    too_long = [f"{where} ({len(line)} characters): {line.strip()[:40]}..."
                for where, blocks in docstring_examples().items() for block in blocks
                for line in block.code.splitlines() if len(line) > LIMIT]
    assert too_long == [], "docstring example lines over 88 characters:\n" + "\n".join(too_long)


def test_a_long_line_is_found_in_any_fenced_block_and_nowhere_else():
    long = "x" * 89
    text = "\n".join([
        "prose " + long,                      # 1: prose, not code
        "```python", long, "```",             # 3
        "| table | " + long + " |",           # 5: a table
        "```", "y" * 88, long, "```",         # 8: a bare fence (a message)
        "  ```bash", "  " + long, "  ```",    # 11: an indented fence (in a list)
        "````markdown", "```", long, "```", "````",  # 15: a fence inside a longer one
        "~~~text", long, "~~~",               # 19
    ])
    assert [number for number, _ in long_code_lines(text)] == [3, 8, 11, 15, 19]
