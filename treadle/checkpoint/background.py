"""Background saves: one writer thread, at most one save in flight, its failure kept until asked for.

An asynchronous save copies the state to host memory (:func:`host_snapshot`)
and hands the write to a :class:`BackgroundWriter`; training goes on while
the thread writes. Whoever owns the writer asks :attr:`~BackgroundWriter.in_flight`
or :attr:`~BackgroundWriter.failed`, or waits (:meth:`~BackgroundWriter.wait`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional, Set, Tuple

import torch

from .serialization import CheckpointError, first_line

__all__ = ["BackgroundWriter", "host_snapshot"]


class BackgroundWriter:
    """Runs checkpoint writes in one background thread, one at a time.

    A write is submitted with the path it writes (for messages); the next
    :meth:`submit` waits for the previous write first, so at most one is in
    flight and files appear in the order they were saved. A write's failure
    is kept until :meth:`wait` or :meth:`raise_if_failed` raises it (once),
    as a :class:`CheckpointError` saying that the checkpoint was not written.
    """

    def __init__(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None
        # The last write submitted and not yet waited for: (path, future).
        self._pending: Optional[Tuple[str, "Future[None]"]] = None
        # Host copies of the state kept between saves (see host_snapshot).
        self._buffers: Dict[Tuple[Any, ...], torch.Tensor] = {}

    @property
    def in_flight(self) -> bool:
        """Whether a write is still running."""
        return self._pending is not None and not self._pending[1].done()

    @property
    def writing(self) -> Optional[str]:
        """The path of the write still running, or ``None``."""
        return self._pending[0] if self.in_flight else None  # type: ignore[index]

    @property
    def failed(self) -> Optional[CheckpointError]:
        """The failure of a finished write not yet raised by :meth:`wait` or
        :meth:`raise_if_failed`, or ``None`` (no write, one running, or one
        that succeeded). Asking does not clear it."""
        if self._pending is None or not self._pending[1].done():
            return None
        path, future = self._pending
        error = future.exception()
        return None if error is None else _background_failure(path, error)

    def snapshot(self, data: Any) -> Any:
        """``data`` copied to host memory for a write in the background,
        reusing the buffers of the previous snapshot (waits for the write in
        flight first: it may still read them)."""
        self.wait()
        return host_snapshot(data, self._buffers)

    def submit(self, path: str, write: Callable[..., None], *args: Any) -> None:
        """Runs ``write(*args)`` in the background thread, after waiting for
        the previous write (whose failure is raised here)."""
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-checkpoint")
        self._pending = (path, self._pool.submit(write, *args))

    def wait(self) -> None:
        """Waits for the write in flight, if any.

        Raises:
            CheckpointError: that write failed; its file was not written.
        """
        if self._pending is None:
            return
        path, future = self._pending
        self._pending = None
        error = future.exception()
        if error is not None:
            raise _background_failure(path, error) from error

    def raise_if_failed(self) -> None:
        """Raises the failure of a finished write without waiting for one
        still in flight (cheap enough to call every iteration)."""
        if self._pending is not None and self._pending[1].done():
            self.wait()


def _background_failure(path: str, error: BaseException) -> CheckpointError:
    if isinstance(error, CheckpointError):
        return CheckpointError(f"Background save failed: {error}")
    return CheckpointError(
        f"Background save of checkpoint '{path}' failed: {first_line(error)}. It was not written; "
        f"the previous checkpoint is the resume point."
    )


def host_snapshot(obj: Any, buffers: Optional[Dict[Tuple[Any, ...], torch.Tensor]] = None) -> Any:
    """A copy of ``obj`` whose tensors are copies in host memory, detached from
    training: what an asynchronous save writes while training goes on.

    ``buffers`` (path in ``obj`` -> tensor) keeps the copies between saves:
    a tensor of the same shape and dtype is copied into its previous buffer
    instead of freshly allocated memory, which is several times faster (no
    page faults) and keeps the host memory at one copy of the state. Kept
    copies of GPU tensors are in pinned memory, filled by copies issued
    together without waiting for each, then waited for once: on return
    every copy has landed, and training may change the originals.
    """
    devices: Set[torch.device] = set()
    copied = _snapshot(obj, buffers, (), devices)
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return copied


def _snapshot(obj: Any, buffers: Optional[Dict[Tuple[Any, ...], torch.Tensor]], key: Tuple[Any, ...],
              devices: Set[torch.device]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        on_host = tensor.device.type == "cpu"
        if buffers is None:
            return tensor.clone() if on_host else tensor.to("cpu")
        buffer = buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or tensor.is_sparse:
            if on_host or tensor.is_sparse or tensor.device.type != "cuda":
                buffer = tensor.clone() if on_host else tensor.to("cpu")
                buffers[key] = buffer
                return buffer
            buffer = buffers[key] = _pinned_like(tensor)
        if tensor.device.type == "cuda" and buffer.is_pinned():
            buffer.copy_(tensor, non_blocking=True)
            devices.add(tensor.device)
        else:
            buffer.copy_(tensor)
        return buffer
    if isinstance(obj, dict):
        copied = {k: _snapshot(v, buffers, key + (k,), devices) for k, v in obj.items()}
        return copied if type(obj) is dict else type(obj)(copied)  # an OrderedDict stays one
    if isinstance(obj, list):
        return [_snapshot(v, buffers, key + (i,), devices) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_snapshot(v, buffers, key + (i,), devices) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def _pinned_like(tensor: torch.Tensor) -> torch.Tensor:
    """An empty host tensor like ``tensor`` in pinned memory (copies from the
    GPU into it run at the link's full speed and need not wait one by one),
    or in ordinary memory where pinning is refused (a limit on locked memory)."""
    try:
        return torch.empty_like(tensor, device="cpu", pin_memory=True)
    except RuntimeError:
        return torch.empty_like(tensor, device="cpu")
