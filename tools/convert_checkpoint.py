#!/usr/bin/env python
"""Converts a treadle checkpoint between its two formats.

    python tools/convert_checkpoint.py output/run/model_0000999.dcp model_0000999.pth
    python tools/convert_checkpoint.py output/run/model_final.pth model_final.dcp

- A DCP directory (``train.checkpointer.format=dcp``, written by any number
  of ranks) becomes one file that a plain ``torch.load(weights_only=True)``
  reads: ``"model"`` holds the full tensors, each optimizer's state is in
  ``torch.optim.Optimizer``'s own format (integer ids in ``param_groups``
  order), and the trainer's state, schedulers and ``iteration`` are where a
  ``"file"`` checkpoint has them. It resumes a run like one.
- A ``.pth`` checkpoint becomes a DCP directory (the model as DCP items,
  everything else in one record), which resumes on any world size.

The input is verified first (checksums, weights-only reading: nothing in it
runs code); the output is written under a temporary name and renamed, and an
existing output is never replaced (remove it first). One process; the whole
state is held in memory once.

Exit status: 0 when the output is written; 1 for a problem with the input or
output (one line on stderr); 2 for bad command-line usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def convert(source: str, target: str) -> str:
    """Converts ``source`` (a ``.dcp`` directory or a ``.pth`` file) into
    ``target`` of the other format; returns what was done, in words.

    Raises:
        treadle.checkpoint.CheckpointError: unreadable or damaged input, an
            existing or unwritable output.
    """
    from treadle.checkpoint import CheckpointError, load_checkpoint_file
    from treadle.checkpoint import sharded
    from treadle.checkpoint.serialization import save_with_checksums
    from treadle.utils.atomic import atomic_write

    source = source.rstrip("/")
    target = target.rstrip("/")
    if os.path.exists(target):
        raise CheckpointError(f"'{target}' already exists; remove it or choose another name.")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise CheckpointError(f"The directory of '{target}' does not exist.")
    if os.path.isdir(source):
        if not sharded.is_dcp_checkpoint(source):
            raise CheckpointError(f"'{source}' is a directory without DCP's .metadata: not a DCP checkpoint.")
        state = sharded.dcp_to_file_state(sharded.read_dcp(source))
        try:
            atomic_write(target, lambda f: save_with_checksums(state, f))
        except OSError as e:
            raise CheckpointError(f"Cannot write '{target}': {e.strerror or e}.") from None
        return f"DCP directory '{source}' -> file '{target}' ({len(state.get('model', {}))} model tensors)"
    if not os.path.exists(source):
        raise CheckpointError(f"'{source}' does not exist.")
    checkpoint = load_checkpoint_file(source)
    partial = os.path.join(parent, f".{os.path.basename(target)}.partial")
    try:
        sharded.write_dcp(sharded.file_state_to_dcp(checkpoint), partial)
        sharded.publish(partial, target)
    except OSError as e:
        raise CheckpointError(f"Cannot write '{target}': {e.strerror or e}.") from None
    return f"file '{source}' -> DCP directory '{target}' ({len(checkpoint.get('model', {}))} model tensors)"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a .dcp checkpoint directory or a .pth checkpoint file")
    parser.add_argument("target", help="the file (from a directory) or directory (from a file) to write")
    args = parser.parse_args(argv)
    from treadle.checkpoint import CheckpointError

    try:
        print(convert(args.source, args.target))
    except CheckpointError as e:
        print(f"convert_checkpoint.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
