"""MLflow and Weights & Biases writers against their real clients: an MLflow
tracking server in a subprocess (kill -9 and resume: every step once, in the
same run; the server stopped mid-run: training finishes), W&B offline (its
run file holds the history)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest

from treadle.engine.launch import find_free_port

REPO = Path(__file__).resolve().parents[2]
TRAIN_NET = str(REPO / "tools" / "train_net.py")
FAULTS_CONFIG = str(REPO / "tests" / "dist_scripts" / "digits_faults.py")
TIMEOUT = 180
JOB = [
    "--config-file", FAULTS_CONFIG, "model.model.dropout=0.0", "train.max_iter=40", "lr_multiplier.warmup_iters=5",
    "train.checkpointer.period=10", "train.log_period=5", "train.eval_period=0",
]


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _MlflowServer:
    """An MLflow tracking server in a subprocess, started when first asked
    for and shared by the module's tests (its start is several seconds of
    imports and database migrations); started again when a test stopped it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.server = None
        self.uri = ""
        self.starts = 0

    def __call__(self):
        if self.server is None or self.server.poll() is not None:
            self._start()
        return self.uri, self.server

    def _start(self) -> None:
        self.stop()
        self.starts += 1
        store = self.folder / f"mlflow-store-{self.starts}"
        store.mkdir()
        self.log_path = self.folder / f"mlflow-server-{self.starts}.log"
        self.log = open(self.log_path, "w")
        port = find_free_port()
        self.server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{store}/mlflow.db", "--default-artifact-root", str(store / "artifacts"),
             "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True,
        )
        self.uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if self.server.poll() is not None or time.monotonic() > deadline:
                self.log.close()
                pytest.fail(f"mlflow server did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.server is None:
            return
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        self.log.close()
        self.server = None


@pytest.fixture(scope="module")
def mlflow_servers(tmp_path_factory):
    pytest.importorskip("mlflow")
    servers = _MlflowServer(tmp_path_factory.mktemp("mlflow"))
    yield servers
    servers.stop()


@pytest.fixture
def mlflow_server(mlflow_servers):
    """``(uri, server process)`` of a running tracking server (each test uses its own experiment or run)."""
    return mlflow_servers()


def _train_net(run: Path, *args: str, expect_rc: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, TRAIN_NET, *JOB, *args, f"train.output_dir={run}"], cwd=REPO,
                            env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == expect_rc, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _metrics(run: Path) -> List[dict]:
    return [json.loads(line) for line in (run / "metrics.json").read_text().splitlines()]


def _paused_then_killed(run: Path, at: int, *args: str) -> None:
    marker = run.parent / f"{run.name}-paused"
    log = open(run.parent / f"{run.name}-first.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, TRAIN_NET, *JOB, *args, "model.rank=0", f"model.pause_at_iter={at}",
         f"model.pause_marker={marker}", f"train.output_dir={run}"],
        cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():
            assert proc.poll() is None, (run.parent / f"{run.name}-first.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "the job did not reach its pause"
            time.sleep(0.05)
        time.sleep(1.0)  # the background sender delivers what the flushes before the pause queued
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def test_mlflow_gets_every_step_once_across_a_kill_9_and_resume(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, _ = mlflow_server
    run = tmp_path / "run"
    tracking = [f"train.writers.mlflow.tracking_uri={uri}", "train.writers.mlflow.experiment_name=digits",
                "train.writers.mlflow.run_name=first", "train.writers.mlflow.log_model=True"]
    # Killed at iteration 27: checkpoint 19 is the resume point, and MLflow
    # already has the steps the job flushed after it (24).
    _paused_then_killed(run, 27, *tracking)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("digits")
    (first,) = client.search_runs([experiment.experiment_id])
    assert max(m.step for m in client.get_metric_history(first.info.run_id, "total_loss")) == 24

    _train_net(run, "--resume", *tracking)
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [first.info.run_id], "the resumed job continued the same MLflow run"
    lines = _metrics(run)
    for key in ("total_loss", "lr"):
        history = client.get_metric_history(first.info.run_id, key)
        steps = [m.step for m in history]
        expected = [line["iteration"] for line in lines if key in line]
        assert sorted(steps) == expected, f"{key}: each flushed step exactly once"
        values = {m.step: m.value for m in history}
        for line in lines:
            if key in line:
                assert values[line["iteration"]] == pytest.approx(line[key], rel=1e-12, abs=0.0), (key, line)
    final = client.get_run(first.info.run_id)
    assert final.info.status == "FINISHED"
    assert final.data.params["train.max_iter"] == "40"
    artifacts = [a.path for a in client.list_artifacts(first.info.run_id)]
    assert "model_final.pth" in artifacts


def test_training_finishes_when_the_mlflow_server_stops(mlflow_server, tmp_path):
    uri, server = mlflow_server
    run = tmp_path / "run"
    marker = tmp_path / "paused"
    log = open(tmp_path / "job.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, TRAIN_NET, *JOB, f"train.writers.mlflow.tracking_uri={uri}", "model.rank=0",
         "model.pause_at_iter=12", f"model.pause_marker={marker}", f"train.output_dir={run}"],
        cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        assert proc.poll() is None, (tmp_path / "job.txt").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(server.pid, signal.SIGKILL)  # the tracking server goes away mid-run
    server.wait(timeout=30)
    marker.unlink()  # the job goes on
    assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "job.txt").read_text()[-3000:]
    log.close()
    output = (tmp_path / "job.txt").read_text()
    assert "MLflowWriter: the tracking server is unreachable" in output
    assert [line["iteration"] for line in _metrics(run) if "total_loss" in line] == list(range(4, 40, 5))
    assert (run / "model_final.pth").exists()


def test_wandb_offline_run_holds_the_logged_history(tmp_path):
    pytest.importorskip("wandb")
    run = tmp_path / "run"
    _train_net(run, "train.writers.wandb.project=digits", "train.writers.wandb.mode=offline")
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, list((run / "wandb").iterdir())
    history = _wandb_history(next(offline[0].glob("*.wandb")))
    steps = [row["_step"] for row in history if "total_loss" in row]
    lines = _metrics(run)
    assert steps == [line["iteration"] for line in lines if "total_loss" in line]
    for row, line in zip([r for r in history if "total_loss" in r], [line for line in lines if "total_loss" in line]):
        assert row["total_loss"] == pytest.approx(line["total_loss"], rel=1e-12)


def _wandb_history(path: Path) -> List[dict]:
    """The history records of a W&B run file: the file is a LevelDB-style log
    of wandb's own protobuf ``Record`` messages (after a 7-byte ``:W&B``
    header, 32 KiB blocks of chunks with a 7-byte header: CRC, length,
    type), decoded with wandb's ``wandb_internal_pb2``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    block, offset, pending, records = 32768, 7, b"", []
    while offset + 7 <= len(data):
        left = block - offset % block
        if left < 7:  # the rest of a block too small for a chunk header is padding
            offset += left
            continue
        length = int.from_bytes(data[offset + 4 : offset + 6], "little")
        kind = data[offset + 6]
        if kind == 0 and length == 0:
            break
        pending += data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            records.append(pending)
            pending = b""
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def test_a_tracker_without_its_library_is_a_one_line_error(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    from treadle.tools.train_net import cli

    code = cli([f"train.output_dir={tmp_path / 'run'}", "train.writers.mlflow.tracking_uri=http://127.0.0.1:1"])
    assert code == 2
    assert not (tmp_path / "run").exists()


def test_the_missing_extra_is_named(monkeypatch):
    import builtins

    from treadle.events import MLflowWriter, WandbWriter
    from treadle.events.tracking import MissingExtraError

    real_import = builtins.__import__

    def no_trackers(name, *args, **kwargs):
        if name.split(".")[0] in ("mlflow", "wandb"):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_trackers)
    for module in ("mlflow", "wandb"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingExtraError, match=r'MLflowWriter needs the \'mlflow\' package.*pip install "treadle\[mlflow\]"'):
        MLflowWriter()
    with pytest.raises(MissingExtraError, match=r'pip install "treadle\[wandb\]"'):
        WandbWriter(project="p", mode="offline")


def test_importing_treadle_does_not_import_the_trackers():
    code = "import sys, treadle, treadle.engine, treadle.events, treadle.tools.train_net; print('mlflow' in sys.modules, 'wandb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["False", "False"]


# mlflow's own SQLAlchemy store uses a loader SQLAlchemy deprecates; Python
# hides a DeprecationWarning raised outside __main__ from users, pytest does not.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
def test_mlflow_logs_images_and_params_to_a_local_store(tmp_path):
    """In process, against a local sqlite store: scalars at their iterations,
    an image as an artifact, the params once; close() ends the run."""
    pytest.importorskip("mlflow")
    import torch
    from mlflow.tracking import MlflowClient

    from treadle.events import EventStorage, MLflowWriter

    uri = f"sqlite:///{tmp_path}/store.db"
    # Artifacts under tmp_path: a sqlite store otherwise puts them in ./mlruns.
    MlflowClient(tracking_uri=uri).create_experiment("local", artifact_location=str(tmp_path / "artifacts"))
    writer = MLflowWriter(uri, "local", "images", {"team": "vision"}, params={"model.width": 64}, window_size=1)
    with EventStorage(0) as storage:
        for it in range(3):
            storage.iter = it
            storage.put_scalar("loss", float(it) + 0.5)
            if it == 1:
                storage.put_image("samples", torch.rand(3, 8, 8))
            writer.write()
            storage.clear_images()
    writer.close()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(writer.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "images"
    assert run.data.params == {"model.width": "64"} and run.data.tags["team"] == "vision"
    assert [(m.step, m.value) for m in client.get_metric_history(writer.run_id, "loss")] == [(0, 0.5), (1, 1.5), (2, 2.5)]
    artifacts = [a.path for a in client.list_artifacts(writer.run_id)]
    assert any("image" in path for path in artifacts), artifacts
    assert any((tmp_path / "artifacts").rglob("*.png")), "the image is a file of the experiment's artifact store"


class _DownClient:
    """An MLflow client whose server was never up: every call fails."""

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise ConnectionError("Connection refused")

        return call


def test_a_tracking_server_never_reached_is_never_said_to_be_reachable_again(tmp_path, treadle_caplog):
    # The calls with nothing to send (no run to finish, no model to log) say
    # nothing about the server: they must not end the outage.
    pytest.importorskip("mlflow")
    from treadle.events import EventStorage, MLflowWriter

    model = tmp_path / "model_final.pth"
    writer = MLflowWriter("http://127.0.0.1:1", log_model=str(model), window_size=1, timeout=5)
    writer._client = _DownClient()
    with EventStorage(0) as storage:
        for it in range(3):
            storage.iter = it
            storage.put_scalar("loss", float(it))
            writer.write()
    model.write_bytes(b"weights")
    writer.close()
    assert writer.run_id is None
    assert treadle_caplog.text.count("the tracking server is unreachable") == 1
    assert "reachable again" not in treadle_caplog.text and "reachable now" not in treadle_caplog.text
    assert "3 point(s) could not be sent" in treadle_caplog.text


def test_the_sender_says_again_only_after_the_server_was_reached(treadle_caplog):
    from treadle.events.tracking import BackgroundSender

    def down():
        raise ConnectionError("Connection refused")

    sender = BackgroundSender("Tracker")
    try:
        for fn in (down, lambda: BackgroundSender.NOTHING_SENT, lambda: None, down, lambda: None):
            sender.submit(fn)
        assert sender.drain(10)
    finally:
        sender.close()
    said = [r.getMessage() for r in treadle_caplog.records if "reachable" in r.getMessage()]
    assert [m.split(": the tracking server is ")[1][:16] for m in said] == [
        "unreachable or r", "reachable now.", "unreachable or r", "reachable again.",
    ]
