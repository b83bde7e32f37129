"""Scalars, images and the config of a run, logged to MLflow (rule: see ``writer``)."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .storage import get_event_storage
from .tracking import BackgroundSender, chunks, import_extra
from .writer import IterationRowWriter

__all__ = ["MLflowWriter"]

logger = logging.getLogger(__name__)

# MLflow's key alphabet: letters, digits, _ - . space : /
_BAD_KEY_CHARS = re.compile(r"[^\w\-. :/]")
_METRICS_PER_CALL = 1000  # MLflow's limits of one log_batch call
_PARAMS_PER_CALL = 100
_PARAM_LENGTH = 6000


class MLflowWriter(IterationRowWriter):
    """Logs the run's scalars to an MLflow tracking server or local store.

    Scalars follow the rule of the ``writer`` module (the points
    ``metrics.json`` gets, each with its iteration as MLflow's ``step``);
    images put with ``put_image`` are logged with ``log_image`` at their
    iteration; ``params`` (e.g. the flattened config) are logged once, when
    the run is created; with ``log_model``, that file (``model_final.pth``) is
    logged as an artifact when the writer closes after training, if training
    wrote it.

    Training never waits for MLflow: every call to the server runs in a
    background thread, in order. When the server is down or refuses a call,
    a warning is logged once, the points are kept and sent again at the next
    flush; nothing of ``metrics.json`` depends on it. At the end
    (:meth:`close`) the writer waits up to ``timeout`` seconds for what is
    queued and says how many points could not be sent.

    Resume: the MLflow run's id is part of the writer's state, saved in the
    checkpoints (through :class:`~treadle.hooks.PeriodicWriter`). A resumed
    run logs into the same MLflow run and skips, per key, the steps that run
    already has (those the interrupted job logged after its checkpoint), so
    that every step is logged exactly once.

    Main process only, like every writer (``DefaultTrainer.build_writers``).
    The ``mlflow`` package is an optional extra: ``pip install "treadle[mlflow]"``.

    Args:
        tracking_uri: ``http://host:port``, a ``file:`` or database URI;
            ``None``: MLflow's default (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``).
        experiment_name: created when missing; ``None``: MLflow's default experiment.
        run_name: the run's display name.
        tags: ``{name: value}`` set on the run.
        params: ``{name: value}`` logged as the run's parameters (values as text).
        log_model: a file to log as an artifact at the end of training.
        window_size: median window of smoothed training scalars.
        timeout: seconds a server call may take, and :meth:`close` waits.
    """

    def __init__(
        self,
        tracking_uri: Optional[str] = None,
        experiment_name: Optional[str] = None,
        run_name: Optional[str] = None,
        tags: Optional[Mapping[str, Any]] = None,
        *,
        params: Optional[Mapping[str, Any]] = None,
        log_model: Optional[str] = None,
        window_size: int = 20,
        timeout: float = 10.0,
    ) -> None:
        super().__init__(window_size)
        import_extra("mlflow", "mlflow", "MLflowWriter")
        # A call to a server that is down fails fast instead of retrying for
        # minutes (only where the user has not chosen otherwise).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(max(timeout, 1))))
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.params = {str(k): str(v)[:_PARAM_LENGTH] for k, v in (params or {}).items()}
        self.log_model = log_model
        self.timeout = timeout
        self.run_id: Optional[str] = None
        self._client: Any = None
        self._sender = BackgroundSender("MLflowWriter")
        self._lock = threading.Lock()
        # (key, value, step) and (name, HWC array, step) not yet accepted by the server.
        self._points: List[Tuple[str, float, int]] = []
        self._images: List[Tuple[str, Any, int]] = []
        self._created: Optional[Any] = None  # the future of the run's creation
        self._resumed = False
        self._logged_through: Dict[str, int] = {}  # per key, the last step the resumed run already has
        self._started_at = time.time()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """``{"run_id": ...}``: saved in checkpoints, so that a resume continues this MLflow run."""
        if self.run_id is None and self._created is not None:
            try:  # the run is being created in the background: a checkpoint needs its id
                self._created.result(timeout=self.timeout)
            except Exception:  # noqa: BLE001 - a timeout: the checkpoint goes without it
                pass
        return {"run_id": self.run_id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        run_id = state.get("run_id")
        if run_id:
            self.run_id = str(run_id)
            self._resumed = True

    # ------------------------------------------------------------------ writing
    def write(self) -> None:
        if self._main_process is not True and self._only_reads_here():  # not the main process (a call only until known)
            return
        storage = get_event_storage()
        rows = self._new_rows(storage)
        images = [(name, _image_hwc(img), it) for name, img, it in storage.images]
        if rows or images:
            with self._lock:
                self._points += [(_key(name), float(v), it) for it, scalars in rows.items() for name, v in scalars.items()]
                self._images += images
            if self._created is None:
                self._created = self._sender.submit(self._ensure_run)
            self._sender.submit(self._send)
        self._commit(rows)

    def close(self) -> None:
        if self._created is None:
            return
        self._sender.submit(self._send)
        if self.log_model:
            self._sender.submit(self._log_model)
        self._sender.submit(self._finish)
        if not self._sender.drain(self.timeout):
            logger.warning("MLflowWriter: the tracking server did not take everything within %.0f s.", self.timeout)
        with self._lock:
            left = len(self._points) + len(self._images)
        if left:
            logger.warning(
                "MLflowWriter: %d point(s) could not be sent to %s; they are in metrics.json.",
                left, self.tracking_uri or "the MLflow tracking store",
            )

    # ------------------------------------------------------------------ background
    def _client_or_new(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _ensure_run(self) -> None:
        client = self._client_or_new()
        if self.run_id is not None:
            if self._resumed:
                client.update_run(self.run_id, status="RUNNING")
            return
        experiment_id = "0"
        if self.experiment_name:
            experiment = client.get_experiment_by_name(self.experiment_name)
            experiment_id = (
                experiment.experiment_id if experiment is not None else client.create_experiment(self.experiment_name)
            )
        run = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags or None)
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        for batch in chunks([Param(k, v) for k, v in sorted(self.params.items())], _PARAMS_PER_CALL):
            client.log_batch(self.run_id, params=batch)
        logger.info("MLflowWriter: logging to run %s (%s)", self.run_id, self.tracking_uri or "default store")

    def _send(self) -> None:
        if self.run_id is None:
            self._ensure_run()  # raises while the server is down: retried at the next flush
        from mlflow.entities import Metric

        client = self._client_or_new()
        with self._lock:
            points, images = list(self._points), list(self._images)
        fresh = [p for p in points if p[2] > self._already_logged(client, p[0])]
        now = int(time.time() * 1000)
        for batch in chunks([Metric(k, v, now, step) for k, v, step in fresh], _METRICS_PER_CALL):
            client.log_batch(self.run_id, metrics=batch)
        with self._lock:
            del self._points[: len(points)]
        for name, image, step in images:
            client.log_image(self.run_id, image, key=_key(name), step=step)
        with self._lock:
            del self._images[: len(images)]

    def _already_logged(self, client: Any, key: str) -> int:
        """The last step of ``key`` the run had when this job took it over (-1 for a new run)."""
        if not self._resumed:
            return -1
        if key not in self._logged_through:
            history = client.get_metric_history(self.run_id, key)
            self._logged_through[key] = max((m.step for m in history), default=-1)
        return self._logged_through[key]

    def _log_model(self) -> Any:
        path = self.log_model
        if not (path and os.path.isfile(path) and os.path.getmtime(path) >= self._started_at and self.run_id):
            return BackgroundSender.NOTHING_SENT
        self._client_or_new().log_artifact(self.run_id, path)
        return None

    def _finish(self) -> Any:
        if self.run_id is None:  # the run was never created: the server was never reached
            return BackgroundSender.NOTHING_SENT
        self._client_or_new().set_terminated(self.run_id)
        return None


def _key(name: str) -> str:
    return _BAD_KEY_CHARS.sub("_", name)


def _image_hwc(img: Any) -> Any:
    """A CHW (or HW) tensor in [0, 1] or [0, 255], as an HWC numpy array."""
    array = img.detach().cpu().numpy() if hasattr(img, "detach") else img
    if array.ndim == 3 and array.shape[0] in (1, 3, 4):
        array = array.transpose(1, 2, 0)
    return array
