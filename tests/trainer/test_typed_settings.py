"""The plain Trainer's settings as mypy and editors see them (issue 60):
``**settings: Unpack[TrainerSettingsDict]``, the ``TypedDict`` saying what
the table's groups say; a subclass passes them on; a flat read of
``trainer.settings`` warns."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
from torch import nn

from treadle.trainer import Trainer
from treadle.engine.history import EpochCallback
from treadle.trainer import settings
from treadle.trainer.settings import SETTINGS, TrainerSettingsDict

from tests.tiny_models import classification

ROOT = Path(__file__).resolve().parents[2]
CE = nn.functional.cross_entropy
#: The names the settings' annotations read under TYPE_CHECKING only.
NAMES = {"torch": torch, "EpochCallback": EpochCallback}
PATH_GIVEN = typing.Union[str, os.PathLike[str]]


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def table_types() -> dict:
    """Each setting's type as its group's field declares it, in the table's order."""
    types = {}
    for _, group in settings.GROUPS:
        hints = typing.get_type_hints(group, {**vars(settings), **NAMES})
        types.update({f.name: hints[f.name] for f in dataclasses.fields(group)})
    return types


def takes_a_path(name: str) -> bool:
    """Whether the row of ``name`` takes a ``pathlib.Path`` (read as its string once checked), as
    a path's rule does: it refuses what is no path."""

    def accepts(value) -> bool:
        try:
            rule(name, value)
        except (TypeError, ValueError):
            return False
        return True

    rule = settings.setting(name).rule
    return rule is not None and accepts(pathlib.Path("some_folder")) and not accepts(object())


def drift(typed_dict: type) -> list:
    """What ``typed_dict`` and the table say differently of the settings: names
    either has alone, and types that differ (a path setting is given as a
    ``str`` or an ``os.PathLike`` where its field, once checked, is a ``str``)."""
    given = typing.get_type_hints(typed_dict, None, NAMES)
    table = table_types()
    found = [f"{name}: only in the TypedDict" for name in given if name not in table]
    found += [f"{name}: not in the TypedDict" for name in table if name not in given]
    for name in given.keys() & table.keys():
        expected = table[name]
        if takes_a_path(name):
            assert expected == typing.Optional[str], name  # what the Trainer reads of a path
            expected = typing.Optional[PATH_GIVEN]
        if given[name] != expected:
            found.append(f"{name}: {given[name]} given, {table[name]} in the table")
    return sorted(found)


def test_the_typed_dict_is_the_table_by_name_and_type():
    """Every setting of the table, and only those, typed as its field is, both ways."""
    assert drift(TrainerSettingsDict) == []
    assert list(typing.get_type_hints(TrainerSettingsDict, None, NAMES)) == [row.name for row in SETTINGS]
    assert TrainerSettingsDict.__required_keys__ == frozenset()  # every setting may be left out
    assert [name for name in table_types() if takes_a_path(name)] == [
        "output_dir", "checkpoints_dir", "init_weights_from", "logs_dir"]


def test_the_drift_check_names_a_type_a_missing_name_and_an_extra_one():
    """The check above fails on each way the two can drift apart."""

    class Drifted(TrainerSettingsDict, total=False):  # a TypedDict's keys can only be added, so retype and add
        grad_accum_steps: str
        max_epoch: int

    missing = typing.TypedDict("missing", {name: t for name, t in typing.get_type_hints(
        TrainerSettingsDict, None, NAMES).items() if name != "eval_period"}, total=False)
    assert drift(Drifted) == ["grad_accum_steps: <class 'str'> given, <class 'int'> in the table",
                              "max_epoch: only in the TypedDict"]
    assert drift(missing) == ["eval_period: not in the TypedDict"]


def test_the_signature_shows_each_setting_as_the_typed_dict_types_it():
    """The reference's signature (``__signature__``) types each setting as mypy checks it."""
    import inspect

    parameters = list(inspect.signature(Trainer.__init__).parameters.values())[4:]
    assert [p.name for p in parameters] == list(TrainerSettingsDict.__annotations__)
    assert {p.name: p.annotation for p in parameters}["output_dir"] == "Optional[Union[str, os.PathLike[str]]]"
    assert {p.name: p.annotation for p in parameters}["grad_accum_steps"] == "int"
    assert all(p.kind is p.KEYWORD_ONLY for p in parameters)


