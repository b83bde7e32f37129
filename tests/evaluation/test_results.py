"""Result flattening and formatting."""

import pytest

from treadle.evaluation import flatten_results, format_results


def test_flatten_nested_results():
    results = {"accuracy": 0.5, "per_class": {"cat": 1, "dog": {"x": 0.25}}}
    assert flatten_results(results) == {"accuracy": 0.5, "per_class/cat": 1.0, "per_class/dog/x": 0.25}
    assert flatten_results(results, sep=".") == {"accuracy": 0.5, "per_class.cat": 1.0, "per_class.dog.x": 0.25}


def test_flatten_rejects_non_numbers_naming_the_key():
    with pytest.raises(TypeError, match=r"result 'a/b' is a str; expected a number or a dict"):
        flatten_results({"a": {"b": "high"}})


def test_format_results_table():
    table = format_results({"accuracy": 0.93, "bleu": {"4": float("nan")}}, digits=2)
    assert table.splitlines() == [
        "| metric   |   value |",
        "|:---------|--------:|",
        "| accuracy |    0.93 |",
        "| bleu/4   |  nan    |",
    ]
