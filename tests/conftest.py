import logging

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic_torch():
    """Each test starts from the same global RNG state and restores the thread count."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def treadle_caplog(caplog):
    """caplog that also sees the 'treadle' logger, which does not propagate once set up."""
    logger = logging.getLogger("treadle")
    attach = not logger.propagate  # else caplog sees each record through the root logger already
    if attach:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    yield caplog
    if attach:
        logger.removeHandler(caplog.handler)
