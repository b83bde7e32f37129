import contextlib
import logging
import signal

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic_torch():
    """Each test starts from the same global RNG state and restores the thread count."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def _hide_gpus(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(torch.cuda, "is_available", lambda: False)
    patch.setattr(torch.cuda, "device_count", lambda: 0)
    patch.setattr(torch.cuda, "is_initialized", lambda: False)
    patch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True)
def _cpu_unless_marked_gpu(request, monkeypatch):
    """Every test not marked ``gpu`` runs as on a machine without CUDA, also on
    one with a GPU: device="auto" then picks the CPU the test was written
    for, the console line has no max_mem, --num-gpus starts gloo processes.
    The processes a test starts see no GPU either."""
    if request.node.get_closest_marker("gpu") is None:
        _hide_gpus(monkeypatch)


@pytest.fixture(scope="module", autouse=True)
def _cpu_module_unless_it_has_gpu_tests(request):
    """The same for module-scoped fixtures (a job trained once for several
    tests), which are set up before any per-test fixture. A module with a
    ``gpu`` test keeps its GPU: hidden while its fixtures ran, CUDA would not
    find it afterwards."""
    items = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    if any(item.get_closest_marker("gpu") is not None for item in items):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        _hide_gpus(patch)
        yield


@pytest.fixture(autouse=True)
def _signal_mask_restored():
    """The process's blocked signals as they were: a test that runs a data
    worker's setup here (which blocks SIGTERM, as a worker must) would leave
    every later subprocess born with SIGTERM blocked, and the signal tests
    of other modules failing."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(autouse=True)
def _no_pending_run_start():
    """What a test's default_setup left for training to write does not reach another test."""
    yield
    from treadle.utils.run_start import forget_pending_starts

    forget_pending_starts()


@contextlib.contextmanager
def _loggers_restored(names=("treadle", "fvcore", "")):
    """Undoes what setup_logger did meanwhile (handlers, no propagation, the
    root logger's handler and level), so that later tests' caplog sees
    treadle's records."""
    loggers = [logging.getLogger(name) for name in names]
    saved = [(logger.propagate, logger.level, list(logger.handlers)) for logger in loggers]
    yield
    for logger, (propagate, level, handlers) in zip(loggers, saved):
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
            if getattr(handler, "_treadle_handler", False):
                handler.close()
        logger.propagate, logger.level = propagate, level


@pytest.fixture(autouse=True)
def _restore_treadle_logger():
    """What setup_logger did during a test, undone after it."""
    with _loggers_restored():
        yield


@pytest.fixture(scope="module", autouse=True)
def _restore_treadle_logger_after_the_module():
    """The same for a module-scoped fixture that runs a job (default_setup included)."""
    with _loggers_restored():
        yield


@pytest.fixture
def treadle_caplog(caplog):
    """caplog that sees the 'treadle' logger's records exactly once, whether or
    not setup_logger (which turns propagation off) runs during the test."""
    logger = logging.getLogger("treadle")
    old_propagate, old_level = logger.propagate, logger.level
    logger.propagate = False
    logger.addHandler(caplog.handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    caplog.set_level(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.propagate, logger.level = old_propagate, old_level


@pytest.fixture
def data_log():
    """Records of the treadle.data loggers, whatever propagation other tests set up."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    log = logging.getLogger("treadle.data")
    old_level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    yield records
    log.removeHandler(handler)
    log.setLevel(old_level)
