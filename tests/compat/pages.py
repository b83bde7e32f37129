"""``tools/seed_pages.py`` (a documentation tool outside the package), loaded for the tests."""

import importlib.util
import sys
from pathlib import Path

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "seed_pages.py"


def _load():
    name = "treadle_tools_seed_pages"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _TOOL)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


seed_pages = _load()
