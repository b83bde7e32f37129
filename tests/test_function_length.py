"""No function of ``treadle/`` over 60 lines: each reads on one screen.

A function is counted from its ``def`` line to its last line, its docstring
aside (a long docstring is welcome). A longer one is split into helpers with
one purpose each, not cut arbitrarily.
"""

import ast
from pathlib import Path

import treadle

MAX_LINES = 60


def _long_functions(package_dir, max_lines=MAX_LINES):
    """``["path:line name (N lines)"]`` for each function under
    ``package_dir`` longer than ``max_lines`` once its docstring is taken out."""
    root = Path(package_dir)
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines -= first.end_lineno - first.lineno + 1
            if lines > max_lines:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_treadle_is_over_60_lines_docstrings_aside():
    long = _long_functions(Path(treadle.__file__).parent)
    assert long == [], "split these into helpers with one purpose each: " + "; ".join(long)


def test_the_counter_names_a_long_function_and_leaves_out_its_docstring(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    docstring = '    """A docstring\n\n    of four lines.\n    """\n'
    method_body = "".join(f"        x{i} = {i}\n" for i in range(59))
    (package / "a.py").write_text(
        f"def fits():\n{docstring}{body}    return x0\n\n\n"  # 60 lines without its docstring
        f"class C:\n    async def too_long(self):\n{method_body}        return x0\n"  # 61 lines
    )
    assert _long_functions(package) == ["pkg/a.py:68 too_long (61 lines)"]
