"""The test harness itself: what tests/conftest.py promises every test."""

import os

import pytest
import torch


@pytest.fixture(scope="module")
def what_a_module_fixture_sees():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available(), torch.cuda.device_count()


def test_module_scoped_fixtures_run_as_on_a_machine_without_a_gpu(what_a_module_fixture_sees):
    # A module fixture that trains a job with --num-gpus 2 must start gloo
    # processes on a GPU machine too (tests/checkpoint/test_dcp_distributed.py did not).
    assert what_a_module_fixture_sees == ("", False, 0)


def test_each_test_runs_as_on_a_machine_without_a_gpu():
    assert (os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available(), torch.cuda.device_count()) == ("", False, 0)
