"""Rewrites the generated tables of the documentation from the code: the
seeds' override points and setting names (treadle/engine/seed_names.py,
through treadle/engine/seed_pages.py),
joined with the settings' descriptions (treadle/engine/trainer_settings.py,
treadle/config/train_keys.py), in docs/migrating.md and the pages of
docs/coming_from/: ``python tools/seed_pages.py [PAGE ...]``.

A test fails when a page is out of date
(tests/engine/test_seed_names.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

from treadle.engine.seed_pages import write_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"


def pages() -> List[Path]:
    """The pages that hold generated blocks: docs/migrating.md and docs/coming_from/*.md."""
    return [DOCS / "migrating.md", *sorted((DOCS / "coming_from").glob("*.md"))]


if __name__ == "__main__":
    for page in [Path(arg) for arg in sys.argv[1:]] or pages():
        print(("rewrote " if write_markdown(str(page)) else "unchanged: ") + str(page))
