#!/usr/bin/env bash
# The checks only a CUDA machine can run, in one go (a lent GPU's time is
# short): by default, in under 5 minutes, the GPU tests (fp16 with a
# GradScaler, CompiledStep with CUDA graphs, no host synchronisation between
# flushes nor at a deferred flush, whose rows equal a waiting flush's,
# asynchronous checkpoints) and the GPU benchmark's table (treadle, the hand
# loops and the peers installed: lightning, accelerate). On request, the
# checkpoint benchmark with the state on the GPU and the whole fast test
# suite on a machine where device="auto" picks the GPU.
#
# Run from the repository root: bash benchmarks/gpu_checks.sh
# Logs go to $OUT (default /tmp/gpu_checks); PYTHON picks the interpreter
# (default python3); CHECKPOINT_DIR the checkpoint benchmark's folder
# (default /dev/shm: the stall, not the disk, is its figure here);
# SUITE_SECONDS bounds the whole-suite run (default 150); ROUNDS the GPU
# benchmark's rounds (default 3); CHECKS picks what runs (default "tests
# bench"; "checkpoint" and "suite" add those two; "compiled" adds
# benchmarks/gpu_compiled.py, CompiledStep's time taken apart; "cpu" adds
# benchmarks/peers.py --paired on the machine's CPU cores, one process per
# core, at the 0.3 ms and at a ~3 ms step, and --interleaved at the ~3 ms
# step: a GPU server's many cores are a
# quieter host for issue 16's comparison than a small shared VM).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_checks}
PYTHON=${PYTHON:-python3}
CHECKPOINT_DIR=${CHECKPOINT_DIR:-/dev/shm}
SUITE_SECONDS=${SUITE_SECONDS:-150}
ROUNDS=${ROUNDS:-3}
CHECKS=" ${CHECKS:-tests bench} "
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c "import torch, treadle; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())" || exit 1

if [[ $CHECKS == *" tests "* ]]; then
    echo "== GPU tests (pytest -m gpu)"
    "$PYTHON" -m pytest -q -rs -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" || status=1
fi
if [[ $CHECKS == *" bench "* ]]; then
    echo "== benchmarks/gpu.py"
    "$PYTHON" benchmarks/gpu.py --rounds "$ROUNDS" 2>&1 | tee "$OUT/gpu_bench.log" || status=1
fi
if [[ $CHECKS == *" compiled "* ]]; then
    echo "== benchmarks/gpu_compiled.py"
    "$PYTHON" benchmarks/gpu_compiled.py 2>&1 | tee "$OUT/gpu_compiled.log" || status=1
fi
if [[ $CHECKS == *" cpu "* ]]; then
    # Several processes at once, so that the comparison fits a short lease;
    # each pinned to a core of its own so that none shares a core or
    # migrates; two cores left for the machine's own work. Nothing else of
    # this script runs meanwhile.
    jobs=$("$PYTHON" -c "import sys; sys.path.insert(0, 'benchmarks'); import peers; print(max(1, min(6, len(peers.physical_cores()) - 2)))")
    echo "== benchmarks/peers.py --paired on the CPU, $jobs processes at a time"
    "$PYTHON" benchmarks/peers.py --paired --jobs "$jobs" --rounds 9 \
        --systems treadle-bare treadle-hooks treadle-trainer 2>&1 | tee "$OUT/cpu_paired.log" || status=1
    # Width 6144: a ~3 ms step on a server core (4096 gave ~1.9 ms on an H200 machine's Xeon).
    "$PYTHON" benchmarks/peers.py --paired --jobs "$jobs" --rounds 6 --pairs 2 --iters 1000 --width 6144 \
        --systems treadle-bare treadle-hooks treadle-trainer 2>&1 | tee -a "$OUT/cpu_paired.log" || status=1
    # Both steps again taking turns an iteration each with hand (resolves
    # what runs seconds apart do not), with the control and the known +30 us.
    "$PYTHON" benchmarks/peers.py --interleaved --jobs "$jobs" --rounds 12 \
        --systems hand hand-plus-30us treadle-bare treadle-hooks treadle-trainer 2>&1 \
        | tee -a "$OUT/cpu_paired.log" || status=1
    "$PYTHON" benchmarks/peers.py --interleaved --jobs "$jobs" --rounds 24 --iters 900 --warmup 300 --width 6144 \
        --systems hand hand-plus-30us treadle-bare treadle-hooks treadle-trainer 2>&1 \
        | tee -a "$OUT/cpu_paired.log" || status=1
fi
if [[ $CHECKS == *" checkpoint "* ]]; then
    echo "== benchmarks/checkpoint.py --device cuda"
    "$PYTHON" benchmarks/checkpoint.py --device cuda --processes 1 --sizes 25 300 --repeats 2 --dir "$CHECKPOINT_DIR" 2>&1 \
        | tee "$OUT/checkpoint.log" || status=1
fi
if [[ $CHECKS == *" suite "* ]]; then
    # Every other test runs as on a machine without a GPU (tests/conftest.py):
    # this shows that the suite passes on a GPU machine too.
    echo "== the fast suite on this GPU machine (at most ${SUITE_SECONDS}s)"
    workers=$("$PYTHON" -c "import os; print(max(1, min(14, (os.cpu_count() or 2) - 2)))")
    # -v names each result as it comes: a run cut short by the timeout still names its failures.
    timeout "$SUITE_SECONDS" "$PYTHON" -m pytest -v -rfE -m "not slow and not gpu" -n "$workers" --tb=short \
        -p no:cacheprovider tests >"$OUT/suite.log" 2>&1 || status=1
    grep -E "(FAILED|ERROR) tests/|[0-9]+ (passed|failed)" "$OUT/suite.log" | sort -u | tail -n 60
fi
exit $status
