"""The README's code runs as written and does what it says."""

import json
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


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


def test_the_python_config_of_docs_config_md_trains_with_train_net(tmp_path):
    """docs/config.md's "Writing a Python config", saved where its first line
    says, next to a copy of configs/common, runs with tools/train_net.py (its
    train loader was once a plain dict, iterated as the loader)."""
    import shutil
    import subprocess
    import sys

    root = README.parent
    text = (root / "docs" / "config.md").read_text()
    section = text[text.index("## Writing a Python config") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code.startswith("# configs/mlp.py\n")
    shutil.copytree(root / "configs" / "common", tmp_path / "configs" / "common")
    (tmp_path / "configs" / "mlp.py").write_text(code)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(root / "tools" / "train_net.py"), "--config-file", str(tmp_path / "configs" / "mlp.py"),
         f"train.output_dir={out}", "train.device=cpu"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "model_final.pth").exists()
    assert json.loads((out / "metrics.json").read_text().splitlines()[-1])["iteration"] == 9  # train.max_iter = 10


def test_the_optional_cpu_index_is_a_footnote_that_says_it_can_block():
    # A new user copies the quick start's commands: the extra index must not be
    # in them, and where it is offered, the minutes pip waits without it are said.
    text = README.read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = "".join(re.findall(r"```bash\n(.*?)```", quick_start, re.S))
    assert "pip install" in commands and "--extra-index-url" not in commands
    mentions = [p for p in re.split(r"\n\s*\n", text) if "--extra-index-url" in p]
    assert mentions, "the CPU build is still offered"
    for paragraph in mentions:
        assert paragraph.lstrip().startswith("[^"), paragraph  # a footnote
        assert "blocks for minutes" in " ".join(paragraph.split()), paragraph


def test_the_readme_hook_declares_its_period_and_runs(tmp_path, monkeypatch):
    """The README's hook example teaches the hook rule: the period is declared
    (after_step_period), the trainer calls after_step only there, and the
    hook never checks the iteration itself. The block runs on its own."""
    from treadle.engine import EagerStep, TrainerBase

    code = python_block_after("### Writing a hook")
    assert "def after_step_period" in code and "self.trainer.iter" not in code
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    namespace = {"__name__": "readme_example"}  # nothing but what the block makes
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["trainer"].iter == 100  # it ran to the end: the alarm did not stop it

    calls = []

    class Counted(namespace["GradientNormAlarm"]):
        def after_step(self):
            calls.append(self.trainer.iter)
            super().after_step()

    model, optimizer = namespace["model"], namespace["optimizer"]
    step = EagerStep(model, namespace["train_loader"], optimizer,
                     loss_fn=torch.nn.functional.cross_entropy, clip_grad_norm=1.0)
    trainer = TrainerBase(step)
    alarm = Counted(limit=0.0, period=20)
    trainer.register_hooks([alarm])
    trainer.train(start_iter=0, max_iter=100)
    assert calls == [19] and alarm.alarms == 1  # first called at its period, and it stopped training there
    assert trainer.iter < 100


def test_the_readme_loop_runs_on_its_own_as_a_hand_written_loop(tmp_path, monkeypatch):
    """The tour's loop, run as written in a fresh namespace, ends with the
    weights of the same loop written by hand in plain PyTorch, writes the
    metrics.json rows its PeriodicWriter's period says, and trains the digits."""
    from treadle.data.datasets import DigitsDataset
    from treadle.models import MLPClassifier

    code = python_block_after("### The loop")
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    namespace = {"__name__": "readme_example"}  # nothing but what the block makes
    exec(compile(code, str(README), "exec"), namespace)
    max_iter = namespace["trainer"].max_iter
    assert namespace["trainer"].iter == max_iter == 300

    # The same loop by hand: the same seed, data order, clipping and schedule.
    torch.manual_seed(0)
    train_dataset = DigitsDataset("train")
    model = MLPClassifier(train_dataset.input_dim, train_dataset.num_classes)
    loader = torch.utils.data.DataLoader(train_dataset, batch_size=64, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max_iter)
    batches = iter(loader)
    for _ in range(max_iter):
        try:
            images, labels = next(batches)
        except StopIteration:
            batches = iter(loader)
            images, labels = next(batches)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    for (name, ours), theirs in zip(namespace["model"].state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name

    rows = [json.loads(line) for line in (tmp_path / "output" / "loop" / "metrics.json").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == list(range(19, max_iter, 20))
    assert rows[-1]["total_loss"] < rows[0]["total_loss"] / 4
    test = DigitsDataset("test")
    model.eval()
    with torch.no_grad():
        accuracy = (model(torch.stack([test[i][0] for i in range(len(test))])).argmax(1)
                    == torch.stack([test[i][1] for i in range(len(test))])).float().mean().item()
    assert accuracy >= 0.95, accuracy


#: The sections of the README whose python block a test of this file runs as written.
RUN_HERE = ["### The loop", "### Writing a hook", "### Without configs"]


def test_every_python_block_of_the_readme_is_run_here():
    text = README.read_text()
    headings = []
    for match in re.finditer(r"^```python$", text, re.M):
        headings.append(re.findall(r"^#+ .*$", text[: match.start()], re.M)[-1])
    assert headings == RUN_HERE  # a new block: run it in a test of this file, then name its section here
    source = Path(__file__).read_text()
    for heading in RUN_HERE:
        assert f'python_block_after("{heading}")' in source, heading


def test_the_quick_start_says_how_many_iterations_the_main_job_runs_and_its_one_time():
    """The quick start's time is the main job's: the number of iterations it
    states is the one configs/digits_mlp.py trains, and its timing paragraph
    gives one time (the tests' own count and time follow it)."""
    from treadle.config import LazyConfig

    max_iter = LazyConfig.load(str(README.parent / "configs" / "digits_mlp.py")).train.max_iter
    quick_start = " ".join(README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0].split())
    assert f"# install and run the main job: handwritten digits, {max_iter} iterations," in quick_start
    timing = quick_start[quick_start.index(f"The main job trains {max_iter} iterations (`train.max_iter` in "
                                           "`configs/digits_mlp.py`)"):quick_start.index("The tests: ")]
    assert len(re.findall(r"\b\d+(?:\.\d+)? (?:s|min)\b", timing)) == 1, timing
