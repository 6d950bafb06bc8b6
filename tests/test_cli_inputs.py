"""Every command-line value and environment variable is checked before any work starts or any
folder is made: a bad one ends the command with exit status 2 and a message naming the argument.
``--reuse`` (and ``claims --rerun`` without ``--train``) never trains: a missing record is one line
naming the file and the command that makes it. Driven in-process through ``main(argv)``, with every
training entry point replaced by one that fails the test, so a value accepted by mistake cannot
start a run."""

import os
import shutil

import pytest

from icl_lens import __main__ as cli
from icl_lens import reproduce as reproduce_module
from icl_lens.bert import glue
from icl_lens.studies import across_tasks, ffn_rank, li_et_al, section5, table1


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """Training (and the fine-tuning of glue) replaced by a failure; the default results folder
    under tmp_path."""
    def refuse(*args, **kwargs):
        raise AssertionError("a command started work it should have refused")

    for module, name in ((section5, "run_experiments"), (section5, "run_experiment"),
                         (section5, "convergence_studies"), (ffn_rank, "trained_rank_bound"),
                         (across_tasks, "context_use_study"), (across_tasks, "run_study"),
                         (li_et_al, "run_study"), (table1, "run_study"), (glue, "run"),
                         (section5, "approximation_study"), (section5, "heatmaps")):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setenv("ICL_LENS_RESULTS", str(tmp_path / "results"))
    (tmp_path / "a-file").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "claims.json").mkdir()   # a folder where --write would put a file
    return tmp_path


