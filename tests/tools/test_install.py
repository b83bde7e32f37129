"""A plain (non-editable) ``pip install .``: the default job runs from any
directory, through ``treadle-train`` and through ``python tools/train_net.py``,
with the configs that ship inside the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What setup.py and MANIFEST.in read; a copy, so that the build leaves nothing in the checkout.
SOURCES = ["setup.py", "MANIFEST.in", "README.md", "constraints.txt", "treadle", "tools", "docs"]
SHORT_JOB = ["train.max_iter=12", "train.eval_period=6", "train.log_period=6", "train.checkpointer.period=6"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv that sees this machine's packages (torch and the rest) but holds
    its own, non-editable copy of treadle."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    source.mkdir()
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    env_dir = base / "venv"
    # Without its own pip: the venv's bundled setuptools would shadow this machine's (newer) one.
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    build = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(source)],
        capture_output=True, text=True, timeout=300, cwd=base,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    shutil.rmtree(source)  # nothing may come from the source tree after the install
    return env_dir


def run(command, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def check_default_job(result, out: Path, env_dir: Path):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    site = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # The default config is the installed package's, not a checkout's.
    assert f"'config_file': '{site / 'treadle' / 'model_zoo' / 'configs' / 'digits_mlp.py'}'" in result.stdout
    assert (out / "model_final.pth").is_file()
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert any("accuracy" in line for line in lines)


@pytest.mark.slow
def test_installed_package_is_not_the_checkout(installed, tmp_path):
    where = run([str(installed / "bin" / "python"), "-c", "import treadle; print(treadle.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert str(installed) in where.stdout and str(ROOT) not in where.stdout


@pytest.mark.slow
def test_treadle_train_runs_the_default_job_from_another_directory(installed, tmp_path):
    out = tmp_path / "run"
    result = run([str(installed / "bin" / "treadle-train"), f"train.output_dir={out}", *SHORT_JOB], tmp_path)
    check_default_job(result, out, installed)


@pytest.mark.slow
def test_tools_train_net_runs_the_default_job_from_another_directory(installed, tmp_path):
    out = tmp_path / "run"
    script = ROOT / "tools" / "train_net.py"
    result = run([str(installed / "bin" / "python"), str(script), f"train.output_dir={out}", *SHORT_JOB], tmp_path)
    check_default_job(result, out, installed)
