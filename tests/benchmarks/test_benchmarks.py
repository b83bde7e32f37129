"""The benchmarks still run: each is started with the smallest settings and
its report read back (the figures themselves are not asserted)."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.benchmarks.valgrind_stand_in import COUNTS, EVENTS

ROOT = Path(__file__).resolve().parents[2]

# Each starts benchmark processes: tens of seconds.
pytestmark = pytest.mark.slow


def test_overhead_benchmark_prints_every_section():
    out = subprocess.run(
        # One torch thread: two OpenMP threads on a busy 2-core machine spin for each other (7x the CPU time).
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "2", "--iters", "20", "--no-compile", "--breakdown",
         "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    for expected in ("~1 ms", "~0.2 ms", "paired", "fastest", "without the JSON and console writers", "PeriodicWriter.after_step", "+ LRScheduler", "the torch operations alone"):
        assert expected in out, f"{expected!r} missing from:\n{out}"


def test_checkpoint_benchmark_prints_sync_and_async_figures_for_both_formats():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpoint.py"), "--sizes", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    for expected in ("sync save s", "MiB/s", "first stall s", "stall/sync", "extra host MiB"):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    rows = [line.split() for line in out.splitlines() if line.strip().endswith(tuple("0123456789"))]
    # One row per (processes, format): 1 and 2 processes, file and dcp.
    assert sorted((row[1], row[2]) for row in rows) == [("1", "dcp"), ("1", "file"), ("2", "dcp"), ("2", "file")]


def test_peers_benchmark_prints_a_row_per_system_with_identical_weights():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--rounds", "1", "--iters", "30",
         "--systems", "hand", "hand-recorded", "treadle-bare", "treadle-hooks", "treadle-trainer"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    lines = [line.split() for line in out.splitlines()]
    header = next(line for line in lines if line and line[0] == "system")
    rows = {line[0]: dict(zip(header, line)) for line in lines if line and line[0] in
            ("hand", "hand-recorded", "treadle-bare", "treadle-hooks", "treadle-trainer")}
    assert sorted(rows) == ["hand", "hand-recorded", "treadle-bare", "treadle-hooks", "treadle-trainer"], out
    # Every system ends with the hand-written loop's weights, bit for bit.
    assert all(row["bit-identical"] == "True" for row in rows.values()), out


def test_peers_benchmark_paired_times_each_system_against_hand_in_its_own_process():
    script = str(ROOT / "benchmarks" / "peers.py")
    # One process: hand and the system alternately, each pair's two times kept.
    child = subprocess.run([sys.executable, script, "--child", "treadle-bare", "--paired", "--pairs", "3", "--iters", "30"],
                           capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(child.strip().splitlines()[-1])
    assert result["system"] == "treadle-bare" and len(result["hand"]) == len(result["times"]) == 3, result
    assert all(t > 0 for t in result["hand"] + result["times"]), result
    # Every run in the process, hand's and treadle's, ends with the same weights.
    assert result["bit_identical"] is True, result
    out = subprocess.run([sys.executable, script, "--paired", "--rounds", "1", "--pairs", "2", "--iters", "30",
                          "--systems", "hand", "treadle-bare", "treadle-hooks"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert "against the hand-written DataLoader loop trained alternately in the same process" in out, out
    lines = [line.split() for line in out.splitlines()]
    rows = {line[0]: line for line in lines if line and line[0] in ("hand", "treadle-bare", "treadle-hooks")}
    # hand is what the others are paired with, not a row of its own.
    assert sorted(rows) == ["treadle-bare", "treadle-hooks"], out
    for row in rows.values():
        hand_ms, ms, added, ratio = float(row[1]), float(row[2]), float(row[3]), float(row[5])
        assert hand_ms > 0 and ms > 0 and ratio > 0 and abs(added) < 1e6 and row[4].count("..") == 1, row
        assert row[6] == "True", row


def test_peers_benchmark_interleaved_alternates_the_two_loops_an_iteration_each():
    peers = _peers_module()
    turns = peers._TakingTurns()
    order = []

    def loop(me, iterations):
        turns.wait_for_first_turn(me)
        try:
            for i in range(iterations):
                order.append((me, i))
                turns.hand_over(me)
        finally:
            turns.finish(me)

    # The loop in the second thread runs 3 iterations, this one 5: once it
    # has returned, the other is no longer held up waiting for turns.
    other = threading.Thread(target=loop, args=(0, 3))
    other.start()
    loop(1, 5)
    other.join(timeout=60)
    assert not other.is_alive()
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (1, 3), (1, 4)]


def test_peers_benchmark_interleaved_times_each_system_against_hand_in_turns_on_one_cpu():
    script = str(ROOT / "benchmarks" / "peers.py")
    child = subprocess.run([sys.executable, script, "--child", "treadle-hooks", "--interleaved", "--iters", "80"],
                           capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(child.strip().splitlines()[-1])
    assert result["system"] == "treadle-hooks" and result["system_first"] is False, result
    # Both loops share one CPU; both end with the same weights.
    assert len(result["cpus"]) == 1 and result["bit_identical"] is True, result
    assert result["hand_ms"] > 0 and abs(result["added_us"]) < 1e6, result
    # A figure per phase of the writers' period; the flush falls in the last
    # (that it is the costliest is the benchmark's to show, not a test's).
    assert len(result["phases_us"]) == 20 and result["flush_phase_us"] == result["phases_us"][-1], result
    out = subprocess.run([sys.executable, script, "--interleaved", "--rounds", "2", "--iters", "80",
                          "--systems", "hand", "treadle-bare"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert "taking turns with it, an iteration each, in the same process on one CPU" in out, out
    rows = {line[:28].strip(): line[28:].split() for line in out.splitlines()[2:]}
    # hand's row is the control: the hand-written loop against itself.
    assert sorted(rows) == ["hand (against itself)", "treadle-bare"], out
    for row in rows.values():
        hand_ms, added, error, spread, ratio, same = float(row[0]), float(row[1]), float(row[2]), row[3], float(row[4]), row[7]
        assert hand_ms > 0 and abs(added) < 1e6 and error >= 0 and spread.count("..") == 1, row
        # Page faults per iteration, the system's and hand's.
        assert all(float(count) >= 0 for count in row[6].split("/")), row
        # From the rounded figures printed beside it.
        assert ratio == pytest.approx(1 + added / (hand_ms * 1e3), abs=5e-4) and same == "True", row
    proc = subprocess.run([sys.executable, script, "--interleaved", "--paired"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--interleaved is a timing of its own" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, script, "--interleaved", "--iters", "79"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--interleaved needs --iters of at least 80" in proc.stderr, proc.stderr
    # The steady stretch starts after --warmup iterations (a tenth by default;
    # --warmup 20 and --system-first: the next test's child).
    assert result["warmup"] == 8, result
    proc = subprocess.run([sys.executable, script, "--interleaved", "--iters", "100", "--warmup", "21"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--warmup must be from 0 to --iters - 80" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, script, "--paired", "--warmup", "5"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--warmup goes with --interleaved" in proc.stderr, proc.stderr


def test_peers_benchmark_interleaved_child_writes_each_loops_thread_and_timed_spans(tmp_path):
    script = str(ROOT / "benchmarks" / "peers.py")
    spans = tmp_path / "spans.json"
    child = subprocess.run([sys.executable, script, "--child", "treadle-bare", "--interleaved", "--iters", "100",
                            "--warmup", "20", "--system-first", "--spans", str(spans)],
                           capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(child.strip().splitlines()[-1])
    assert result["warmup"] == 20 and result["system_first"] is True and result["bit_identical"] is True, result
    loops = json.loads(spans.read_text())
    # --system-first: the system's loop is the first one.
    assert [(loop["name"], loop["is_system"]) for loop in loops] == [("treadle-bare", True), ("hand", False)], loops
    # Two threads of their own, neither the main one; iterations 20..98 timed.
    assert len({loop["thread_id"] for loop in loops} | {os.getpid()}) == 3, loops
    for loop in loops:
        assert loop["first"] == 20 and len(loop["spans"]) == 79, loop
        assert all(start < end for start, end in loop["spans"]), loop
    # Turns: each span of one loop lies between two of the other's.
    ends = sorted((start, end, loop["is_system"]) for loop in loops for start, end in loop["spans"])
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])), ends[:4]


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_perf_spans_attributes_the_samples_of_the_timed_spans_by_shared_object():
    # The smallest run through its code: two processes (each loop goes first
    # once), the shortest steady stretch --interleaved takes. What the figures
    # read (the 30 us of busy waiting, timed and sampled alike) is the
    # benchmark's to show, not a test's to assert.
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "perf_spans.py"), "--system", "hand-plus-30us",
                          "--processes", "2", "--iters", "80", "--warmup", "0", "--width", "128", "--functions", "3"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0 and "perf_event_paranoid" in out.stderr + out.stdout:
        pytest.skip("perf may not sample here")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("hand-plus-30us against hand, interleaved, width 128, 80 iterations after 0"), out.stdout
    assert lines[1].split()[:3] == ["process", "timed", "+us/it"], out.stdout
    processes = [line.split() for line in lines[2:4]]
    assert [row[0] for row in processes] == ["0", "1"], out.stdout
    for row in processes:
        # Timed and sampled microseconds added per iteration, then the
        # largest shared objects, each with its own figure.
        assert all(re.fullmatch(r"[+-]\d+\.\d", value) for value in row[1:3]), row
        assert len(row) > 3 and all(re.fullmatch(r"[+-]\d+\.\d", value) for value in row[4::2]), row
    by_object = lines.index("mean over the processes, +us per iteration, by shared object:")
    by_function = next(i for i, line in enumerate(lines) if line.startswith("by function (the 3 largest"))
    assert by_function > by_object + 1, out.stdout
    # --functions 3: at most three functions listed, each with its figure and shared object.
    functions = [line.split(None, 2) for line in lines[by_function + 1:]]
    assert 1 <= len(functions) <= 3 and all(len(f) >= 2 and re.fullmatch(r"[+-]\d+\.\d", f[0]) for f in functions), out.stdout


def test_peers_benchmark_interleaved_averages_the_two_orders_and_takes_each_orders_spread():
    peers = _peers_module()
    rows = [{"system_first": True, "added_us": v} for v in (10.0, 12.0, 14.0)]
    rows += [{"system_first": False, "added_us": v} for v in (-6.0, -4.0)]
    mean, error = peers._mean_over_slots(rows)
    # (12 + -5) / 2, not the pooled 5.2; the error from each order's own
    # variance (4 over 3 processes, 2 over 2), not from the 9 us between them.
    assert mean == pytest.approx(3.5) and error == pytest.approx((4 / 3 + 2 / 2) ** 0.5 / 2), (mean, error)
    # Processes of one order only: their plain mean and standard error.
    mean, error = peers._mean_over_slots(rows[:3])
    assert mean == pytest.approx(12.0) and error == pytest.approx(2 / 3 ** 0.5), (mean, error)


def test_peers_benchmark_measures_every_system_with_no_gpu_visible(monkeypatch):
    # MMEngine's Runner and pytorch-accelerated's Trainer move the model to a
    # GPU they can see: on a GPU machine they trained there while the others
    # trained on the CPU (found on an H200, where their weights differed).
    peers = _peers_module()
    environments = []

    def run(command, **kwargs):
        environments.append(kwargs.get("env") or dict(os.environ))
        return subprocess.CompletedProcess(command, 0, stdout='{"system": "mmengine"}\n', stderr="")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("TREADLE_BENCH_MALLOC_DEFAULTS", raising=False)
    monkeypatch.setattr(peers.subprocess, "run", run)
    assert peers._run_child("mmengine", 30, 128, "--paired") == {"system": "mmengine"}
    assert environments[0]["CUDA_VISIBLE_DEVICES"] == "" and environments[0]["HIP_VISIBLE_DEVICES"] == ""
    # Each measured process gets the steady heap (see STEADY_HEAP).
    assert environments[0]["MALLOC_TRIM_THRESHOLD_"] == peers.STEADY_HEAP["MALLOC_TRIM_THRESHOLD_"]
    # The rest of the caller's environment is passed on.
    assert environments[0]["PATH"] == os.environ["PATH"]


def test_peers_benchmark_keeps_the_measured_processes_heap_steady_unless_told(monkeypatch):
    peers = _peers_module()
    monkeypatch.delenv("TREADLE_BENCH_MALLOC_DEFAULTS", raising=False)
    environment = peers.child_environment()
    assert environment["MALLOC_TRIM_THRESHOLD_"] == str(2**30), environment
    assert environment["MALLOC_MMAP_THRESHOLD_"] == str(32 * 2**20), environment
    # --malloc-defaults: glibc's own thresholds (the caller's environment, unchanged).
    monkeypatch.setenv("TREADLE_BENCH_MALLOC_DEFAULTS", "1")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    environment = peers.child_environment()
    assert "MALLOC_TRIM_THRESHOLD_" not in environment and "MALLOC_MMAP_THRESHOLD_" not in environment


def _peers_module():
    spec = importlib.util.spec_from_file_location("peers_benchmark", ROOT / "benchmarks" / "peers.py")
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    return peers


def test_peers_benchmark_runs_processes_side_by_side_each_pinned_to_a_core_of_its_own():
    script = str(ROOT / "benchmarks" / "peers.py")
    cores = _peers_module().physical_cores()
    # A measured process pinned by --cpu runs on that CPU alone.
    child = subprocess.run([sys.executable, script, "--child", "treadle-bare", "--paired", "--pairs", "1", "--iters", "30",
                            "--cpu", str(cores[-1])], capture_output=True, text=True, timeout=300, check=True).stdout
    assert json.loads(child.strip().splitlines()[-1])["cpus"] == [cores[-1]]
    if len(cores) < 2:
        pytest.skip("one physical core: --jobs 2 is refused here")
    # One round: its two processes, one per system, run at once.
    out = subprocess.run([sys.executable, script, "--paired", "--jobs", "2", "--rounds", "1", "--pairs", "1", "--iters", "30",
                          "--systems", "treadle-bare", "treadle-hooks"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert "2 processes at a time, each pinned to a core of its own" in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("treadle-")}
    assert sorted(rows) == ["treadle-bare", "treadle-hooks"] and all(row[6] == "True" for row in rows.values()), out


def test_peers_benchmark_hands_each_running_process_a_core_no_other_holds(monkeypatch):
    peers = _peers_module()
    monkeypatch.setattr(peers, "physical_cores", lambda: [0, 2, 4, 6])
    held, most = set(), [0]
    lock = threading.Lock()
    # The first three wait for each other: they can only pass if three run at once.
    together = threading.Barrier(3, timeout=60)

    def child(system, iters, width, *options, cpu=None):
        with lock:
            assert cpu not in held, f"core {cpu} handed out twice"
            held.add(cpu)
            most[0] = max(most[0], len(held))
        if system in ("s0", "s1", "s2"):
            together.wait()
        with lock:
            held.discard(cpu)
        return {"system": system, "cpu": cpu}

    monkeypatch.setattr(peers, "_run_child", child)
    tasks = [(f"s{i}", ()) for i in range(7)]
    rows = peers.run_children(tasks, 30, 128, jobs=3)
    # In the order of the tasks, on the last three cores, three at a time.
    assert [row["system"] for row in rows] == [f"s{i}" for i in range(7)]
    assert {row["cpu"] for row in rows} == {2, 4, 6} and most[0] == 3


def test_peers_benchmark_refuses_paired_with_counts_fewer_than_one_pair_or_only_hand():
    script = str(ROOT / "benchmarks" / "peers.py")
    proc = subprocess.run([sys.executable, script, "--paired", "--calls"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--paired times; it does not go with --calls or --instructions" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--paired", "--pairs", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--pairs must be at least 1, got 0" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--paired", "--systems", "hand"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "name at least one other in --systems" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--jobs", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--jobs must be at least 1, got 0" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--jobs", "100000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--jobs 100000: this process may run on" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--jobs", "2", "--calls"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--jobs goes with the timed tables, not with --calls or --instructions" in proc.stderr


def test_frame_depth_benchmark_prints_each_system_with_its_worst_depth():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "frame_depth.py"), "--iters", "10", "--max-depth", "6", "--step", "3",
         "--systems", "hand", "treadle-bare"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert "by the depth train() is called from" in out and "depths 0-6 step 3" in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert sorted(rows) == ["hand", "treadle-bare"], out
    for row in rows.values():
        median, worst, there, faults = float(row[1]), int(row[2]), float(row[3]), float(row[4])
        assert median > 0 and worst in (0, 3, 6) and there > 0 and faults >= 0, row
        # "N of 3": depths 0, 3 and 6 were measured.
        assert row[6:8] == ["of", "3"] and 0 <= int(row[5]) <= 3, row
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "frame_depth.py"), "--step", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--step at least 1" in proc.stderr, proc.stderr


def test_flush_benchmark_prints_each_part_with_and_without_records():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "flush.py"), "--rounds", "1", "--iters", "40"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    rows = {line[:46].strip(): line[46:].split() for line in out.splitlines()[2:] if line[:1].isalpha() and "amortized" not in line}
    assert sorted(rows) == sorted([
        "storage (pending values)", "CommonMetricPrinter", "JSONWriter", "TensorboardWriter",
        "whole flush (PeriodicWriter.after_step)", "TensorBoard hand-over, per row (every 10 s)",
    ]), out
    # Two positive figures per part: without and with a LogRecord for the console line.
    assert all(len(v) == 2 and all(float(x) > 0 for x in v) for v in rows.values()), out
    amortized = re.search(r"per iteration, amortized: ([\d.]+) us, and ([\d.]+) us of TensorBoard's hand-over", out)
    # The hand-over per iteration is its per-row figure over the period (20).
    assert amortized and float(amortized.group(2)) == pytest.approx(
        float(rows["TensorBoard hand-over, per row (every 10 s)"][0]) / 20, abs=0.06), out


def test_flush_benchmark_refuses_a_run_with_fewer_than_two_flushes():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flush.py"), "--rounds", "1", "--iters", "20"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--iters must be at least twice --period (got --iters 20, --period 20)" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flush.py"), "--period", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--period must be at least 1, got 0" in proc.stderr, proc.stderr


def test_peers_benchmark_counts_calls_per_iteration():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--calls", "--iters", "40", "--systems", "hand", "treadle-bare"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in out.splitlines()
            if line.split() and line.split()[0] in ("hand", "treadle-bare")}
    assert sorted(rows) == ["hand", "treadle-bare"], out
    # A training step is hundreds of calls; the hand-written loop's own row is +0.
    assert all(count > 100 for count, _ in rows.values()) and rows["hand"][1] == 0.0, out


def test_peers_benchmark_counts_treadles_own_calls_of_the_readme_tours_loop():
    """--calls also counts, of the calls, those of treadle's own functions (code under treadle/), in a
    table of their own before the total's: none in the hand-written loop, tens in the README tour's
    loop (treadle-tour), which makes hundreds in all."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--calls", "--iters", "40", "--systems", "hand",
         "treadle-tour"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    own_table, total_table = out.split("Python and C function calls per iteration")
    assert own_table.startswith("Calls of treadle's own Python functions (code under treadle/) per iteration"), out

    def rows(table):
        return {line.split()[0]: float(line.split()[1]) for line in table.splitlines()
                if line.split() and line.split()[0] in ("hand", "treadle-tour")}

    own, total = rows(own_table), rows(total_table)
    assert sorted(own) == sorted(total) == ["hand", "treadle-tour"], out
    assert own["hand"] == 0.0 and 10 < own["treadle-tour"] < 100 < total["treadle-tour"], out


