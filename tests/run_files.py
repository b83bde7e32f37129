"""What a run's folder holds, to compare before and after a command."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict


def snapshot(folder: Path) -> Dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