def exits_with_2(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return captured.err.strip().splitlines()[-1]   # the error line (after argparse's usage)


FILE = "{tmp}/a-file"
DEVICES = ["tpu", "", "3", "cuda:abc", "meta", "mps", "CPU", " cpu", "xla", "cpu:x", "vulkan", "cuda:-1", "ipu",
           "cuda:99", "hpu"]
SEEDS = ["-1", str(2 ** 32), "99999999999999999999999", "1.5", "abc", "", "0x10", "1e3", "nan", "inf", "-0.5"]
POSITIVE_INTS = ["0", "-1", "1.5", "abc", "", "1e3"]
NUMBERS = ["nan", "inf", "-inf", "abc", "", "1e400"]

BAD = [   # (argv, the argument the message must name, environment)
    *((["reproduce", "fig3", "--device", d], "--device", {}) for d in DEVICES),
    *((["reproduce", "fig3", "--seeds", s], "--seeds", {}) for s in SEEDS),
    (["reproduce", "fig3", "--seeds", "0", "0"], "--seeds", {}),
    (["reproduce", "fig3", "--seeds", "1", "2", "1"], "--seeds", {}),
    *((["reproduce", "fig3", "--workers", w], "--workers", {}) for w in POSITIVE_INTS),
    *((["reproduce", "fig3", "--out", out], "--out", {}) for out in (FILE, FILE + "/sub", "", "  ", "a\0b")),
    *((["reproduce", "fig3", "--reuse", *flag, "--out", "{tmp}"], name, {}) for flag, name in (
        (["--seeds", "7"], "--seeds"), (["--compile"], "--compile"), (["--no-compile"], "--compile"),
        (["--workers", "1"], "--workers"), (["--device", "cpu"], "--device"), (["--grow"], "--grow"),
        (["--scheduler", "tcp://localhost:8786"], "--scheduler"))),
    *((["reproduce", "fig3", "--scheduler", address], "--scheduler", {})
      for address in ("localhost:8786", "tcp://", "", "  ", "8786")),
    *((["reproduce", name, "--grow", "--out", "{tmp}/out"], "--grow", {})
      for name in ("claims", "multitask", "softmax-regression", "fig14", "fig6", "context-use")),
    *((["reproduce", *names], "FIGURE", {}) for names in (["fig2"], [""], ["FIG3"], ["fig", "3"], ["fig3", "x"])),
    (["reproduce"], "FIGURE", {}),
    (["reproduce", "fig3", "--quick=1"], "--quick", {}),
    (["reproduce", "fig3", "--speed", "1"], "--speed", {}),
    *((["reproduce", "fig3"], "ICL_LENS_RESULTS", {"ICL_LENS_RESULTS": value})
      for value in (FILE, FILE + "/sub", "  ", "a\0b")),
    (["glue", "--task", "rte"], "ICL_LENS_RESULTS", {"ICL_LENS_RESULTS": FILE}),
    *((["glue", "--task", "rte", "--lr", v], "--lr", {}) for v in (*NUMBERS, "0", "-1", "-2e-5")),
    *((["glue", "--task", "rte", "--epochs", v], "--epochs", {}) for v in POSITIVE_INTS),
    *((["glue", "--task", "rte", "--batch-size", v], "--batch-size", {}) for v in POSITIVE_INTS[:4]),
    *((["glue", "--task", "rte", "--train-size", v], "--train-size", {}) for v in ("0", "-5", "x")),
    *((["glue", "--task", "rte", "--validation-size", v], "--validation-size", {}) for v in ("0", "-5", "x")),
    *((["glue", "--task", "rte", "--alpha", v], "--alpha", {}) for v in (*NUMBERS, "1", "1.5")),
    *((["glue", "--task", "rte", "--key-branch", v], "--key-branch", {}) for v in NUMBERS[:3]),
    *((["glue", "--task", "rte", "--value-branch", v], "--value-branch", {}) for v in NUMBERS[:3]),
    *((["glue", "--task", "rte", "--negative-ratio", v], "--negative-ratio", {}) for v in ("-0.1", "1", "2", "nan")),
    (["glue", "--task", "rte", "--beta", "0.1"], "--beta", {}),
    *((["glue", "--task", "rte", "--seeds", *s], "--seeds", {}) for s in (["-1"], ["0", "0"], [str(2 ** 32)])),
    *((["glue", "--task", "rte", "--device", d], "--device", {}) for d in ("tpu", "meta", "")),
    (["glue", "--task", "foo"], "--task", {}),
    (["glue"], "--task", {}),
    *((["glue", "--task", "rte", "--data", d], "--data", {}) for d in ("{tmp}/nowhere", FILE)),
    *((["glue", "--task", "rte", "--out", d], "--out", {}) for d in (FILE, FILE + "/sub")),
    *((["claims", "--data", d], "--data", {}) for d in ("{tmp}/nowhere", FILE, "")),
    (["claims", "--train"], "--rerun", {}),
    (["claims", "--rerun", "foo"], "--rerun", {}),
    (["claims", "--data", "{tmp}/data", "--write"], "--data", {}),
    (["claims", "--rerun", "table1", "--data", FILE], "--data", {}),
    ([], "command", {}),
    (["train"], "command", {}),
]


@pytest.mark.parametrize("argv, argument, environment", BAD,
                         ids=[f"{i}:{' '.join(a)[:40]}" for i, (a, _, _) in enumerate(BAD)])
def test_a_bad_value_is_refused_naming_it_before_any_work(no_work, monkeypatch, capsys, argv, argument,
                                                          environment):
    tmp = no_work
    for name, value in environment.items():
        if "\0" in value:   # the real environment cannot hold a NUL: the reader sees a dict that does
            monkeypatch.setattr(os, "environ", {**os.environ, name: value.format(tmp=tmp)})
        else:
            monkeypatch.setenv(name, value.format(tmp=tmp))
    before = sorted(p.relative_to(tmp) for p in tmp.rglob("*"))
    line = exits_with_2([a.format(tmp=tmp) for a in argv], capsys)
    assert argument in line
    if argument == "--compile":
        assert "--reuse" in line   # a flag that does nothing with another: both named
    assert sorted(p.relative_to(tmp) for p in tmp.rglob("*")) == before   # no folder made


def test_the_sweep_is_large_enough():
    assert len(BAD) >= 100


REUSED = [name for name in reproduce_module.OUTPUTS_TABLE] + ["all"]


@pytest.mark.parametrize("name", REUSED)
def test_reuse_on_an_empty_folder_never_trains(no_work, capsys, name):
    """Each output with --reuse over an empty folder: one line naming the missing record and the
    command that makes it (the training entry points fail the test if reached)."""
    empty = no_work / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as stopped:
        cli.main(["reproduce", name, "--reuse", "--quick", "--out", str(empty)])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    missing = error[0].split(" is missing")[0].rsplit(" ", 1)[-1]
    assert missing.startswith(str(empty)) and missing.endswith(".json")
    made_by = reproduce_module.MADE_BY[missing.rsplit("/", 1)[-1].removesuffix(".json")]
    assert f"make it with python -m icl_lens reproduce {made_by} --quick --out {empty}" in error[0]
    assert list(empty.iterdir()) == []


def test_reuse_on_a_missing_folder_makes_no_folder(no_work, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["reproduce", "fig3", "--reuse", "--out", str(no_work / "nowhere")])
    assert stopped.value.code == 2
    assert "nowhere is not a folder of saved records" in capsys.readouterr().err
    assert not (no_work / "nowhere").exists()


@pytest.mark.parametrize("study", list(cli.RERUN))
def test_claims_rerun_never_trains_on_an_empty_folder(no_work, capsys, study):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["claims", "--rerun", study, "--data", str(no_work / "data")])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--data" in line and "never trains" in line and "python -m icl_lens reproduce" in line
    assert sorted(p.name for p in (no_work / "data").iterdir()) == ["claims.json"]   # nothing made


