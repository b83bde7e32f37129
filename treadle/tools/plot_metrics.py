"""Plots the scalars of one or more runs' ``metrics.json`` into one PNG.

    treadle-plot output/run_a output/run_b/metrics.json \\
        -o compare.png --keys total_loss lr eval/accuracy --smooth 10 --log-y

(``treadle-plot`` is the installed command; ``python tools/plot_metrics.py``
runs the same from a checkout.)

Each input is a run directory (its ``metrics.json`` is read) or a
``metrics.json`` file as :class:`treadle.events.JSONWriter` writes it: one
JSON object per line with an integer ``"iteration"``. The figure has one
subplot per key and one line per run, in the same colour in every subplot,
labelled with the run directory's name; x is the iteration.

- Keys: by default every key with a numeric value except ``iteration``, the
  loss-named ones first (``total_loss``, then names ending in or starting
  with ``loss``); ``--keys`` picks and orders them.
- A key that appears on fewer than half as many lines as its run's most
  frequent key (an evaluation result among training scalars, typically) is
  drawn with markers as well as a line, so that isolated points stay visible.
- ``null``, NaN and infinite values are skipped (JSONWriter writes a NaN loss
  as ``null``).
- ``--smooth N`` draws the trailing mean of N points over the raw line
  (faded); series drawn with markers are not smoothed: each point is one
  evaluation.
- A last line cut short (a run killed mid-write) and lines that are not
  metrics records are skipped with a warning.

matplotlib is an optional dependency (``pip install 'treadle[plot]'``); the
figure is drawn with the Agg canvas, so no display is needed. Exit status: 0
when the plot is written, 1 for a problem with the inputs (one line on
stderr), 2 for bad command-line usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from treadle.utils.file_io import PathManager

__all__ = ["main", "build_parser", "load_run", "order_keys", "RunMetrics", "PlotError"]

PROG = "treadle-plot"  # also from a checkout (tools/plot_metrics.py): one tool, one name in its messages
METRICS_FILE = "metrics.json"
ITERATION_KEY = "iteration"
DEFAULT_OUTPUT = "metrics.png"

# A path with a scheme (s3://, manifold://) is not made absolute.
_URI_MARK = "://"

# A key on fewer than this share of the lines of its run's most frequent key
# is drawn with markers: evaluations among training scalars.
_SPARSE_SHARE = 0.5


class PlotError(Exception):
    """A problem with the inputs or the environment; main() prints it as one line."""


@dataclass
class RunMetrics:
    """The numeric series of one ``metrics.json``.

    Attributes:
        name: legend label (the run directory's name, made unique among the inputs).
        path: the ``metrics.json`` read.
        series: key -> ``(iterations, values)``, sorted by iteration, finite values only.
        lines_with_key: key -> number of records holding the key (``null`` included).
    """

    name: str
    path: str
    series: Dict[str, Tuple[List[int], List[float]]] = field(default_factory=dict)
    lines_with_key: Dict[str, int] = field(default_factory=dict)

    def is_sparse(self, key: str) -> bool:
        """Whether ``key`` is drawn with markers (see the module docstring)."""
        densest = max(self.lines_with_key.values(), default=0)
        points = len(self.series.get(key, ((), ()))[0])
        return points <= 1 or self.lines_with_key.get(key, 0) < _SPARSE_SHARE * densest


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but True is not a measurement.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def resolve_metrics_file(path: str) -> str:
    """The ``metrics.json`` that ``path`` (a run directory or the file itself) designates."""
    if PathManager.isdir(path):
        candidate = os.path.join(path, METRICS_FILE)
        if not PathManager.isfile(candidate):
            raise PlotError(f"{path} is a directory without {METRICS_FILE}")
        return candidate
    if not PathManager.exists(path):
        raise PlotError(f"no such file or directory: {path}")
    return path


def load_run(path: str, name: str) -> RunMetrics:
    """Reads one ``metrics.json`` into a :class:`RunMetrics` labelled ``name``."""
    with PathManager.open(path, "r", encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise PlotError(f"{path} is empty: the run has written no metrics yet")
    lines = text.split("\n")
    # key -> {iteration: value}; a later line for the same iteration wins.
    points: Dict[str, Dict[int, Optional[float]]] = {}
    records = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            cut_short = lineno == len(lines)  # no newline after it: an interrupted write
            _warn(f"{path}:{lineno}: {'incomplete last line' if cut_short else 'not JSON'}; skipped")
            continue
        iteration = record.get(ITERATION_KEY) if isinstance(record, dict) else None
        if not isinstance(iteration, int) or isinstance(iteration, bool):
            _warn(f"{path}:{lineno}: not a JSON object with an integer '{ITERATION_KEY}'; skipped")
            continue
        records += 1
        for key, value in record.items():
            if key == ITERATION_KEY:
                continue
            if value is None or _is_number(value):
                points.setdefault(key, {})[iteration] = None if value is None else float(value)
    if records == 0:
        raise PlotError(f"{path} holds no metrics records (JSON objects with an integer '{ITERATION_KEY}')")

    run = RunMetrics(name=name, path=path)
    for key, by_iter in points.items():
        run.lines_with_key[key] = len(by_iter)
        finite = [(i, v) for i, v in sorted(by_iter.items()) if v is not None and math.isfinite(v)]
        run.series[key] = ([i for i, _ in finite], [v for _, v in finite])
    return run


def _is_loss_name(key: str) -> bool:
    # Only orders the subplots; --keys overrides it. metrics.json records no
    # kind for its scalars, so the name is all there is to go on.
    leaf = key.rsplit("/", 1)[-1]
    return leaf.startswith("loss") or leaf.endswith("loss")


def order_keys(keys: Sequence[str]) -> List[str]:
    """Default subplot order: ``total_loss``, other loss names, then the rest, alphabetically."""
    return sorted(set(keys), key=lambda k: (k != "total_loss", not _is_loss_name(k), k))


def _run_names(files: Sequence[str]) -> List[str]:
    """Legend labels, unique among the inputs.

    A run is named by its directory (``output/run_a/metrics.json`` is
    ``run_a``), a file with another name by its stem; where two labels clash,
    the paths relative to the inputs' common directory are used instead.
    """
    paths = [f if _URI_MARK in f else os.path.abspath(f) for f in files]

    def label(path: str) -> str:
        base = os.path.basename(path)
        return os.path.basename(os.path.dirname(path)) if base == METRICS_FILE else os.path.splitext(base)[0]

    names = [label(p) for p in paths]
    if len(set(names)) < len(names):
        try:
            common = os.path.commonpath([os.path.dirname(p) for p in paths])
            names = [
                os.path.dirname(os.path.relpath(p, common)) or label(p)
                if os.path.basename(p) == METRICS_FILE
                else os.path.splitext(os.path.relpath(p, common))[0]
                for p in paths
            ]
        except ValueError:  # URIs mixed with local paths: keep the paths whole
            names = list(files)
    seen: Dict[str, int] = {}
    unique = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        unique.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return unique


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line of this tool."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot the scalars of treadle runs' metrics.json files into one PNG.",
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="RUN_DIR_OR_METRICS_JSON", help="run directories or metrics.json files"
    )
    parser.add_argument(
        "-o", "--output", help=f"image to write (default: {DEFAULT_OUTPUT} next to the first input's metrics.json)"
    )
    parser.add_argument(
        "--keys",
        nargs="+",
        metavar="KEY",
        help="keys to plot, in this order (default: every numeric key, losses first)",
    )
    parser.add_argument(
        "--smooth", type=_positive_int, default=1, metavar="N", help="trailing mean over N points (default 1: none)"
    )
    parser.add_argument("--log-y", action="store_true", help="logarithmic y axes")
    return parser


def _import_matplotlib() -> Tuple[Any, Any, Any]:
    """``(Figure, FigureCanvasAgg, rcParams)``, or a PlotError naming the extra to install."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(
            "matplotlib is not installed: pip install 'treadle[plot]' (or pip install matplotlib)"
        ) from None
    return Figure, FigureCanvasAgg, matplotlib.rcParams


