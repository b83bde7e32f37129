"""Rewrites the table of the seeds' override points in docs/migrating.md from
the code (treadle/engine/seed_names.py): ``python tools/override_table.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from treadle.engine.seed_names import write_markdown

if __name__ == "__main__":
    page = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
    print(("rewrote " if write_markdown(str(page)) else "unchanged: ") + str(page))