def test_ctrl_c_ends_with_one_line(monkeypatch, capsys, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "reproduce", interrupted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["reproduce", "fig3", "--quick", "--out", str(tmp_path)])
    assert stopped.value.code == 130
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "interrupted" in line


SAVED = reproduce_module.repository_root() / "book" / "data" / "experiments"


@pytest.mark.skipif(not (SAVED / "temperature.json").exists(), reason="no saved full run")
def test_temperature_judges_again_with_reuse_and_trains_only_its_own_models_without(no_work, monkeypatch, capsys):
    """``temperature --reuse`` judges the saved record again (nothing trains); without --reuse it
    trains its own models (here: replaced by the saved record) and compares them with the linear
    record saved in --out, which it neither retrains nor rewrites. The judging itself is replaced
    by one that says what it was given."""
    import json
    import shutil

    from icl_lens.studies import section5_claims

    out = no_work / "experiments"
    out.mkdir()
    for name in ("task_linear", "temperature"):
        shutil.copy(SAVED / f"{name}.json", out)
    linear = (out / "task_linear.json").read_bytes()
    saved = json.loads((out / "temperature.json").read_text())["record"]
    monkeypatch.setattr(section5_claims, "temperature_check", lambda reference, record: [
        {"reference": reference["task"], "reference_models": len(reference["models"]),
         "models": len(record["models"])}])
    expected = [{"reference": "linear", "reference_models": len(json.loads(linear)["models"]),
                 "models": len(saved["models"])}]
    cli.main(["reproduce", "temperature", "--reuse", "--out", str(out)])
    assert json.loads((out / "temperature.json").read_text())["claims"] == expected
    trained = []
    monkeypatch.setattr(section5, "run_experiment",
                        lambda *args, **kwargs: trained.append(1) or json.loads(json.dumps(saved)))
    (out / "temperature.json").unlink()
    cli.main(["reproduce", "temperature", "--out", str(out), "--workers", "1"])
    assert trained == [1]
    assert json.loads((out / "temperature.json").read_text())["claims"] == expected
    assert (out / "task_linear.json").read_bytes() == linear
    assert "temperature:" in capsys.readouterr().out


@pytest.mark.parametrize("variable", ["ICL_LENS_QUICK_RUNS", "ICL_LENS_RESULTS"])
@pytest.mark.parametrize("value", ["{tmp}/a-file", "{tmp}/a-file/sub", "  "])
def test_an_environment_folder_that_cannot_be_written_is_named(no_work, monkeypatch, variable, value):
    """The chapters' readers of the two variables refuse a file, a path under a file or blanks,
    naming the variable, before any run starts (the training entry points fail the test)."""
    from icl_lens.results import results_dir

    monkeypatch.setenv(variable, value.format(tmp=no_work))
    with pytest.raises(ValueError, match=variable):
        if variable == "ICL_LENS_RESULTS":
            results_dir("experiments")
        else:
            reproduce_module.quick_reproduction(["fig3"], no_work / "out")
    assert not (no_work / "out").exists()


def test_ctrl_c_names_what_was_saved(monkeypatch, capsys, tmp_path):
    """Ctrl-C after one output was written: the one line names the files written whole before it."""
    saved = shutil.copytree(SAVED, tmp_path / "saved", ignore=shutil.ignore_patterns("*.png"))

    def fig3_then_stop(run):
        raise KeyboardInterrupt

    monkeypatch.setitem(reproduce_module.OUTPUTS_TABLE, "fig10", (fig3_then_stop, True))
    with pytest.raises(SystemExit) as stopped:
        cli.main(["reproduce", "fig3", "fig10", "--reuse", "--out", str(saved)])
    assert stopped.value.code == 130
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "interrupted" in line and str(saved / "fig3.json") in line and str(saved / "fig3.png") in line
