"""Scalars, images and the config of a run, logged to Weights & Biases (rule: see ``writer``)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from .storage import get_event_storage
from .tracking import BackgroundSender, import_extra
from .writer import IterationRowWriter

__all__ = ["WandbWriter"]

logger = logging.getLogger(__name__)


class WandbWriter(IterationRowWriter):
    """Logs the run's scalars to Weights & Biases.

    The points are those ``metrics.json`` gets, logged with ``run.log(...,
    step=iteration)``, one call per iteration; images put with ``put_image``
    as ``wandb.Image`` at their iteration; ``config`` (e.g. the flattened
    config) as the run's config.

    ``mode="offline"`` writes the run to ``{dir}/wandb/offline-run-*`` (sync
    it later with ``wandb sync``); ``"online"`` sends it to the W&B server.
    As with :class:`~treadle.events.MLflowWriter`, the W&B calls run in a
    background thread: a slow or unreachable server never stops training
    (W&B queues what it cannot send), and :meth:`close` waits up to
    ``timeout`` seconds at the end.

    Resume: the W&B run id is part of the writer's state, saved in the
    checkpoints; a resumed job reopens that run (``resume="allow"``) and skips
    the steps the run already has (W&B's ``run.step``), so that no step is
    logged twice.

    The ``wandb`` package is an optional extra: ``pip install "treadle[wandb]"``.

    Args:
        project: the W&B project.
        name: the run's display name.
        mode: ``"online"``, ``"offline"`` or ``"disabled"``.
        dir: where W&B keeps its files (``wandb/`` is created inside).
        entity, tags, group: passed to ``wandb.init``.
        config: logged as the run's config.
        window_size: median window of smoothed training scalars.
        timeout: seconds :meth:`close` waits for what is queued.
    """

    def __init__(
        self,
        project: Optional[str] = None,
        name: Optional[str] = None,
        mode: str = "online",
        *,
        dir: Optional[str] = None,
        entity: Optional[str] = None,
        tags: Optional[Sequence[str]] = None,
        group: Optional[str] = None,
        config: Optional[Mapping[str, Any]] = None,
        window_size: int = 20,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(window_size)
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"WandbWriter mode must be 'online', 'offline' or 'disabled', got {mode!r}")
        import_extra("wandb", "wandb", "WandbWriter")
        self.project = project
        self.name = name
        self.mode = mode
        self.dir = dir
        self.entity = entity
        self.tags = list(tags) if tags else None
        self.group = group
        self.config = dict(config or {})
        self.timeout = timeout
        self.run_id: Optional[str] = None
        self._run: Any = None
        self._sender = BackgroundSender("WandbWriter")
        self._lock = threading.Lock()
        self._rows: List[Tuple[int, Dict[str, Any]]] = []
        self._last_step = -1  # the last step the W&B run has

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """``{"run_id": ...}``: saved in checkpoints, so that a resume continues this W&B run."""
        if self.run_id is None and self._rows:
            self._sender.drain(self.timeout)  # the run is being opened in the background
        return {"run_id": self.run_id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("run_id"):
            self.run_id = str(state["run_id"])

    # ------------------------------------------------------------------ writing
    def write(self) -> None:
        if self._main_process is not True and self._only_reads_here():  # not the main process (a call only until known)
            return
        storage = get_event_storage()
        rows = self._new_rows(storage)
        images: Dict[int, Dict[str, Any]] = {}
        for name, img, it in storage.images:
            images.setdefault(it, {})[name] = img.detach().cpu()
        merged: Dict[int, Dict[str, Any]] = {it: dict(values) for it, values in rows.items()}
        for it, named in images.items():
            merged.setdefault(it, {}).update({name: ("image", img) for name, img in named.items()})
        if merged:
            with self._lock:
                self._rows += sorted(merged.items())
            self._sender.submit(self._send)
        self._commit(rows)

    def close(self) -> None:
        if self._run is None and not self._rows:
            return
        self._sender.submit(self._send)
        self._sender.submit(self._finish)
        if not self._sender.drain(self.timeout):
            logger.warning("WandbWriter: W&B did not take everything within %.0f s.", self.timeout)

    # ------------------------------------------------------------------ background
    def _open(self) -> Any:
        if self._run is None:
            import wandb

            self._run = wandb.init(
                project=self.project,
                name=self.name,
                mode=cast(Any, self.mode),  # one of wandb's, checked when the writer was made
                dir=self.dir,
                entity=self.entity,
                tags=self.tags,
                group=self.group,
                config=self.config or None,
                id=self.run_id,
                resume="allow" if self.run_id else None,
                reinit="create_new",
            )
            self.run_id = self._run.id
            # A reopened run continues after the steps it has.
            self._last_step = max(int(getattr(self._run, "step", 0) or 0) - 1, -1)
        return self._run

    def _send(self) -> None:
        run = self._open()
        import wandb

        with self._lock:
            rows = list(self._rows)
        for step, values in rows:
            if step > self._last_step:
                payload = {k: wandb.Image(v[1].numpy().transpose(1, 2, 0) if v[1].ndim == 3 else v[1].numpy())
                           if isinstance(v, tuple) else v for k, v in values.items()}
                run.log(payload, step=step)
                self._last_step = step
        with self._lock:
            del self._rows[: len(rows)]

    def _finish(self) -> Any:
        if self._run is None:  # never opened: nothing was said to the server
            return BackgroundSender.NOTHING_SENT
        self._run.finish()
        self._run = None
        return None
