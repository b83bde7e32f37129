"""Every shell command of the README, run in order in a clean copy of the repository.

A new user copies the README's commands from the top, in a fresh clone
(after the install commands). Each one must end as the README says: with
status 0, or, where its comment says ``# error: MESSAGE``, with the one-line
error of a bad input (status 2, one line on stderr holding MESSAGE, ``...``
standing for any text, and nothing written).

The commands are read from the README's ```bash, ```sh, ```shell and
```console blocks (in a console block, the lines after a ``$ `` prompt), so
that a command added to the README is run here without touching this file.
A command that cannot run in a test is skipped by a stated rule, never
silently: a line ``<!-- not run by tests: REASON -->`` just before a block
skips that block, and :data:`NOT_RUN` skips the commands (or the parts of a
``a && b`` command) its patterns match, each with its reason. What was
skipped is printed (``pytest -rP`` shows it).

The copy holds the files ``git ls-files`` names (a clean clone's), and the
commands import its treadle (``PYTHONPATH``), as after ``pip install -e .``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import pytest

from tests.run_files import snapshot

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: Commands (or parts of ``a && b``) a test cannot run: (pattern, reason).
NOT_RUN: List[Tuple[str, str]] = [
    (r"^pip install\b", "installs into the interpreter running the tests; the copy's treadle is imported "
                        "through PYTHONPATH instead (tests/tools/test_install.py installs into a fresh venv)"),
    (r"^python -m pytest\b", "the test suite, which runs this test"),
    (r"^python -m venv\b|^\. \.venv/bin/activate$", "makes and enters a virtual environment: each command here "
                                                    "runs in a shell of its own, with the interpreter running the "
                                                    "tests (tests/tools/test_install.py installs into a fresh venv)"),
    (r"tracking_uri=https?://", "needs an MLflow tracking server at that address, which the README has the user start"),
    (r"train\.device=cuda|gpu_checks\.sh", "needs CUDA: the tests run as on a machine without a GPU"),
]

SKIP_MARKER = re.compile(r"<!--\s*not run by tests:\s*(?P<reason>.*?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# The status the README gives a bad input ("status 2 for a bad input (nothing written)").
BAD_INPUT_STATUS = 2


class Command(NamedTuple):
    line: int  # where it starts in the README
    text: str  # what bash runs (continuation lines joined)
    comment: str  # its trailing comment, without the '#'
    skipped: Optional[str]  # why the whole block is not run, from a marker


def _split_comment(line: str) -> Tuple[str, str]:
    """``(command, comment)``: the comment starts at a ``#`` after a blank, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def readme_commands(text: str) -> List[Command]:
    """The shell commands of ``text`` (a README), in order."""
    lines = text.splitlines()
    commands: List[Command] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        lang, start = fence.group("lang"), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # the closing fence
        if lang not in SHELL_LANGS:
            continue
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = SKIP_MARKER.search(lines[before]) if before >= 0 else None
        skipped = marker.group("reason") if marker else None
        pending: List[str] = []
        first = 0
        for number, raw in body:
            if lang == "console":
                if not (pending or raw.startswith("$ ")):
                    continue  # the output shown
                raw = raw[2:] if not pending else raw
            if not pending and not raw.strip():
                continue
            if not pending and raw.lstrip().startswith("#"):
                continue  # a comment line
            command, comment = _split_comment(raw)
            if not pending:
                first = number
            if command.endswith("\\") and not comment:
                pending.append(command[:-1].strip())
                continue
            pending.append(command.strip())
            commands.append(Command(first, " ".join(p for p in pending if p), comment, skipped))
            pending = []
    return commands


def runnable_part(command: Command) -> Tuple[str, List[str]]:
    """What of ``command`` the test runs (``""``: nothing) and why the rest is skipped."""
    if command.skipped is not None:
        return "", [f"README line {command.line}: {command.text!r}: {command.skipped}"]
    kept, why = [], []
    for part in (p.strip() for p in command.text.split("&&")):
        reason = next((r for pattern, r in NOT_RUN if re.search(pattern, part)), None)
        if reason is None:
            kept.append(part)
        else:
            why.append(f"README line {command.line}: {part!r}: {reason}")
    return " && ".join(kept), why


def expected_error(comment: str) -> Optional[List[str]]:
    """The pieces (in order) of the error line a ``# error: ...`` comment announces, else None."""
    if not comment.startswith("error:"):
        return None
    pieces = [p.strip() for p in comment[len("error:") :].split("...")]
    return [p for p in pieces if p]


