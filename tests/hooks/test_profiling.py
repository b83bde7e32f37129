import json
import os
import shutil
import tempfile

import pytest
import torch
from iopath.common.file_io import PathHandler

from tests.hooks.helpers import make_trainer
from treadle.hooks import (
    TorchMemoryStats,
    TorchProfiler,
)
from treadle.utils.file_io import PathManager


class _RemoteStore(PathHandler):
    """A non-local iopath backend (like s3://) storing under ``root``; like
    remote backends, get_local_path hands out a download cache, not the store."""

    PREFIX = "treadle-test-profiler://"

    def __init__(self, root, cache):
        super().__init__()
        self.root, self.cache = root, cache

    def _get_supported_prefixes(self):
        return [self.PREFIX]

    def _stored(self, path):
        return os.path.join(self.root, path[len(self.PREFIX):])

    def _get_local_path(self, path, force=False, **kwargs):
        return os.path.join(self.cache, os.path.basename(path))

    def _copy_from_local(self, local_path, dst_path, overwrite=False, **kwargs):
        shutil.copyfile(local_path, self._stored(dst_path))
        return True

    def _mkdirs(self, path, **kwargs):
        os.makedirs(self._stored(path), exist_ok=True)


def test_profiler_writes_a_trace_per_profiled_iteration(tmp_path):
    trainer, _ = make_trainer()
    profiler = TorchProfiler(lambda t: t.iter in (2, 3), str(tmp_path / "traces"))
    trainer.register_hooks([profiler])
    trainer.train(0, 5)
    names = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert names == ["profiler-trace-iter2.json", "profiler-trace-iter3.json"]
    trace = json.loads((tmp_path / "traces" / names[0]).read_text())
    assert any("aten::" in event.get("name", "") for event in trace["traceEvents"])


def test_profiler_uploads_traces_to_a_remote_output_dir(tmp_path, monkeypatch):
    store, cache, scratch = tmp_path / "store", tmp_path / "cache", tmp_path / "scratch"
    for d in (store, cache, scratch):
        d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    PathManager.register_handler(_RemoteStore(str(store), str(cache)), allow_override=True)
    try:
        trainer, _ = make_trainer()
        profiler = TorchProfiler(lambda t: t.iter == 2, _RemoteStore.PREFIX + "traces")
        trainer.register_hooks([profiler])
        trainer.train(0, 4)
    finally:
        # iopath has no public way to unregister a handler.
        PathManager._path_handlers.pop(_RemoteStore.PREFIX, None)
    assert profiler.trace_files == [_RemoteStore.PREFIX + "traces/profiler-trace-iter2.json"]
    trace = json.loads((store / "traces" / "profiler-trace-iter2.json").read_text())
    assert any("aten::" in event.get("name", "") for event in trace["traceEvents"])
    assert not os.listdir(cache) and not os.listdir(scratch)  # nothing left behind locally


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU no-op")
def test_memory_stats_is_a_no_op_with_one_info_line_on_cpu(treadle_caplog):
    trainer, _ = make_trainer()
    trainer.register_hooks([TorchMemoryStats(period=1)])
    trainer.train(0, 3)
    assert treadle_caplog.text.count("TorchMemoryStats does nothing: CUDA is not available") == 1
