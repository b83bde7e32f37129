"""What a Python-built training run imports: no config machinery it does not use."""

import os
import subprocess
import sys

RUN = """
import sys, torch
from torch import nn
import torch.nn.functional as F
import treadle.engine, treadle.events, treadle.hooks
from treadle.trainer import Trainer
model = nn.Linear(4, 2)
data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(6)]
Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), iter(data), loss_fn=F.cross_entropy, max_iter=6,
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
            module.no_such_name  # noqa: B018 - the lookup is the test
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


def _package_imports(package_dir, package):
    """``{module: {modules of the package it imports}}``, from every import
    statement of every module (those inside functions included)."""
    import ast
    from pathlib import Path

    modules = {p.stem for p in Path(package_dir).glob("*.py")}
    edges = {}
    for module in modules:
        tree = ast.parse((Path(package_dir) / f"{module}.py").read_text())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = package + ("." + base if base else "")
                # "from pkg import sub" imports the submodule; "from pkg import name", the package.
                names = [f"{base}.{a.name}" if f"{base}.{a.name}"[len(package) + 1:] in modules else base
                         for a in node.names]
            else:
                continue
            for name in names:
                if name == package:
                    targets.add("__init__")
                elif name.startswith(package + "."):
                    head = name[len(package) + 1:].split(".")[0]
                    if head in modules:
                        targets.add(head)
        edges[module] = targets - {module}
    return edges


def _cycles(edges):
    found, seen = [], set()

    def visit(module, path):
        for target in sorted(edges.get(module, ())):
            if target in path:
                found.append(path[path.index(target):] + [target])
            elif target not in seen:
                visit(target, path + [target])
        seen.add(module)

    for module in sorted(edges):
        if module not in seen:
            visit(module, [module])
    return found


def test_no_module_of_treadle_checkpoint_imports_a_module_that_imports_it_back():
    import treadle.checkpoint

    directory = os.path.dirname(treadle.checkpoint.__file__)
    edges = _package_imports(directory, "treadle.checkpoint")
    assert {"checkpointer", "folder", "background", "sharded", "weights"} <= set(edges)
    assert "sharded" in edges["weights"] and "key_matching" in edges["sharded"]  # the parser sees imports
    assert _cycles(edges) == [], " ; ".join(" -> ".join(cycle) for cycle in _cycles(edges))


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    (tmp_path / "c.py").write_text("from pkg.a import y\nfrom pkg import VERSION\n")
    edges = _package_imports(tmp_path, "pkg")
    assert edges == {"a": {"b"}, "b": {"a"}, "c": {"a", "__init__"}}
    assert _cycles(edges) == [["a", "b", "a"]]


def test_no_private_name_of_the_checkpointer_is_read_outside_its_module():
    """Hooks, the engine and the tools use the checkpointer's public API
    (``in_flight``, ``failed``, ``raise_if_failed``...), and the modules of
    treadle.checkpoint import no private name from each other."""
    import ast
    from pathlib import Path

    import treadle

    root = Path(treadle.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if "checkpointer" in name.lower() and path.parent.name != "checkpoint":
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {name}.{node.attr}")
            if path.parent.name == "checkpoint" and isinstance(node, ast.ImportFrom) and node.level:
                found += [f"{path.relative_to(root)}:{node.lineno}: imports {a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert found == []


# ---------------------------------------------------------------------- the whole package
def _treadle_imports(root):
    """``{module: {treadle modules it imports}}`` for every module of the
    package under ``root`` (dotted names; a package is its ``__init__``),
    from every import statement, ``TYPE_CHECKING`` and function-level ones
    included. A module's own packages are not edges: Python imports them
    before it anyway."""
    import ast
    from pathlib import Path

    root = Path(root)

    def name_of(path):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(p): p for p in root.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for candidate in candidates:
                parts = candidate.split(".")
                for i in range(1, len(parts) + 1):
                    module = ".".join(parts[:i])
                    if module in modules and module != name and not name.startswith(module + "."):
                        targets.add(module)
        edges[name] = targets
    return edges


def test_no_import_circle_anywhere_in_treadle():
    """The layers of docs/architecture.md point down: hooks see the trainer through
    TrainerProtocol, never by importing the engine (TYPE_CHECKING imports
    count too)."""
    import treadle

    edges = _treadle_imports(os.path.dirname(treadle.__file__))
    assert "treadle.engine.train_loop" in edges["treadle.trainer.trainer"]  # the walk sees imports
    assert not any(m.startswith("treadle.engine") for m in edges["treadle.hooks.base"])
    assert _cycles(edges) == [], " ; ".join(" -> ".join(cycle) for cycle in _cycles(edges))


def test_the_whole_package_finder_sees_a_type_checking_circle(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .a import x\n")
    (package / "sub" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import y\n")
    (package / "b.py").write_text("from pkg.sub.a import x\n")
    edges = _treadle_imports(package)
    assert edges["pkg.sub.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.sub", "pkg.sub.a"}
    assert _cycles(edges) != []


#: Names that look private but are public API, or a key: why each is read.
_PUBLIC_UNDERSCORE_NAMES = {
    "_exit": "os._exit: the documented way to end a process without running exit handlers",
    "_getframe": "sys._getframe: the documented way to read a caller's frame (a config file's line)",
    "_target_": "a config node's key (detectron2's and Hydra's), not an attribute",
    "_fields": "a named tuple's field names: the documented way to tell one from a tuple",
}
#: The modules that wrap a library's private names, each the one place for its library.
_WRAPPERS = {
    "config/nodes.py": "OmegaConf's node interface",
    "utils/torch_internals.py": "torch's private calls",
    "utils/logger.py": "logging's format string (a style's _fmt), read to format a line without a record",
    "utils/atomic.py": "iopath's handler lookup (PathManager's __get_path_handler), to tell a local path from a remote one",
}


def test_no_module_reads_another_objects_private_name_but_the_wrappers():
    """No module of treadle reads or writes another module's underscore
    attribute or imports one, also by a string (``getattr(x, "_name")``,
    ``hasattr``, ``setattr``); a library's private name is read only in the
    module that wraps that library (_WRAPPERS)."""
    import ast
    from pathlib import Path

    import treadle

    root = Path(treadle.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where in _WRAPPERS:
            continue
        tree = ast.parse(path.read_text())
        own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        # Names this module gives objects it does not define (a marker on a logging handler).
        assigned = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found += [f"{where}:{node.lineno}: imports {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            by_string = _read_by_string(node)
            if by_string is not None:
                owner, name = by_string
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) and not (
                    name in _PUBLIC_UNDERSCORE_NAMES or name in assigned
                ):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                continue
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in own_classes):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                continue
            if node.attr in _PUBLIC_UNDERSCORE_NAMES or node.attr in assigned:
                continue  # a name this module gives the objects it makes (a handler's marker) is its own
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def _read_by_string(node):
    """``(owner, name)`` where ``node`` is ``getattr``/``hasattr``/``setattr``/
    ``delattr`` of a private name given as a string, else None."""
    import ast

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2):
        return None
    name = node.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return None
    if not name.value.startswith("_") or (name.value.startswith("__") and name.value.endswith("__")):
        return None
    return node.args[0], name.value


def test_a_private_name_read_by_a_string_is_seen():
    import ast

    found = [_read_by_string(n) for n in ast.walk(ast.parse(
        'getattr(scaler, "_scale", None)\nhasattr(self, "_x")\ngetattr(m, "__name__")\ngetattr(m, "name")'
    ))]
    seen = [(ast.unparse(owner), name) for owner, name in filter(None, found)]
    assert seen == [("scaler", "_scale"), ("self", "_x")]

