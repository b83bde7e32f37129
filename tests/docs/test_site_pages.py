"""The site's pages as a reader meets them: one page leads to the
"coming from" pages, links show the page's title rather than a file's path,
the plain Trainer's page shows its run with every override point where it
is called, and the README (the front page) stays a guide, at most 220 lines."""

from __future__ import annotations

import re
from pathlib import Path

from treadle.compat.names import CALLBACK_EVENTS, OVERRIDE_POINTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SITE_PAGES = [*sorted(DOCS.glob("*.md")), *sorted((DOCS / "coming_from").glob("*.md"))]


def test_one_page_leads_to_every_coming_from_page():
    assert not (DOCS / "coming_from" / "index.md").exists()
    page = (DOCS / "migrating.md").read_text()
    toctree = page.split("```{toctree}\n", 1)[1].split("```", 1)[0]
    listed = sorted(line for line in toctree.splitlines() if line and not line.startswith(":"))
    assert listed == sorted(f"coming_from/{p.stem}" for p in (DOCS / "coming_from").glob("*.md"))
    assert re.search(r"^migrating$", (DOCS / "index.md").read_text(), re.M)


def test_no_link_of_the_site_shows_a_file_path_for_a_page():
    shown = []
    for page in SITE_PAGES:
        if page.name == "changelog.md":  # the changelog's entries are left as written
            continue
        for text, target in re.findall(r"\[([^\]]+)\]\(([^)\s]+)\)", page.read_text()):
            if target.split("#")[0].endswith(".md") and re.fullmatch(r"`?[\w./-]+\.md`?", text.replace("\n", " ")):
                shown.append(f"{page.relative_to(ROOT)}: [{text}]({target})")
    assert shown == []


def test_the_trainers_run_names_every_point_it_calls():
    page = (DOCS / "trainer.md").read_text()
    section = page.split("## The run, and where a subclass hooks in", 1)[1]
    block = section.split("<!-- not run by tests:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    called = set(re.findall(r"\b(\w+)\(", block))
    points = {p.name for p in OVERRIDE_POINTS if p.on == "Trainer" and p.called}
    assert points - called == set()
    # A callback's on_<event> is called where the Trainer's method <event> is.
    assert {e for e in CALLBACK_EVENTS if e not in called and e[len("on_"):] not in called} == set()
    assert {"calculate_train_batch_loss", "training_step", "_prepare_batch", "train_epoch_start"} <= called


def test_the_readme_is_a_guide_of_at_most_220_lines():
    # The site's front page and the repository's: what treadle is, the quick
    # start and a tour, each with the docs page that holds the rest.
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 220, f"README.md has {lines} lines: move detail to its page of docs/ and link it"
