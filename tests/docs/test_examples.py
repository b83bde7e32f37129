"""Every code example of the documentation runs (the rules: tests/docs/examples.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.docs.examples import PAGES, ROOT, docstring_examples, page_blocks, script_for
from tests.docs.examples_setup import SETUP

PAGE_NAMES = [p.relative_to(ROOT).as_posix() for p in PAGES if page_blocks(p)]


def test_every_block_is_python_or_skipped_with_a_reason_and_skips_are_rare():
    run, skipped = 0, []
    for page in PAGES:
        for block in page_blocks(page):
            if block.skipped is not None:
                assert block.skipped, f"{block.where}: a skip marker without a reason"
                skipped.append(block.where)
                continue
            ast.parse(block.code, block.where)  # not code: mark it, with the reason
            run += 1
    assert run >= 20, run
    assert len(skipped) * 3 <= run, f"{len(skipped)} blocks not run (of {run + len(skipped)}): {skipped}"


def test_docstring_examples_are_found_and_every_setup_is_used():
    examples = docstring_examples()
    assert "treadle.trainer.trainer.Trainer" in examples
    used = set(PAGE_NAMES) | set(examples)
    assert sorted(set(SETUP) - used) == [], "a setup for a page or docstring without examples"


def run_examples(where, blocks, tmp_path):
    script = script_for(where, blocks, SETUP.get(where, ""))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TREADLE_REPO=str(ROOT), MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{where}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGE_NAMES)
def test_the_examples_of_a_page_run(page, tmp_path):
    run_examples(page, page_blocks(ROOT / page), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted(docstring_examples()))
def test_the_examples_of_a_docstring_run(where, tmp_path):
    run_examples(where, docstring_examples()[where], tmp_path)
