"""Sphinx configuration of treadle's documentation site.

Build it from the repository's root (``pip install -c constraints.txt -e ".[docs]"``)::

    python -m sphinx -W -n --keep-going -b html docs docs/_build/html

Nothing is fetched while it builds (no intersphinx): references to torch,
OmegaConf and the other libraries treadle uses are shown as code, unlinked,
by ``nitpick_ignore_regex`` below; every reference to treadle itself must
resolve (``-n``), or the build fails (``-W``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's treadle, also without an install
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

import treadle  # noqa: E402
from treadle.trainer.settings import GROUPS  # noqa: E402
from treadle.trainer.settings_docs import section_title  # noqa: E402

project = "treadle"
author = "treadle's authors"
copyright = "treadle's authors"
release = version = treadle.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "treadle_api",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

# MyST: headings get anchors (pages link to each other's sections), and
# ```{directive} blocks hold Sphinx directives on the Markdown pages.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]


# The docstrings are Google style (Args:, Returns:, Raises:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# The plain Trainer's docstring lists its settings in a section per group
# (treadle.trainer.settings.document_settings), shown as its Args are.
napoleon_custom_sections = [(section_title(group), "params_style") for group, _ in GROUPS]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = True
autodoc_default_options = {"exclude-members": "__init__, __new__"}

html_theme = "furo"
html_title = f"treadle {release}"
# The pages' text holds code without backticks in tables ('cosine', torchrun
# --nproc-per-node): shown as written, not with curly quotes and an en dash.
smartquotes = False
# Wide tables at a laptop's width (docs/_static/treadle.css). Code blocks need
# no script: their lines are at most 88 characters (tests/docs/test_code_lines.py),
# which fit the column; a wider one scrolls sideways, never wrapped.
html_static_path = ["_static"]
html_css_files = ["treadle.css"]

# Nitpicky references to other packages: no intersphinx (nothing is fetched at
# build time), so their names stay unlinked. Only external packages are listed:
# a reference to treadle that does not resolve fails the build.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|omegaconf|fvcore|iopath|numpy|np|tabulate|termcolor|tqdm|yaml|safetensors"
               r"|transformers|torchmetrics|mlflow|wandb|tensorboard|matplotlib|argparse|logging"
               r"|collections|concurrent|contextlib|dataclasses|enum|io|os|pathlib|queue|threading"
               r"|multiprocessing|signal|subprocess|types|typing|typing_extensions|abc|weakref"
               r"|functools|datetime|json|csv|random|socket|re|inspect|shutil|tempfile|time"
               r"|builtins|_io|_thread)(\..*)?"),
]

# The pages link to the repository's CHANGELOG.md and README.md, as a reader of
# the repository follows them; on the site they are the pages changelog and index.
SITE_PAGES = {"CHANGELOG.md": "changelog.md", "README.md": "index.md"}


def _site_links(text: str, prefix: str) -> str:
    for repository_file, page in SITE_PAGES.items():
        text = text.replace(f"]({prefix}{repository_file})", f"]({page})")
    return text


def _on_source_read(app, docname, source):  # type: ignore[no-untyped-def]
    source[0] = _site_links(source[0], "../")


# The README (GitHub reads it) writes a link to a page with the page's path
# as its text, [docs/engine.md](docs/engine.md); on the site the link shows
# the page's title instead (an empty text: MyST writes the target's title).
_PATH_TEXT_LINK = re.compile(r"\[`?(?:docs/)?[\w/.-]+\.md`?\]\(((?:docs/)?[\w/.-]+\.md(?:#[\w-]+)?)\)")


def _on_include_read(app, relative_path, parent_docname, content):  # type: ignore[no-untyped-def]
    if relative_path.name == "README.md":
        content[0] = _PATH_TEXT_LINK.sub(r"[](\1)", _site_links(content[0], ""))


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("source-read", _on_source_read)
    app.connect("include-read", _on_include_read)
