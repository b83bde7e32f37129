"""The package's public surface: every public name is re-exported."""

import importlib
import pkgutil

import treadle.evaluation as evaluation


def test_every_public_name_of_every_module_is_reexported():
    for info in pkgutil.iter_modules(evaluation.__path__):
        module = importlib.import_module(f"treadle.evaluation.{info.name}")
        assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"
        missing = [n for n in module.__all__ if n not in evaluation.__all__]
        assert missing == [], f"{module.__name__} exports {missing} but treadle.evaluation does not"
    assert all(hasattr(evaluation, n) for n in evaluation.__all__)
    assert len(set(evaluation.__all__)) == len(evaluation.__all__)
