"""A stand-in for ``valgrind --tool=callgrind``, for the test of
``benchmarks/peers.py --instructions`` (real valgrind runs torch's import
~50x slower: minutes, where a test of a benchmark gets seconds).

It runs the measured command as it is (the real ``--child ... --bounded``
process) and writes what callgrind would with ``--dump-before=getsid``: a
dump up to the stretch (``.1``), one of the stretch (``.2``) and the rest
(the file itself), each with callgrind's ``events:`` and ``summary:`` lines.
The stretch's counts are known ones (``COUNTS``, per iteration, times the
stretch the child reports), so that the test can check the table the
benchmark prints from them. Its own command line and environment go to
``$VALGRIND_STAND_IN_LOG`` (one JSON object a line)."""

import json
import os
import subprocess
import sys

EVENTS = ["Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw"]
# Per iteration of the stretch, by the system after --child.
COUNTS = {
    "reference": [100_000, 40_000, 20_000, 50, 300, 100, 5, 20, 10],
    "hand": [150_000, 60_000, 30_000, 120, 500, 200, 8, 30, 15],
}


def main(argv):
    first = next(i for i, a in enumerate(argv) if not a.startswith("--"))
    options, command = argv[:first], argv[first:]
    with open(os.environ["VALGRIND_STAND_IN_LOG"], "a") as log:
        log.write(json.dumps({"options": options, "command": command,
                              "env": {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "OMP_NUM_THREADS",
                                                                       "CUDA_VISIBLE_DEVICES")}}) + "\n")
    out = next(a.split("=", 1)[1] for a in options if a.startswith("--callgrind-out-file="))
    proc = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        return proc.returncode
    stretch = json.loads(proc.stdout.strip().splitlines()[-1])["stretch"]
    system = command[command.index("--child") + 1]
    events = EVENTS if "--cache-sim=yes" in options else EVENTS[:1]
    for part, (path, counts) in enumerate([(out + ".1", [7] * len(events)),
                                           (out + ".2", [c * stretch for c in COUNTS[system][:len(events)]]),
                                           (out, [3] * len(events))], start=1):
        with open(path, "w") as f:
            trigger = "Program termination" if path == out else "--dump-before=getsid"
            f.write(f"# callgrind format\nversion: 1\ncreator: valgrind stand-in\npart: {part}\n"
                    f"Trigger: {trigger}\n\nevents: {' '.join(events)}\n"
                    f"summary: {' '.join(str(c) for c in counts)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