def clean_copy(destination: Path) -> Path:
    """The files ``git ls-files`` names, copied to ``destination`` (symbolic links as links)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e}): the clean copy is made of the files git tracks")
    for name in filter(None, listed):
        source, target = ROOT / name, destination / name
        if not os.path.lexists(source):
            continue  # deleted in the work tree, not yet in a commit
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
    return destination


# ---------------------------------------------------------------------- the parser
def test_the_parser_reads_commands_comments_continuations_and_markers():
    text = "\n".join([
        "```bash",
        "# a comment line",
        "pip install -e . && python tools/train_net.py   # the main job",
        "python tools/train_net.py --config-file a.py \\",
        "    train.max_iter=5 'quoted # not a comment'",
        "python tools/train_net.py x=1  # error: Unknown ... did you mean 'y'? ...",
        "```",
        "```python",
        "print('not a shell command')",
        "```",
        "<!-- not run by tests: needs a GPU -->",
        "",
        "```console",
        "$ nvidia-smi",
        "output line",
        "```",
    ])
    commands = readme_commands(text)
    assert [c.text for c in commands] == [
        "pip install -e . && python tools/train_net.py",
        "python tools/train_net.py --config-file a.py train.max_iter=5 'quoted # not a comment'",
        "python tools/train_net.py x=1",
        "nvidia-smi",
    ]
    assert [c.line for c in commands] == [3, 4, 6, 14]
    assert runnable_part(commands[0])[0] == "python tools/train_net.py"
    assert "installs into the interpreter" in runnable_part(commands[0])[1][0]
    assert expected_error(commands[2].comment) == ["Unknown", "did you mean 'y'?"]
    assert expected_error(commands[0].comment) is None
    assert runnable_part(commands[3]) == ("", ["README line 14: 'nvidia-smi': needs a GPU"])


def test_the_readme_has_commands_to_run_and_each_skip_has_a_reason():
    commands = readme_commands(README.read_text())
    run = [c for c in commands if runnable_part(c)[0]]
    assert len(run) >= 10, [c.text for c in commands]
    for command in commands:
        kept, why = runnable_part(command)
        assert kept or why, command  # nothing vanishes without a reason
        if command.skipped is not None:
            assert command.skipped, f"README line {command.line}: a skip marker without a reason"


def test_the_quick_start_enters_a_virtual_environment_before_it_installs():
    text = README.read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = readme_commands(quick_start)
    assert commands[0].text == "python -m venv .venv && . .venv/bin/activate"
    assert all("pip install" in c.text for c in commands[1:]), [c.text for c in commands]
    assert r"on Windows, activate with .venv\Scripts\activate" in quick_start
    kept, why = runnable_part(commands[0])
    assert kept == "" and len(why) == 2 and all("makes and enters a virtual environment" in w for w in why), why


# ---------------------------------------------------------------------- the run
@pytest.mark.slow
def test_every_readme_command_runs_in_order_in_a_clean_copy(tmp_path):
    repo = clean_copy(tmp_path / "clone")
    # `python` is the interpreter running the tests (a script, not a link: a
    # link outside a venv's bin/ would lose the venv), and `torchrun`,
    # `treadle-plot` are those installed beside it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = dict(
        os.environ,
        PYTHONPATH=str(repo),
        PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
    )
    skipped: List[str] = []
    durations: List[str] = []
    ran = 0
    for command in readme_commands(README.read_text()):
        script, why = runnable_part(command)
        skipped += why
        if not script:
            continue
        where = f"README line {command.line}: {script}"
        error = expected_error(command.comment)
        outputs = repo / "output"
        before = (snapshot(outputs) if outputs.exists() else {}) if error is not None else None
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=600
        )
        ran += 1
        durations.append(f"{time.monotonic() - started:6.1f} s  {where}")
        shown = f"{where}\n--- stdout (end)\n{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-3000:]}"
        if error is None:
            assert result.returncode == 0, shown
            continue
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == BAD_INPUT_STATUS, shown
        assert len(lines) == 1 and ": error: " in lines[0], shown
        message, position = lines[0], 0
        for piece in error:
            found = message.find(piece, position)
            assert found >= 0, f"{where}\nthe README announces {piece!r} (after column {position}) in:\n{message}"
            position = found + len(piece)
        if before is not None:
            after = snapshot(outputs) if outputs.exists() else {}
            assert after == before, f"{where}: a refused command wrote into output/"
    print(f"ran {ran} README commands:\n" + "\n".join(durations) + "\nnot run:\n" + "\n".join(skipped))
    assert ran >= 10
