"""The shell commands of the documentation's pages that a user runs as
written (a tracker run, the plain ``Trainer`` under torchrun, the research
gallery), run in a clean copy of the repository as the README's commands are
(``tests/tools/test_readme_commands.py``).

Each command is named with its page: the test first checks that the page
still shows it, word for word, so that a page and this test cannot drift
apart silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.test_readme_commands import clean_copy, readme_commands

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: (page, command as the page writes it, continuation lines joined).
PAGE_COMMANDS = [
    ("writers.md", "python tools/train_net.py train.writers.wandb.project=digits train.writers.wandb.mode=offline"),
    ("distributed.md", "torchrun --standalone --nproc-per-node 2 -m treadle.examples.digits_trainer --batch-size 32 "
                       "--output-dir output/trainer_2procs"),
    ("research.md", "python -m treadle.examples.research.gan --output-dir out/gan2 --max-iter 40 --num-gpus 2"),
    ("research.md", "python -m treadle.examples.research.moco --output-dir out/moco2 --max-iter 40 --num-gpus 2"),
]


def test_every_listed_command_is_on_its_page():
    for page, command in PAGE_COMMANDS:
        assert command in [c.text for c in readme_commands((DOCS / page).read_text())], (page, command)


@pytest.mark.slow
@pytest.mark.parametrize("page,command", PAGE_COMMANDS, ids=[c.split(" --")[0] for _, c in PAGE_COMMANDS])
def test_a_pages_command_runs_as_written_in_a_clean_copy(tmp_path, page, command):
    repo = clean_copy(tmp_path / "clone")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONUNBUFFERED="1", WANDB_SILENT="true",
               PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    result = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{page}: {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    written = [*(repo / "output").rglob("*"), *(repo / "out").rglob("*")]
    assert any(p.name.startswith("model_final") or p.name == "metrics.json" for p in written), command
