"""What a Python-built training run imports: no config machinery it does not use."""

import subprocess
import sys

RUN = """
import sys, torch
from torch import nn
import torch.nn.functional as F
import treadle.engine, treadle.events, treadle.hooks
from treadle.engine import Trainer
model = nn.Linear(4, 2)
data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(6)]
Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data, loss_fn=F.cross_entropy, max_iter=6,
        output_dir=sys.argv[1], device="cpu", progress_bar=False).train()
print("IMPORTED:", *[name for name in ("omegaconf", "yaml", "fvcore.nn") if name in sys.modules])
"""


def test_a_python_built_trainer_imports_neither_omegaconf_nor_fvcore_nn(tmp_path):
    """OmegaConf (with YAML and ANTLR) and fvcore.nn are ~10 MB of resident
    memory and ~170 modules; only configs and PreciseBN use them."""
    result = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = [line for line in result.stdout.splitlines() if line.startswith("IMPORTED:")]
    assert imported == ["IMPORTED:"], result.stdout[-2000:]
    assert (tmp_path / "out" / "model_final.pth").is_file()


def test_the_config_entry_points_are_still_importable_by_name():
    code = (
        "import treadle.engine as e, treadle.config as c; "
        "from treadle.engine import DefaultTrainer, default_argument_parser, default_setup; "
        "from treadle.config import LazyCall, LazyConfig, instantiate, ConfigError; "
        "import treadle.engine.defaults as d; "
        "assert e.default_setup is d.default_setup and e.DefaultTrainer is d.DefaultTrainer; "
        "assert {'DefaultTrainer', 'default_setup', 'Trainer'} <= set(dir(e)); "
        "assert {'instantiate', 'LazyConfig', 'ConfigError'} <= set(dir(c)); "
        "print(type(e.__getattr__('default_setup')).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["function"]


def test_an_unknown_name_is_an_attribute_error_naming_it():
    import treadle.config
    import treadle.engine

    for module in (treadle.engine, treadle.config):
        try:
            getattr(module, "no_such_name")
        except AttributeError as error:
            assert str(error) == f"module {module.__name__!r} has no attribute 'no_such_name'"
        else:
            raise AssertionError(f"{module.__name__}.no_such_name did not raise")


def test_a_name_shared_with_its_submodule_stays_the_function_after_the_submodule_is_imported():
    """``treadle.config.locate`` is a function and a module: importing the
    module (as the engine's defaults do) must not replace the function."""
    code = (
        "import treadle.config.locate, treadle.config.instantiate, treadle.engine.defaults; "
        "from treadle.config import locate, instantiate; import treadle.config as c; "
        "print(type(locate).__name__, type(instantiate).__name__, type(c.locate).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["function", "function", "function"]
