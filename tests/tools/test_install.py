"""A plain (non-editable) ``pip install .`` into a fresh venv without ``wheel``:
the default job runs from any directory, through ``treadle-train`` and through
``python tools/train_net.py``, with the configs that ship inside the package,
and ``treadle-plot`` draws a run's metrics.json from any directory.

pip builds the wheel in an isolated environment with pyproject.toml's build
requirements (setuptools and wheel), fetched from the package index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What setup.py and MANIFEST.in read; a copy, so that the build leaves nothing in the checkout.
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "constraints.txt", "treadle", "tools", "docs"]
SHORT_JOB = ["train.max_iter=12", "train.eval_period=6", "train.log_period=6", "train.checkpointer.period=6"]


def run(command, cwd, timeout=300):
    # Without PYTHONPATH: the venv must import its own treadle, not this checkout's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def has_module(python: Path, name: str, cwd: Path) -> bool:
    found = run([str(python), "-c", f"import importlib.util as u; print(u.find_spec({name!r}) is not None)"], cwd)
    assert found.returncode == 0, found.stderr
    return found.stdout.strip() == "True"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv made as ``python -m venv --system-site-packages`` makes it: it sees
    this machine's packages (torch and the rest, so nothing big is downloaded)
    and has its own pip and, after ``pip install .``, its own non-editable copy
    of treadle. Returns ``(venv, whether wheel was importable in it)``."""
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
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _see_this_environment(python, base)
    wheel_visible = has_module(python, "wheel", base)
    build = run([str(python), "-m", "pip", "install", "-q", str(source)], base)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    shutil.rmtree(source)  # nothing may come from the source tree after the install
    return env_dir, wheel_visible


def _see_this_environment(python: Path, cwd: Path) -> None:
    """``--system-site-packages`` shows the base interpreter's packages, which
    are not this test's when it runs in a virtualenv (as the README's user
    runs it): a ``.pth`` file adds this environment's, after the new venv's own
    (its own treadle comes first)."""
    here = sysconfig.get_paths()["purelib"]
    if sys.prefix == sys.base_prefix:
        return
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd)
    assert site.returncode == 0, site.stderr
    (Path(site.stdout.strip()) / "outer_environment.pth").write_text(here + "\n")


@pytest.fixture(scope="module")
def venv_dir(installed):
    return installed[0]


def check_default_job(result, out: Path, env_dir: Path):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    site = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # The default config is the installed package's, not a checkout's.
    assert f"'config_file': '{site / 'treadle' / 'model_zoo' / 'configs' / 'digits_mlp.py'}'" in result.stdout
    assert (out / "model_final.pth").is_file()
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert any("accuracy" in line for line in lines)


@pytest.mark.slow
def test_installed_package_is_not_the_checkout(venv_dir, tmp_path):
    where = run([str(venv_dir / "bin" / "python"), "-c", "import treadle; print(treadle.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert str(venv_dir) in where.stdout and str(ROOT) not in where.stdout


@pytest.mark.slow
def test_treadle_train_runs_the_default_job_from_another_directory(venv_dir, tmp_path):
    out = tmp_path / "run"
    result = run([str(venv_dir / "bin" / "treadle-train"), f"train.output_dir={out}", *SHORT_JOB], tmp_path)
    check_default_job(result, out, venv_dir)


@pytest.mark.slow
def test_tools_train_net_runs_the_default_job_from_another_directory(venv_dir, tmp_path):
    out = tmp_path / "run"
    script = ROOT / "tools" / "train_net.py"
    result = run([str(venv_dir / "bin" / "python"), str(script), f"train.output_dir={out}", *SHORT_JOB], tmp_path)
    check_default_job(result, out, venv_dir)


def test_pip_install_dot_needs_no_wheel_in_the_venv(installed, tmp_path):
    env_dir, wheel_visible = installed
    if wheel_visible:
        pytest.skip("this interpreter has wheel, so the venv saw it: the install was not tried without it")
    # The fixture's `pip install .` succeeded in this venv, which has no wheel; the commands are there.
    assert not has_module(env_dir / "bin" / "python", "wheel", tmp_path)
    assert (env_dir / "bin" / "treadle-train").is_file() and (env_dir / "bin" / "treadle-plot").is_file()


@pytest.mark.parametrize("command", ["treadle-train", "treadle-plot"])
def test_commands_print_their_help_from_another_directory(venv_dir, tmp_path, command):
    result = run([str(venv_dir / "bin" / command), "--help"], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.startswith("usage: ")
    expected = "--config-file" if command == "treadle-train" else "RUN_DIR_OR_METRICS_JSON"
    assert expected in result.stdout


def test_treadle_plot_draws_a_run_from_another_directory(venv_dir, tmp_path):
    pytest.importorskip("matplotlib")  # the [plot] extra; the venv sees this interpreter's packages
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = [{"iteration": it, "total_loss": 2.0 / (it + 1), "lr": 0.1} for it in range(0, 40, 5)]
    (run_dir / "metrics.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = run([str(venv_dir / "bin" / "treadle-plot"), "run", "-o", "curves.png"], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.strip() == "treadle-plot: wrote curves.png (2 plot(s), 1 run(s))"
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_mypy_reads_the_installed_packages_types(venv_dir, tmp_path):
    """PEP 561: without treadle/py.typed, mypy skips an installed treadle ("missing library stubs or py.typed
    marker") and checks none of the Trainer's settings where a user writes them."""
    script = tmp_path / "typed.py"
    script.write_text("from torch import nn\nfrom treadle.trainer import Trainer\n\n"
                      "Trainer(nn.Linear(2, 2), 'sgd', [], grad_accum_steps='two')\n")
    result = run([sys.executable, "-m", "mypy", "--python-executable", str(venv_dir / "bin" / "python"),
                  "--cache-dir", str(tmp_path / "cache"), str(script)], tmp_path, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == (f"{script.name}:4: error: Argument \"grad_accum_steps\" to \"Trainer\" "
                                             "has incompatible type \"str\"; expected \"int\"  [arg-type]"), result.stdout
