"""Screenshots of every page of the built documentation site, as a reader on
a laptop sees them: headless Chromium at 1366 px wide, each page at its full
height. For looking at the site after a change to its pages or its CSS
(code blocks and tables cut at the right edge, links, headings):

    python -m sphinx -W -n --keep-going -b html docs /tmp/site
    python tools/site_screenshots.py /tmp/site /tmp/shots [--width 1366]

A documentation tool, not a part of the library, and not run by the tests
(it needs Chromium). The PNGs are not committed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path
from typing import List, Tuple

#: Heights are measured by the browser: Chromium's headless screenshot has a
#: fixed window, so a page is shot once tall enough for the longest page and
#: cropped to the height the page's own layout reports (its <title> carries it).
MAX_HEIGHT = 30000
#: The title also counts the code blocks and tables wider than the page's
#: column (they scroll sideways: what is past the edge is not seen at first),
#: measured once the page has loaded.
_MEASURE = ("<script>window.addEventListener('load',function(){setTimeout(function(){"
            "var wide=Array.from(document.querySelectorAll('article pre, article .table-wrapper'))"
            ".filter(function(e){return e.scrollWidth>e.clientWidth+1;}).length;"
            "document.title='height='+document.documentElement.scrollHeight+';wide='+wide;},0);});</script>")


def site_pages(site: Path) -> List[Path]:
    """The site's HTML pages, the search page and Sphinx's generated indexes left out."""
    skip = {"search.html", "genindex.html", "py-modindex.html"}
    return sorted(p for p in site.rglob("*.html")
                  if p.name not in skip and "_modules" not in p.parts and "_sources" not in p.parts)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    root = ["--no-sandbox"] if os.geteuid() == 0 else []
    return subprocess.run(["chromium", "--headless=new", *root, *args],
                          capture_output=True, text=True, timeout=120)


def measure(page: Path, width: int) -> Tuple[int, int]:
    """The page's full height in pixels at ``width``, as Chromium lays it out,
    and how many of its code blocks and tables scroll sideways."""
    html = page.read_text(encoding="utf-8").replace("</head>", _MEASURE + "</head>", 1)
    probe = page.with_name(f".measure-{page.name}")
    probe.write_text(html, encoding="utf-8")
    try:
        dom = _chromium(f"--window-size={width},900", "--virtual-time-budget=3000", "--dump-dom",
                        probe.as_uri()).stdout
    finally:
        probe.unlink()
    match = re.search(r"<title>height=(\d+);wide=(\d+)</title>", dom)
    return (min(int(match.group(1)), MAX_HEIGHT), int(match.group(2))) if match else (900, 0)


def screenshot(page: Path, out: Path, width: int) -> int:
    """One PNG of ``page`` at ``width`` and its full height; the number of its
    code blocks and tables that scroll sideways."""
    height, wide = measure(page, width)
    _chromium(f"--window-size={width},{height}", f"--screenshot={out}", "--virtual-time-budget=3000",
              page.as_uri())
    return wide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site (sphinx's html output folder)")
    parser.add_argument("out", type=Path, help="where the PNGs go (one per page, named after its path)")
    parser.add_argument("--width", type=int, default=1366)
    parser.add_argument("pages", nargs="*", help="only these pages (paths under the site, e.g. trainer.html)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pages = [args.site / p for p in args.pages] or site_pages(args.site)
    for page in pages:
        out = args.out / (str(page.relative_to(args.site).with_suffix("")).replace(os.sep, "__") + ".png")
        wide = screenshot(page, out, args.width)
        print(f"{out}" + (f"  ({wide} code blocks or tables scroll sideways)" if wide else ""))


if __name__ == "__main__":
    main()
