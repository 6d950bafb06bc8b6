"""A record's bytes do not depend on the order its keys were inserted in (sorted keys): the same
numbers give the same file, so a rerun can be compared byte for byte."""

import json

from icl_lens.results import save_result


def test_key_order_does_not_change_the_bytes(tmp_path):
    forward = {"b": 1, "a": {"y": [1.5, 2], "x": None}, "c": "text"}
    backward = {"c": "text", "a": {"x": None, "y": [1.5, 2]}, "b": 1}
    first = save_result(tmp_path / "one", "record", forward)["json"].read_bytes()
    second = save_result(tmp_path / "two", "record", backward)["json"].read_bytes()
    assert first == second
    assert json.loads(first) == forward
