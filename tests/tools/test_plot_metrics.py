"""Tests of tools/plot_metrics.py, through its main(argv) and as a script."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "plot_metrics.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load_tool():
    spec = importlib.util.spec_from_file_location("treadle_tools_plot_metrics", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


plot_metrics = _load_tool()


def _write_lines(path, records, tail=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)
    return str(path)


@pytest.fixture
def two_runs(tmp_path):
    """Two runs as JSONWriter writes them: training lines every 20 iterations,
    evaluation-only lines every 50, a NaN loss written as null."""
    runs = []
    for name, scale in (("run_a", 1.0), ("run_b", 0.7)):
        records = []
        for it in range(19, 400, 20):
            records.append(
                {"iteration": it, "lr": 0.1 * (1 - it / 400), "loss_cls": scale * 2 / (1 + it / 50),
                 "total_loss": scale * 3 / (1 + it / 50), "time": 0.01}
            )
        for it in range(49, 400, 50):
            records.append({"iteration": it, "eval/accuracy": 0.5 + it / 1000 * scale})
        records.sort(key=lambda r: r["iteration"])
        next(r for r in records if r["iteration"] == 59)["total_loss"] = None  # a NaN loss
        runs.append(_write_lines(tmp_path / name / "metrics.json", records))
    return tmp_path, runs


def _assert_png(path, min_bytes=10_000):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes
    image = imread(path)
    return image.shape


def test_plots_two_runs_with_nulls_and_eval_lines(two_runs, capsys):
    root, (a, b) = two_runs
    out = root / "compare.png"
    assert plot_metrics.main([str(root / "run_a"), b, "-o", str(out)]) == 0
    height, width, channels = _assert_png(out)
    # 5 keys -> a 3-column grid of 2 rows at 100 dpi.
    assert (width, height) == (1650, 740) and channels == 4
    assert "wrote" in capsys.readouterr().out


def test_default_output_is_next_to_the_first_input(two_runs):
    root, (a, b) = two_runs
    assert plot_metrics.main([a, b, "--keys", "total_loss", "eval/accuracy", "--smooth", "3", "--log-y"]) == 0
    height, width, _ = _assert_png(root / "run_a" / "metrics.png")
    assert (width, height) == (1100, 400)  # 2 keys side by side


def test_series_read_skip_nulls_and_mark_eval_keys(two_runs):
    root, (a, _) = two_runs
    run = plot_metrics.load_run(a, "run_a")
    iterations, values = run.series["total_loss"]
    assert len(iterations) == 19 and 59 not in iterations  # the null line is skipped
    assert run.lines_with_key["total_loss"] == 20
    assert run.series["eval/accuracy"][0] == [49, 99, 149, 199, 249, 299, 349, 399]
    assert run.is_sparse("eval/accuracy") and not run.is_sparse("total_loss")


def test_default_key_order_puts_losses_first():
    keys = ["time", "eval/accuracy", "lr", "loss_cls", "total_loss", "data_time", "val/loss"]
    assert plot_metrics.order_keys(keys) == [
        "total_loss", "loss_cls", "val/loss", "data_time", "eval/accuracy", "lr", "time"
    ]


def test_missing_file_is_one_line_error(tmp_path, capsys):
    missing = tmp_path / "nope" / "metrics.json"
    assert plot_metrics.main([str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"treadle-plot: error: no such file or directory: {missing}"


def test_directory_without_metrics_is_an_error(tmp_path, capsys):
    assert plot_metrics.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"treadle-plot: error: {tmp_path} is a directory without metrics.json"


def test_empty_file_is_an_error(tmp_path, capsys):
    empty = _write_lines(tmp_path / "run" / "metrics.json", [])
    assert plot_metrics.main([empty]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"treadle-plot: error: {empty} is empty: the run has written no metrics yet"


def test_unknown_key_lists_the_available_ones(two_runs, capsys):
    root, (a, _) = two_runs
    assert plot_metrics.main([a, "--keys", "total_loss", "accuracy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "treadle-plot: error: unknown key(s) 'accuracy'; available: "
        "total_loss, loss_cls, eval/accuracy, lr, time"
    )
    assert not os.path.exists(root / "run_a" / "metrics.png")


def test_incomplete_last_line_is_skipped_with_a_warning(tmp_path, capsys):
    path = _write_lines(
        tmp_path / "run" / "metrics.json",
        [{"iteration": 0, "total_loss": 2.0}, {"iteration": 1, "total_loss": 1.0}],
        tail='{"iteration": 2, "total_lo',
    )
    run = plot_metrics.load_run(path, "run")
    assert run.series["total_loss"] == ([0, 1], [2.0, 1.0])
    assert f"{path}:3: incomplete last line; skipped" in capsys.readouterr().err


def test_bad_arguments_are_usage_errors(two_runs):
    _, (a, _) = two_runs
    with pytest.raises(SystemExit) as exit_info:
        plot_metrics.main([a, "--smooth", "0"])
    assert exit_info.value.code == 2


def test_missing_matplotlib_names_the_extra(two_runs, monkeypatch, capsys):
    _, (a, _) = two_runs
    # None in sys.modules makes an import fail as if the module were not installed.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    assert plot_metrics.main([a]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "treadle-plot: error: matplotlib is not installed: pip install 'treadle[plot]' (or pip install matplotlib)"
    )


def test_runs_as_a_script_from_the_repository_root(two_runs):
    root, (a, _) = two_runs
    out = root / "script.png"
    result = subprocess.run(
        [sys.executable, "tools/plot_metrics.py", a, "-o", str(out), "--keys", "lr"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    _assert_png(out, min_bytes=5_000)


def test_plots_what_json_writer_writes(tmp_path):
    from treadle.events import EventStorage, JSONWriter, ScalarKind

    path = str(tmp_path / "run" / "metrics.json")
    writer = JSONWriter(path, window_size=2)
    writer.set_start_iter(0)
    with EventStorage(0) as storage:
        for it in range(40):
            storage.iter = it
            storage.put_scalar("total_loss", 1.0 / (it + 1), kind=ScalarKind.LOSS)
            storage.put_scalar("lr", 0.1, smoothing_hint=False)
            if it % 5 == 4:
                storage.put_scalar("eval/top1", it / 40, smoothing_hint=False, kind=ScalarKind.METRIC)
            if it % 10 == 9:
                writer.write()
    writer.close()

    run = plot_metrics.load_run(path, "run")
    assert run.series["total_loss"][0] == [9, 19, 29, 39]
    assert run.series["eval/top1"][0] == [4, 9, 14, 19, 24, 29, 34, 39]
    out = tmp_path / "run.png"
    assert plot_metrics.main([str(tmp_path / "run"), "-o", str(out)]) == 0
    _assert_png(out)


def test_unknown_output_format_is_an_error_before_reading(two_runs, capsys):
    root, (a, _) = two_runs
    assert plot_metrics.main([a, "-o", str(root / "plot.jpgx")]) == 2
    assert "unknown image format '.jpgx'" in capsys.readouterr().err
    assert not os.path.exists(root / "plot.jpgx")