def test_peers_benchmark_tables_callgrinds_counts_of_the_steady_stretch(tmp_path):
    """--instructions --cache-sim through the script's own code, with a
    stand-in for valgrind (tests/benchmarks/valgrind_stand_in.py) that runs
    each measured process as it is and writes callgrind's dumps with known
    counts: what valgrind is asked, which dump is read, and the table."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "valgrind").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("valgrind_stand_in.py")}" "$@"\n')
    (bin_dir / "valgrind").chmod(0o755)
    log = tmp_path / "valgrind.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VALGRIND_STAND_IN_LOG": str(log)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--instructions", "--cache-sim", "--iters", "30",
         "--systems", "hand", "--profiles", str(tmp_path / "profiles")],
        capture_output=True, text=True, timeout=300, check=True, env=env,
    ).stdout
    calls = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda call: call["command"])
    assert [call["command"][-7:] for call in calls] == [
        ["--child", system, "--bounded", "--iters", "30", "--width", "128"] for system in ("hand", "reference")], calls
    for call in calls:
        assert call["options"][:2] == ["--tool=callgrind", "--dump-before=getsid"], call
        assert call["options"][3:] == ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=524288,8,64"], call
        assert call["env"] == {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}, call
    # The stretch's dump, over the stretch's iterations: the stand-in's counts per iteration.
    counts = {name: dict(zip(EVENTS, COUNTS[name])) for name in ("reference", "hand")}
    instructions, caches = out.split("simulated caches")
    assert "reference: a hand-written loop over pre-built batches, 100.0k instructions" in instructions, out
    row = next(line.split() for line in instructions.splitlines() if line.split()[:1] == ["hand"])
    assert row[1:] == ["150.0", "1.500", "+0.0"], out
    rows = {line.split()[0]: line.split()[1:] for line in caches.splitlines() if line.split()[:1] in (["reference"], ["hand"])}
    cycles = {name: c["Ir"] + 10 * (c["I1mr"] + c["D1mr"] + c["D1mw"]) + 100 * (c["ILmr"] + c["DLmr"] + c["DLmw"])
              for name, c in counts.items()}
    for name, c in counts.items():
        assert rows[name][:5] == [f"{c['I1mr']}", f"{c['D1mr'] + c['D1mw']}", f"{c['ILmr'] + c['DLmr'] + c['DLmw']}",
                                  f"{cycles[name] / 1e3:.1f}", f"{cycles[name] / cycles['reference']:.3f}"], out
    assert rows["hand"][5] == "+0.0" and len(rows["reference"]) == 5, out
    # The stretch's profile is kept, for callgrind_annotate.
    profile = (tmp_path / "profiles" / "callgrind.out.hand").read_text()
    assert "part: 2" in profile and "Trigger: --dump-before=getsid" in profile


# Real valgrind runs torch's import ~50x slower: minutes, not a test's
# seconds (the stand-in test above covers the script's code in seconds).
# CI runs it (CI is set there); elsewhere: TREADLE_TEST_VALGRIND=1 python -m pytest -k instructions
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="--instructions runs the systems under valgrind")
@pytest.mark.skipif(not (os.environ.get("TREADLE_TEST_VALGRIND") or os.environ.get("CI")),
                    reason="minutes under valgrind; CI runs it, elsewhere set TREADLE_TEST_VALGRIND=1")
def test_peers_benchmark_counts_instructions_and_cache_misses_over_the_steady_stretch(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--instructions", "--cache-sim", "--iters", "30",
         "--systems", "hand", "--profiles", str(tmp_path)],
        capture_output=True, text=True, timeout=1500, check=True,
    ).stdout
    instructions, caches = out.split("simulated caches")
    reference = float(re.search(r"pre-built batches, ([\d.]+)k instructions", instructions).group(1))
    row = next(line.split() for line in instructions.splitlines() if line.split()[:1] == ["hand"])
    per_iter, ratio = float(row[1]), float(row[2])
    # The hand-written loop over a DataLoader does the reference's work and the loader's.
    assert per_iter > reference > 0, out
    assert ratio == pytest.approx(per_iter / reference, abs=1e-3), out
    # The cache table: misses per iteration and cycles estimated from them and the instructions.
    rows = {line.split()[0]: [float(x) for x in line.split()[1:6]] for line in caches.splitlines()
            if line.split()[:1] in (["reference"], ["hand"])}
    assert sorted(rows) == ["hand", "reference"], out
    for name, instr in (("reference", reference), ("hand", per_iter)):
        l1i, l1d, l2, cycles, _ = rows[name]
        assert l1i > 0 and l1d > 0 and l2 > 0, out
        assert cycles == pytest.approx(instr + 10 * (l1i + l1d) / 1e3 + 100 * l2 / 1e3, abs=0.2), out
    assert rows["hand"][4] == pytest.approx(rows["hand"][3] / rows["reference"][3], abs=1e-3), out
    assert rows["hand"][3] > rows["reference"][3], out
    # Each system's profile of the stretch alone is kept, for callgrind_annotate.
    profile = (tmp_path / "callgrind.out.hand").read_text()
    assert "part: 2" in profile and "Trigger: --dump-before=getsid" in profile
    assert "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw" in profile


def test_peers_benchmark_takes_cache_sim_only_with_instructions():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--cache-sim"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--cache-sim and --profiles go with --instructions" in proc.stderr, proc.stderr


def test_gpu_benchmarks_say_in_one_line_that_they_need_cuda():
    """On a machine without CUDA (as every test but the gpu ones sees it) the
    GPU benchmarks and the checkpoint benchmark's --device cuda stop with one line."""
    for script in ("gpu.py", "gpu_compiled.py"):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode != 0 and proc.stderr.strip() == f"benchmarks/{script} needs a CUDA device; none is visible here"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "checkpoint.py"), "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("--device cuda needs a CUDA device and --processes 1")


def test_gpu_benchmark_cpu_check_trains_every_system_it_can_to_the_hand_loops_weights():
    """The GPU benchmark's systems run here before a lent GPU's short time:
    each that needs no CUDA trains on the CPU to weights equal to the hand
    loop's (the peers where installed)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--cpu-check", "--iters", "30"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)  # system, same
    expected = {"hand", "hand-log", "treadle-bare", "treadle-hooks", "treadle-trainer"}
    for system, package in (("accelerate-log", "accelerate"), ("lightning-log", "lightning")):
        if importlib.util.find_spec(package) is not None:
            expected.add(system)
    assert checked == {system: "True" for system in expected}


def test_gpu_benchmark_cpu_check_refuses_the_timed_tables_settings():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--cpu-check", "--rounds", "3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "--cpu-check times nothing: --rounds and --no-compile go with the timed table")
