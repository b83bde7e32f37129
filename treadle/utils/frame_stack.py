"""Room on CPython's frame stack for a loop that calls deep code every iteration.

Since CPython 3.11 the frames of Python functions live on a stack of 16 KiB
chunks per thread. A call that does not fit in the current chunk gets a new
chunk (``mmap``), and the chunk is freed (``munmap``) as soon as the frame at
its start returns. A loop that sits just below a chunk boundary and calls
past it every iteration (a model's ``forward``, the optimizer's ``step``)
then maps, faults in and unmaps a chunk several times per iteration. Whether
it does depends only on how deep the loop happens to be called from: on the
development machine (a 2-core VM, where ``munmap`` is dear) the bare engine's
0.35 ms step took up to 0.6 ms at the worst depths, with ~18 page faults per
iteration, and the same at a depth a few frames away took 0.35 ms with none
(``python benchmarks/frame_depth.py``). The 2026 releases of CPython 3.13
and 3.14 keep one chunk back instead of unmapping it
(python/cpython#142183), which ends the mapping but not the crossing;
3.11, 3.12 and 3.13.0 (checked here) do not. Crossing no boundary at all
is what this module gives on every CPython from 3.11.

:func:`call_with_frame_room` runs a function in a frame that reserves room
above it, so that the loop and everything it calls fit in one chunk for as
long as it runs.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, TypeVar

__all__ = ["FRAME_ROOM_BYTES", "call_with_frame_room"]

_T = TypeVar("_T")

#: The room (bytes) :func:`call_with_frame_room` keeps free above the call:
#: ~2000 frames of the usual size; deep models (a transformer's nested
#: modules, gradient checkpointing) stay well inside it.
FRAME_ROOM_BYTES = 128 * 1024


def call_with_frame_room(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Returns ``fn(*args, **kwargs)``, called from a frame that starts a
    frame-stack chunk of its own with :data:`FRAME_ROOM_BYTES` free above it
    (on CPython 3.11 and later; elsewhere a plain call).

    The frame's evaluation stack is declared that large and never used:
    CPython sizes a frame by what its code declares and gives a frame that
    does not fit the current chunk a new chunk big enough for it (sizes
    double from 16 KiB), so ``fn``'s frames follow in the chunk's other half.
    The memory is reserved, not touched: only the pages the frames use are
    faulted in, once.
    """
    return fn(*args, **kwargs)


if sys.implementation.name == "cpython" and sys.version_info >= (3, 11):
    call_with_frame_room.__code__ = call_with_frame_room.__code__.replace(
        co_stacksize=call_with_frame_room.__code__.co_stacksize + FRAME_ROOM_BYTES // 8
    )
