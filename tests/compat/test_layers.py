"""The layer of other trainers' names sits above the engine: no module of the
core (loop, steps, hooks, events, checkpoints) or of detectron2's job layer
(``DefaultTrainer``, its default hooks, builders, launch) reaches it, directly
or through another module; only the plain ``Trainer`` does, and the command
line job (for another trainer's config nodes)."""

import os
import subprocess
import sys

import treadle
from tests.engine.test_import_footprint import _treadle_imports

#: The layer, and the plain Trainer, its one user.
ABOVE_THE_ENGINE = ("treadle.compat", "treadle.trainer")
#: What may import them: themselves, the command line, and the examples built on the plain Trainer.
USERS = (*ABOVE_THE_ENGINE, "treadle.tools", "treadle.examples")


def _reached(edges, start):
    seen, todo = set(), [start]
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _is_in(module, packages):
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_no_core_or_job_module_reaches_the_compatibility_layer():
    edges = _treadle_imports(os.path.dirname(treadle.__file__))
    # The walk follows chains: the plain Trainer reaches the names through the layer's modules.
    assert "treadle.compat.names" in _reached(edges, "treadle.trainer.trainer")
    leaks = {}
    for module in sorted(edges):
        if _is_in(module, USERS):
            continue
        reached = sorted(m for m in _reached(edges, module) if _is_in(m, ABOVE_THE_ENGINE))
        if reached:
            leaks[module] = reached
    assert not leaks, "\n".join(f"{m} reaches {', '.join(r)}" for m, r in leaks.items())


def test_the_walk_sees_a_chain_through_another_module(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text("from . import middle\n")
    (package / "middle.py").write_text("def f():\n    from pkg import compat\n")
    (package / "compat.py").write_text("")
    assert "pkg.compat" in _reached(_treadle_imports(package), "pkg.core")


def _output_of(code):
    """What ``code`` prints in a fresh interpreter, whose modules are only those it imports."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_importing_the_engine_and_running_its_jobs_loads_nothing_of_the_layer():
    code = (
        "import sys, treadle.engine, treadle.engine.defaults, treadle.engine.default_hooks, treadle.hooks, "
        "treadle.engine.launch, treadle.checkpoint, treadle.events\n"
        "from treadle.engine import DefaultTrainer, EagerStep, TrainerBase, build_step\n"
        "print(sorted(m for m in sys.modules if m.startswith(('treadle.compat', 'treadle.trainer'))))\n"
        "from treadle.engine import Trainer\n"
        "print(Trainer.__module__, 'treadle.compat.overrides' in sys.modules)\n"
    )
    assert _output_of(code).splitlines() == ["[]", "treadle.trainer.trainer True"]


def test_the_old_module_paths_import_the_moved_modules():
    code = (
        "import treadle.engine.seed_names as a, treadle.compat.names as b\n"
        "from treadle.engine.seed_overrides import SeedOverrides\n"
        "from treadle.engine.trainer import Trainer\n"
        "from treadle.engine.trainer_settings import SETTINGS\n"
        "import treadle.compat.overrides as o, treadle.trainer as t, treadle.trainer.settings as s\n"
        "print(a is b, SeedOverrides is o.SeedOverrides, Trainer is t.Trainer, SETTINGS is s.SETTINGS)\n"
    )
    assert _output_of(code).split() == ["True"] * 4


def test_the_pages_generator_that_left_the_package_is_refused_naming_where_it_went():
    code = (
        "try:\n"
        "    import treadle.engine.seed_pages\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
    )
    assert _output_of(code).strip() == ("treadle.engine.seed_pages is no longer a module of treadle: the pages "
                                        "generator is the documentation tool tools/seed_pages.py")


def test_an_old_module_path_warns_naming_the_new_one_and_leaves_the_new_module_reloadable():
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import treadle.engine.trainer as old\n"
        "import treadle.trainer.trainer as new\n"
        "print([(w.category.__name__, str(w.message), w.filename) for w in caught])\n"
        "print(old is new, new.__spec__.name, new.__spec__.origin == new.__file__)\n"
        "real, new.Trainer = new.Trainer, None\n"
        "importlib.reload(new)\n"
        "print(new.Trainer is not None and new.Trainer is not real)\n"
    )
    warned, same, reloaded = _output_of(code).splitlines()
    assert warned == repr([("DeprecationWarning", "treadle.engine.trainer is deprecated and is removed in treadle "
                            "0.10: import treadle.trainer.trainer instead", "<string>")])
    assert same.split() == ["True", "treadle.trainer.trainer", "True"]
    assert reloaded == "True"


def test_running_an_old_module_path_says_in_one_line_what_to_run_instead():
    result = subprocess.run([sys.executable, "-m", "treadle.engine.seed_names"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"{sys.executable}: treadle.engine.seed_names moved to treadle.compat.names and is "
                             "removed in treadle 0.10: run python -m treadle.compat.names instead\n")
