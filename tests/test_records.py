"""Every saved record is read through one loader (icl_lens.results.load_result) that names the file
and the field on any error: a truncated file, a bare NaN or Infinity token, a missing key, a value
of another type. ``null`` (a recorded divergence) is read as None. Driven through
``reproduce fig3 --reuse`` on a corrupted copy of a small task record, and through the loader."""

import json

import pytest

from icl_lens.__main__ import main
from icl_lens.reproduce import SCHEMAS
from icl_lens.results import NUMBER, RecordError, load_result, write_json


def small_task_record():
    """A task record with the fields the figures read: two seeds, one normal model each."""
    model = {"name": "normal", "group": "normal", "lr": 0.01, "test_loss": 0.5, "test_curve": [1.0, 0.5],
             "train_loss": [1.0, 0.6]}
    return {"task": "linear", "config": {"seeds": [0, 1], "epochs": 2}, "epochs": [1, 2], "checkpoint_epochs": [1, 2],
            "run_lengths": [2], "convergence": {},
            "baselines": {s: {"label_variance": 1.0, "context_mean": 1.0} for s in ("0", "1")},
            "equivalence": {s: {"squared_error": [0.1, 0.01]} for s in ("0", "1")},
            "models": [{**model, "seed": 0}, {**model, "seed": 1}]}


def text_with(change):
    record = small_task_record()
    change(record)
    return json.dumps(record, indent=1)


def set_path(path, value):
    def change(record):
        *parents, last = path
        for key in parents:
            record = record[key]
        record[last] = value
    return change


def delete_path(path):
    def change(record):
        *parents, last = path
        for key in parents:
            record = record[key]
        del record[last]
    return change


GOOD = json.dumps(small_task_record(), indent=1)
CORRUPTED = [   # (file text, what the message must name besides the file)
    (GOOD[: len(GOOD) // 2], "not valid JSON"),
    (GOOD[:-2], "not valid JSON"),
    (GOOD[:1], "not valid JSON"),
    ("", "not valid JSON"),
    (GOOD.replace('"test_loss": 0.5', '"test_loss": NaN', 1), "NaN"),
    (GOOD.replace('"test_loss": 0.5', '"test_loss": Infinity', 1), "Infinity"),
    (GOOD.replace('"test_loss": 0.5', '"test_loss": -Infinity', 1), "-Infinity"),
    (GOOD.replace("0.01", "NaN", 1), "NaN"),
    ("[]", "the record must be an object, got list"),
    ("null", "the record must be an object, got NoneType"),
    (text_with(delete_path(["models"])), "field models is missing"),
    (text_with(delete_path(["config"])), "field config is missing"),
    (text_with(delete_path(["config", "seeds"])), "field config.seeds is missing"),
    (text_with(delete_path(["models", 1, "test_curve"])), "field models[1].test_curve is missing"),
    (text_with(delete_path(["baselines", "1", "label_variance"])), "field baselines.1.label_variance is missing"),
    (text_with(set_path(["models"], {"a": 1})), "field models must be list"),
    (text_with(set_path(["models", 0, "test_loss"], "0.5")), "field models[0].test_loss must be"),
    (text_with(set_path(["models", 0, "seed"], "0")), "field models[0].seed must be int"),
    (text_with(set_path(["models", 0, "seed"], True)), "field models[0].seed must be int"),
    (text_with(set_path(["models", 1, "test_curve"], [1.0, "x"])), "field models[1].test_curve[1] must be"),
    (text_with(set_path(["config", "seeds"], [0, 1.5])), "field config.seeds[1] must be int"),
    (text_with(set_path(["config", "epochs"], None)), "field config.epochs must be int"),
    (text_with(set_path(["task"], 3)), "field task must be str"),
    (text_with(set_path(["baselines", "0", "label_variance"], [1.0])), "field baselines.0.label_variance must be"),
    (text_with(set_path(["equivalence", "0", "squared_error"], 0.1)), "field equivalence.0.squared_error must be a list"),
]


@pytest.mark.parametrize("text, named", CORRUPTED, ids=[f"{i}:{n[:30]}" for i, (_, n) in enumerate(CORRUPTED)])
def test_a_corrupted_record_is_one_line_naming_the_file_and_field(tmp_path, capsys, text, named):
    (tmp_path / "task_linear.json").write_text(text)
    with pytest.raises(SystemExit) as stopped:
        main(["reproduce", "fig3", "--reuse", "--out", str(tmp_path)])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(tmp_path / "task_linear.json") in line and named in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task_linear.json"]   # nothing drawn or written


def test_the_sweep_is_large_enough():
    assert len(CORRUPTED) >= 20


def test_bytes_that_are_not_utf8_and_a_folder_in_place_of_a_file(tmp_path):
    (tmp_path / "bad.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(RecordError, match="bad.json"):
        load_result(tmp_path, "bad")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(RecordError, match="folder.json"):
        load_result(tmp_path, "folder")
    with pytest.raises(RecordError, match="missing.json is missing"):
        load_result(tmp_path, "missing")


def test_null_is_accepted_where_a_number_may_be_a_divergence(tmp_path):
    record = small_task_record()
    record["models"][0]["test_loss"] = None
    record["models"][0]["test_curve"] = [1.0, None]
    write_json(tmp_path / "task_linear.json", record)
    assert load_result(tmp_path, "task_linear", expect=SCHEMAS["task_linear"]) == record
    with pytest.raises(RecordError, match=r"field models\[0\]\.test_loss must be float or int, got NoneType"):
        load_result(tmp_path, "task_linear", expect={"models[].test_loss": float})   # null where none may be
    assert NUMBER == (int, float, type(None))
