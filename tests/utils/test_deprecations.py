"""The one table of old names: every row imports (or is called) at its old
name, does what its new name does, and warns naming the new name and the
version it goes in; a module that left is refused in one line."""

import subprocess
import sys
import warnings

import pytest
import torch

from treadle.utils.deprecations import DEPRECATED, GONE, Deprecated, deprecated


def _run(code):
    """What ``code`` prints in a fresh interpreter (old names are answered once per process)."""
    result = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def _warned(code):
    """The DeprecationWarnings ``code`` raises, as ``(message, filename)``, and what it prints."""
    wrapped = ("import warnings\n"
               "with warnings.catch_warnings(record=True) as caught:\n"
               "    warnings.simplefilter('always')\n"
               + "".join(f"    {line}\n" for line in code.splitlines())
               + "print(repr([(str(w.message), w.filename) for w in caught if w.category is DeprecationWarning]))\n")
    *printed, warned = _run(wrapped).stdout.splitlines()
    return eval(warned), printed


def _stepper_row(row):
    stepped = []
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    from treadle.hooks import LRScheduler

    with pytest.warns(DeprecationWarning) as caught:
        hook = LRScheduler(optimizer, scheduler, stepper=lambda: stepped.append(1))
    hook.step_schedule()
    assert stepped == [1]
    return [str(w.message) for w in caught], caught[0].filename


def _flat_setting_row(row):
    from treadle.trainer.settings import SETTINGS, TrainerSettings

    settings = TrainerSettings.of({s.name: s.default for s in SETTINGS})
    with pytest.warns(DeprecationWarning) as caught:
        value = settings.eval_period
    assert value is settings.evaluation.eval_period
    return [str(w.message) for w in caught], caught[0].filename


#: How each row read or called is exercised: old name -> a function doing it, returning (messages, the warned file).
CALLS = {"LRScheduler(stepper=...)": _stepper_row, "trainer.settings.{name}": _flat_setting_row}
#: The names filling a row's ``{fields}`` in its exercise above.
FILLS = {"trainer.settings.{name}": {"name": "eval_period", "group": "evaluation"}}


@pytest.mark.parametrize("row", [r for r in DEPRECATED if r.kind == "module"], ids=lambda r: r.old)
def test_an_old_module_imports_the_new_module_and_warns_naming_it_and_the_version(row):
    warned, printed = _warned(f"import {row.old} as old, {row.new} as new\nprint(old is new)")
    assert printed == ["True"]
    assert warned == [(f"{row.old} is deprecated and is removed in treadle {row.removed_in}: import {row.new} "
                       "instead", "<string>")]


@pytest.mark.parametrize("row", [r for r in DEPRECATED if r.kind == "attribute"], ids=lambda r: r.old)
def test_an_old_attribute_is_the_new_one_and_warns_at_each_import(row):
    package, _, name = row.old.rpartition(".")
    new_module, _, new_name = row.new.rpartition(".")
    warned, printed = _warned(f"from {package} import {name} as old\nfrom {package} import {name} as again\n"
                              f"from {new_module} import {new_name} as new\nimport {package}\n"
                              f"print(old is new is again, {name!r} in dir({package}))")
    assert printed == ["True True"]  # still listed, as it still imports
    message = f"{row.old} is deprecated and is removed in treadle {row.removed_in}: import {row.new} instead"
    assert warned == [(message, "<string>")] * 2  # the importing lines, not importlib's probe


@pytest.mark.parametrize("row", [r for r in DEPRECATED if r.kind in ("argument", "read")], ids=lambda r: r.old)
def test_an_old_argument_or_attribute_read_acts_and_warns_naming_what_to_write_instead(row):
    messages, filename = CALLS[row.old](row)
    fill = FILLS.get(row.old, {})
    old, new = row.old.format(**fill), row.new.format(**fill)
    instead = f"read {new}" if row.kind == "read" else new
    assert messages == [f"{old} is deprecated and is removed in treadle {row.removed_in}: {instead}"]
    assert filename == __file__  # the user's line


def test_every_row_is_walked_and_names_a_version_after_the_one_it_warns_since():
    assert set(CALLS) == {r.old for r in DEPRECATED if r.kind in ("argument", "read")}
    assert {r.kind for r in DEPRECATED} <= {"module", "attribute", "read", "argument"}
    version = lambda text: tuple(int(part) for part in text.split("."))  # noqa: E731
    assert all(version(r.since) < version(r.removed_in) for r in DEPRECATED)
    assert len({r.old for r in DEPRECATED}) == len(DEPRECATED)
    assert deprecated("treadle.engine.Trainer") == Deprecated(
        "treadle.engine.Trainer", "treadle.trainer.Trainer", "attribute", removed_in="0.10", since="0.9")


@pytest.mark.parametrize("old", sorted(GONE))
def test_a_module_that_left_is_refused_in_one_line_saying_where_it_went(old):
    result = subprocess.run([sys.executable, "-c", f"import {old}"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (f"ModuleNotFoundError: {old} is no longer a module of treadle: "
                                                     f"{GONE[old]}")


def test_the_package_warns_nothing_for_its_own_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from treadle.engine import DefaultTrainer, EagerStep  # noqa: F401
        from treadle.trainer import Trainer  # noqa: F401
