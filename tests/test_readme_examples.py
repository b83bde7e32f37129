"""The README's code runs as written and does what it says."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block_after(heading: str) -> str:
    """The first ```python block of the README section under ``heading``."""
    text = README.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under {heading!r}"
    return match.group(1)


def test_trainer_without_configs_reaches_the_accuracy_it_states(tmp_path, monkeypatch, capsys):
    code = python_block_after("### Without configs")
    # The promise is in the block's last comment: "0.95 or more".
    stated = float(re.search(r"print\(history\.epochs\[-1\]\[\"accuracy\"\]\)\s*# ([0-9.]+) or more", code).group(1))
    assert stated >= 0.9
    monkeypatch.chdir(tmp_path)  # output_dir="out" lands here
    # A model this small gains nothing from a second thread, and on a busy
    # shared CPU the threads' synchronization made the run 4x slower (conftest
    # restores the count).
    torch.set_num_threads(1)
    namespace = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)

    history, trainer = namespace["history"], namespace["trainer"]
    accuracy = history.epochs[-1]["accuracy"]
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(accuracy)  # what the print shows
    assert accuracy >= stated
    assert trainer.max_iter == 220 and len(history.epochs) == 10  # as the text after the block says
    assert (tmp_path / "out" / "model_final.pth").exists() and (tmp_path / "out" / "metrics.json").exists()
