"""Fixtures of the checkpoint tests: a real full file system, an iopath backend that is not local."""

import os
import subprocess

import pytest

from iopath.common.file_io import PathHandler
from treadle.utils.file_io import PathManager


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 192 KiB tmpfs (needs root and a container that allows mounts; skipped otherwise)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=192k", "treadle-test", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs: {e}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


class _RemoteLikeHandler(PathHandler):
    """An iopath handler that is not the native one (like s3://), backed by a local folder."""

    PREFIX = "treadle-test-remote://"

    def __init__(self, root):
        super().__init__()
        self.root = root

    def _get_supported_prefixes(self):
        return [self.PREFIX]

    def _local(self, path):
        return os.path.join(self.root, path[len(self.PREFIX):])

    def _open(self, path, mode="r", buffering=-1, **kwargs):
        return open(self._local(path), mode)

    def _exists(self, path, **kwargs):
        return os.path.exists(self._local(path))

    def _isfile(self, path, **kwargs):
        return os.path.isfile(self._local(path))

    def _isdir(self, path, **kwargs):
        return os.path.isdir(self._local(path))

    def _ls(self, path, **kwargs):
        return os.listdir(self._local(path))

    def _mkdirs(self, path, **kwargs):
        os.makedirs(self._local(path), exist_ok=True)

    def _rm(self, path, **kwargs):
        os.remove(self._local(path))


@pytest.fixture
def remote_like(tmp_path):
    PathManager.register_handler(_RemoteLikeHandler(str(tmp_path)), allow_override=True)
    try:
        yield _RemoteLikeHandler.PREFIX
    finally:
        # iopath has no public way to unregister a handler.
        PathManager._path_handlers.pop(_RemoteLikeHandler.PREFIX, None)
