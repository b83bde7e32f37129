"""The environment table a job logs at its start."""

import os

import treadle
from treadle.utils.env import collect_env_info


def test_env_table_names_treadle_version_and_where_it_is_imported_from():
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in collect_env_info().splitlines() if "|" in line}
    assert rows["treadle"] == f"{treadle.__version__} @{os.path.dirname(treadle.__file__)}"