def test_a_subclass_passes_its_settings_on_and_what_was_given_still_counts():
    """A user's ``__init__`` typed with the TypedDict (or not) calls the Trainer's; a
    setting given where it cannot act is still refused, one given as None still is not."""
    from typing_extensions import Unpack

    class Typed(Trainer):
        def __init__(self, model: nn.Module, data: typing.Any, **settings: Unpack[TrainerSettingsDict]) -> None:
            super().__init__(model, "sgd", data, **settings)

    class Plain(Trainer):
        def __init__(self, model, data, **settings):
            self.extra = "mine"
            super().__init__(model, "sgd", data, **settings)

    for cls in (Typed, Plain):
        trainer = cls(mlp(), classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=2, eval_period=None,
                      output_dir=None, progress_bar=False)
        assert trainer.settings.optimization.lr == 0.1 and trainer.settings.data.batch_size == 32
        assert trainer._given_settings == {"batch_size", "lr", "loss_fn", "max_iter", "progress_bar"}
        with pytest.raises(ValueError, match="^eval_period=4 is when eval_loader is evaluated, and no eval_loader"):
            cls(mlp(), classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=2, eval_period=4)
        with pytest.raises(TypeError, match="unexpected keyword argument 'max_epoch'"):
            cls(mlp(), classification(), batch_size=32, lr=0.1, max_epoch=2)


def test_a_flat_read_of_the_settings_warns_with_the_grouped_path():
    trainer = Trainer(mlp(), "sgd", classification(), batch_size=32, lr=0.1, loss_fn=CE, max_iter=2,
                      progress_bar=False)
    with pytest.warns(DeprecationWarning) as caught:
        assert trainer.settings.grad_accum_steps == 1
    assert [str(w.message) for w in caught] == [
        "trainer.settings.grad_accum_steps is deprecated and is removed in treadle 0.10: read "
        "trainer.settings.optimization.grad_accum_steps"]
    assert caught[0].filename == __file__  # the line that reads it is named
    with pytest.raises(AttributeError, match="^TrainerSettings has no setting 'eval_steps'$"):
        _ = trainer.settings.eval_steps


#: A user's script as mypy reads it; a line that ends ``# E<n>`` is one mypy must report, with ERRORS[n - 1].
EXAMPLE = '''\
import pathlib
from typing import Any

from torch import nn
from typing_extensions import Unpack

from treadle.trainer import Trainer
from treadle.trainer.settings import TrainerSettingsDict

model, data = nn.Linear(6, 2), [(0, 1)]
Trainer(model, "adamw", data, lr=1e-3, max_epochs=3, output_dir=pathlib.Path("out"), eval_period=None)
Trainer(model, "adamw", data, grad_accum_steps="two")  # E1
Trainer(model, "adamw", data, max_epoch=3)  # E2


class MyTrainer(Trainer):
    def __init__(self, model: nn.Module, data: Any, **settings: Unpack[TrainerSettingsDict]) -> None:
        super().__init__(model, "adamw", data, **settings)


class Untyped(Trainer):
    def __init__(self, model: nn.Module, data: Any, **settings: Any) -> None:
        super().__init__(model, "adamw", data, **settings)


trainer = MyTrainer(model, data, eval_period=4)
MyTrainer(model, data, eval_period="4")  # E3
Untyped(model, data, whatever=1)
period: int = trainer.settings.evaluation.eval_period  # E4
trainer.settings.eval_period  # E5
'''
ERRORS = [
    'Argument "grad_accum_steps" to "Trainer" has incompatible type "str"; expected "int"',
    'Unexpected keyword argument "max_epoch" for "Trainer"',
    'Argument "eval_period" to "MyTrainer" has incompatible type "str"; expected "int | None"',
    'Incompatible types in assignment (expression has type "int | None", variable has type "int")',
    '"TrainerSettings" has no attribute "eval_period"',
]


@pytest.mark.slow  # a cold mypy cache reads torch's types: about 45 s (3 s warm)
def test_mypy_names_a_wrong_type_and_an_unknown_setting(tmp_path):
    """mypy, with the project's configuration, reports exactly the lines marked in EXAMPLE."""
    pytest.importorskip("mypy", reason="the [dev] extra checks types")
    script = tmp_path / "user_script.py"
    script.write_text(EXAMPLE)
    # This checkout's treadle (not an installed one); the repository's cache, which `python -m mypy` warms.
    env = {**os.environ, "MYPYPATH": str(ROOT), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--no-error-summary", "--hide-error-context", str(script)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    reported = [(int(m.group(1)), m.group(2).split("; did you mean")[0]) for m in
                re.finditer(r"^.*user_script\.py:(\d+): error: (.*?)(?:  \[[\w-]+\])?$", done.stdout, re.M)]
    marked = [(n, ERRORS[int(line.rsplit("# E", 1)[1]) - 1]) for n, line in enumerate(EXAMPLE.splitlines(), 1)
              if re.search(r"# E\d+$", line)]
    assert len(marked) == len(ERRORS)
    assert reported == marked, done.stdout + done.stderr
    assert done.returncode == 1