def _trailing_mean(values: Sequence[float], window: int) -> List[float]:
    """Each value replaced by the mean of it and up to ``window - 1`` values before it."""
    out: List[float] = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _default_output(first_metrics_file: str) -> str:
    return os.path.join(os.path.dirname(first_metrics_file), DEFAULT_OUTPUT)


def _select_keys(runs: Sequence[RunMetrics], requested: Optional[Sequence[str]]) -> List[str]:
    available = order_keys([k for r in runs for k in r.series])
    if not available:
        raise PlotError("the inputs hold no numeric keys besides 'iteration'")
    if requested is None:
        # A key that is null on every line (a loss that was always NaN) is
        # only plotted when asked for: an empty subplot by default is noise.
        plotted = [k for k in available if any(r.series.get(k, ((), ()))[0] for r in runs)]
        if not plotted:
            raise PlotError("every numeric key is null/NaN on every line; nothing to plot")
        return plotted
    unknown = [k for k in requested if k not in available]
    if unknown:
        raise PlotError(f"unknown key(s) {', '.join(map(repr, unknown))}; available: {', '.join(available)}")
    return list(dict.fromkeys(requested))  # drop repeats, keep the order given


def _draw(runs: Sequence[RunMetrics], keys: Sequence[str], smooth: int, log_y: bool) -> Any:
    """The figure: one subplot per key, one colour per run."""
    Figure, FigureCanvasAgg, rcParams = _import_matplotlib()

    colors = rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    ncols = 1 if len(keys) == 1 else 2 if len(keys) <= 4 else 3
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(5.5 * ncols, 3.4 * nrows + 0.6), dpi=100)
    FigureCanvasAgg(fig)  # explicit Agg canvas: no display, no pyplot global state
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()

    handles: Dict[str, Any] = {}
    for ax, key in zip(axes, keys):
        has_points = False
        has_positive = False
        for index, run in enumerate(runs):
            if key not in run.series:
                continue
            xs, ys = run.series[key]
            if not xs:
                continue
            has_points = True
            has_positive = has_positive or any(y > 0 for y in ys)
            color = colors[index % len(colors)]
            if run.is_sparse(key):
                (line,) = ax.plot(xs, ys, color=color, marker="o", markersize=4, linewidth=1.2, label=run.name)
            elif smooth > 1:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=1.0)
                (line,) = ax.plot(xs, _trailing_mean(ys, smooth), color=color, linewidth=1.5, label=run.name)
            else:
                (line,) = ax.plot(xs, ys, color=color, linewidth=1.5, label=run.name)
            handles.setdefault(run.name, line)
        ax.set_title(key, fontsize=11)
        ax.set_xlabel(ITERATION_KEY)
        ax.grid(True, alpha=0.3)
        if not has_points:
            ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", va="center", color="gray")
        elif log_y:
            if has_positive:
                ax.set_yscale("log")  # non-positive values are masked, not fatal
            else:
                _warn(f"'{key}' has no positive values; its y axis stays linear")
    for ax in axes[len(keys) :]:
        ax.set_visible(False)

    ordered = [handles[r.name] for r in runs if r.name in handles]
    if ordered:  # none when every asked-for key is null throughout
        fig.legend(
            ordered, [h.get_label() for h in ordered], loc="upper center", ncol=min(len(ordered), 4), frameon=False
        )
    # Leave the top band to the legend.
    top = 1.0 - 0.5 / fig.get_figheight()
    fig.tight_layout(rect=(0.0, 0.0, 1.0, top))
    return fig


def _output_format(output: str) -> str:
    """The image format that ``output``'s extension names (``png`` without one)."""
    _, FigureCanvasAgg, _ = _import_matplotlib()
    ext = os.path.splitext(output)[1].lower().lstrip(".") or "png"
    supported = FigureCanvasAgg.get_supported_filetypes()
    if ext not in supported:
        raise PlotError(
            f"cannot write {output}: unknown image format '.{ext}' (use one of: {', '.join(sorted(supported))})"
        )
    return ext


def _save(fig: Any, output: str, fmt: str) -> None:
    directory = os.path.dirname(output)
    if directory:
        PathManager.mkdirs(directory)
    with PathManager.open(output, "wb") as f:
        fig.savefig(f, format=fmt)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the tool on ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        _import_matplotlib()  # before reading anything: fail fast when it cannot plot at all
        files = [resolve_metrics_file(p) for p in args.inputs]
        output = args.output or _default_output(files[0])
        fmt = _output_format(output)
        runs = [load_run(f, n) for f, n in zip(files, _run_names(files))]
        keys = _select_keys(runs, args.keys)
        _save(_draw(runs, keys, args.smooth, args.log_y), output, fmt)
    except PlotError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2  # a user error, as treadle-train's and argparse's
    print(f"{PROG}: wrote {output} ({len(keys)} plot(s), {len(runs)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
