"""`reproduce all --quick` end to end: every figure written, numbers finite, every grid value trained
with its learning-rate control, baselines on every seed, the same bytes from the same seed, and the
command line."""

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from icl_lens import verdicts
from icl_lens.studies import section5, section5_claims
from icl_lens.reproduce import FIGURES, OUTPUTS, experiment_config, quick_reproduction, reproduce
from icl_lens.results import save_result
from icl_lens.training import loop

from conftest import ROOT, RecordingPool

KINDS = ("linear", "trigonometric", "exponential")


def numeric_leaves(value):
    """Every number in a JSON record (booleans left out)."""
    if isinstance(value, dict):
        return [x for item in value.values() for x in numeric_leaves(item)]
    if isinstance(value, list):
        return [x for item in value for x in numeric_leaves(item)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


@pytest.fixture(scope="module")
def quick_all(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce")
    # the session's quick run (conftest: made once, by whichever of the book build, the chapter
    # run or this fixture comes first, and copied here)
    return out, quick_reproduction(["all"], out)


def test_every_figure_is_written(quick_all):
    out, written = quick_all
    assert set(FIGURES) <= set(written)
    for name in FIGURES:
        paths = written[name]
        record = json.loads(paths["json"].read_text())
        if name != "claims":
            # the numbers the figure plots: a real record holds many, all finite
            numbers = numeric_leaves(record)
            assert len(numbers) >= 10 and all(math.isfinite(x) for x in numbers), name
            assert paths["png"].stat().st_size > 10_000, name      # a real plot, not an empty canvas
    assert {f"{name}.json" for name in OUTPUTS} <= {p.name for p in out.iterdir()}
    judged = json.loads((out / "claims.json").read_text())["claims"]
    assert len(judged) >= 12 and {v["verdict"] for v in judged} <= set(verdicts.VERDICTS)


def test_quick_mode_keeps_the_seeds_asked_for():
    """Quick mode trains two seeds by default, but never cuts a seed list or seed count a reader
    gives (`--quick --deciding-seeds 20` once trained two seeds without a word)."""
    default, named = (experiment_config("linear", quick=True, seeds=seeds) for seeds in (None, [5, 6, 7]))
    assert default.seeds == (0, 1) and named.seeds == (5, 6, 7)
    assert named.epochs == default.epochs < section5.ExperimentConfig().epochs    # still small sizes
    drawn = experiment_config("trigonometric", quick=True, deciding=3).seeds
    screened = [section5.screen(section5.RegressionTask.trigonometric(), s)["passes"] for s in drawn]
    assert sum(screened) == 3 and screened[-1], drawn    # drawn until the third passing seed


@pytest.mark.parametrize("kind", KINDS)
def test_every_grid_value_trains_and_the_normal_model_learns(quick_all, kind):
    out, _ = quick_all
    record = json.loads((out / f"task_{kind}.json").read_text())
    config = experiment_config(kind, quick=True)
    expected = {(v.name, seed) for seed in config.seeds for v in config.variants()}
    assert {(m["name"], m["seed"]) for m in record["models"]} == expected
    rates = {m["lr"] for m in record["models"]}
    for model in record["models"]:
        assert len(model["train_loss"]) == config.epochs
        assert len(model["test_curve"]) == len(record["checkpoint_epochs"])
        if model["group"] == "normal":
            assert all(x is not None and x >= 0 for x in model["train_loss"]), model
        # every variant has a normal model of its seed and learning rate to be compared with
        assert section5_claims.partner(record, model)["lr"] == model["lr"] or model["group"] == "normal"
    assert {m["lr"] for m in record["models"] if m["group"] == "normal"} == rates
    for seed in config.seeds:
        found = record["baselines"][str(seed)]
        assert found["label_variance"] > 0 and found["context_mean"] > 0
        if kind == "linear":         # noiseless s = W t with N = 15 > d_t: least squares is exact
            assert found["least_squares"] < 1e-20 * found["label_variance"]
        if kind == "exponential":    # log s = W t: least squares on the log labels is exact
            assert found["log_least_squares"] < 1e-16 * found["label_variance"]
    if kind == "linear":   # 2048 steps are enough to see the linear task being learnt, on every seed
        for losses in (m["train_loss"] for m in record["models"] if m["group"] == "normal"):
            assert losses[-1] < 0.5 * losses[0], losses
    for curve in record["equivalence"].values():   # Theorem 3.1 on the trained layer, t = N
        assert curve["squared_error"][-1] <= 1e-24 * max(1.0, curve["squared_error"][0])


def test_figures_hold_every_curve_they_plot(quick_all):
    out, _ = quick_all
    fig3 = json.loads((out / "fig3.json").read_text())
    groups = {m["group"] for m in fig3["models"]}
    assert groups == {"normal", "regularized", "augmented", "negative"}
    assert set(fig3["baselines"]) == {"0", "1"}
    fig13 = json.loads((out / "fig13.json").read_text())
    assert set(fig13) == set(KINDS)
    for kind in KINDS:
        names = {m["name"] for m in fig13[kind]["models"] if m["group"] == "combination"}
        assert names == {m.name for m in section5.EXPERIMENTS[kind]().combinations}
    paired = json.loads((out / "paired.json").read_text())
    for kind in KINDS:   # one paired row per model name but the paper's normal model
        assert len(paired[kind]) == len(section5.EXPERIMENTS[kind]().variants()) - 1
    study = json.loads((out / "fig6-8.json").read_text())
    assert "trained layers (linear task)" in study


def test_same_seed_gives_the_same_bytes(tmp_path):
    config = section5.ExperimentConfig(epochs=2, tokens_per_epoch=48 * 16, seeds=(4, 5), test_sequences=4,
                                          final_test_sequences=8, checkpoints=2)
    for name in ("a", "b"):
        save_result(tmp_path, name, section5.run_experiment(config, progress=False))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert json.loads((tmp_path / "a.json").read_text())["config"]["seeds"] == [4, 5]


def test_worker_processes_train_the_same_models():
    """Seeds split into parts over two processes give, in float64, the models of one ensemble."""
    config = section5.ExperimentConfig(epochs=2, tokens_per_epoch=12 * 16, seeds=(0, 1), test_sequences=4,
                                          final_test_sequences=8, checkpoints=1, dtype="float64")
    together = section5.run_experiment(config, progress=False)
    split = section5.run_experiment(config, progress=False, workers=2)
    assert [(m["name"], m["seed"]) for m in together["models"]] == [(m["name"], m["seed"]) for m in split["models"]]
    for a, b in zip(together["models"], split["models"]):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-9, abs=1e-12), a["name"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9, abs=1e-12), a["name"]
        assert a["test_loss_by_length"] == pytest.approx(b["test_loss_by_length"], rel=1e-9, abs=1e-12), a["name"]
    assert split["equivalence"].keys() == together["equivalence"].keys()


def test_tasks_sharing_a_pool_train_what_separate_runs_train(monkeypatch):
    """run_experiments gives each config the record that a run_experiment of its own gives, and
    times its jobs; the pool is handed the jobs config by config in the order given, each
    config's costlier part of a seed's variants (the maps and negative samples) first."""
    monkeypatch.setattr(loop, "ProcessPoolExecutor", RecordingPool)
    linear = section5.ExperimentConfig(epochs=2, tokens_per_epoch=12 * 16, seeds=(0, 1), test_sequences=4,
                                       final_test_sequences=8, checkpoints=1)
    trigonometric = replace(section5.trigonometric_experiment(), epochs=2, tokens_per_epoch=4 * 128, seeds=(0,),
                            test_sequences=4, final_test_sequences=8, checkpoints=1)
    ended = []
    records, seconds = section5.run_experiments([trigonometric, linear], progress=False, workers=2,
                                                finished=lambda *done: ended.append(done))
    handed = [(job[0].task.kind, section5.ensemble_cost(job[1])) for job in RecordingPool.submitted]
    assert [kind for kind, _ in handed] == ["trigonometric"] * 2 + ["linear"] * 4
    for kind in ("trigonometric", "linear"):
        costs = [cost for k, cost in handed if k == kind]
        assert costs == sorted(costs, reverse=True) and costs[0] > costs[-1]
    assert all(s > 0 for s in seconds)
    # each config is handed on once, when its own jobs have ended (the stand-in pool ends them all
    # at once, so in no particular order)
    assert sorted(ended, key=lambda done: done[0]) == [(0, records[0], seconds[0]), (1, records[1], seconds[1])]
    # two equal configs keep their places in the order given, the costlier second
    plain = linear.variants()[:2]
    mapped = [v for v in linear.variants() if v.group == "augmented"][:2]
    section5.run_experiments([linear, linear], variants=[plain, mapped], progress=False, workers=2)
    handed = [job[1][0] for job in RecordingPool.submitted]
    assert handed[:4] == 2 * plain and handed[4:] == 2 * mapped
    assert records == [section5.run_experiment(config, progress=False, workers=2)
                       for config in (trigonometric, linear)]
    # a failing job does not take the configs that have ended with it
    train_seeds = section5.train_seeds

    def failing(config, *args, **kwargs):
        if config.task.kind == "linear":
            raise RuntimeError("a linear job fails")
        return train_seeds(config, *args, **kwargs)

    monkeypatch.setattr(section5, "train_seeds", failing)
    ended.clear()
    with pytest.raises(RuntimeError, match="a linear job fails"):
        section5.run_experiments([trigonometric, linear], progress=False, finished=lambda *done: ended.append(done))
    assert [(i, record["task"], len(record["models"])) for i, record, _ in ended] == \
        [(0, "trigonometric", len(records[0]["models"]))]
    with pytest.raises(ValueError, match="variants"):
        section5.run_experiments([linear], variants=[], progress=False)


def test_shorter_runs_are_the_runs_of_their_own_length():
    """With the decay schedule, the runs copied off a longer one (half its epochs and any
    ``shorter_runs``) end where separate runs of those lengths end, in float64, and the schedule
    reaches the steps (the decayed run is not the constant one). Checked by hand once: keeping the
    whole run's schedule on the copies makes this test fail."""
    config = section5.ExperimentConfig(epochs=10, tokens_per_epoch=8 * 16, seeds=(0, 1), test_sequences=4,
                                          final_test_sequences=8, checkpoints=2, dtype="float64", shorter_runs=(3,))
    variants = config.variants()[:3]
    long = section5.run_experiment(config, progress=False, variants=variants)
    assert long["run_lengths"] == [3, 5, 10]
    for i, length in enumerate((3, 5)):
        alone = section5.run_experiment(replace(config, epochs=length, shorter_runs=()), progress=False,
                                           variants=variants)
        for a, b in zip(long["models"], alone["models"]):
            assert a["test_loss_by_length"][i] == pytest.approx(b["test_loss"], rel=1e-10), (length, a["name"])
    constant = section5.run_experiment(replace(config, schedule="constant", shorter_runs=()), progress=False,
                                          variants=variants)
    assert constant["run_lengths"] == [10]
    # the decayed run is not the constant one: the schedule reaches the steps
    assert all(abs(a["test_loss"] - b["test_loss"]) > 1e-8 for a, b in zip(long["models"], constant["models"]))
    assert section5.normalised_loss(long, long["models"][0], 0.5) == pytest.approx(
        long["models"][0]["test_loss_by_length"][1] / long["baselines"]["0"]["label_variance"])
    with pytest.raises(ValueError, match="run of 2 epochs"):
        section5.normalised_loss(long, long["models"][0], 0.2)


def test_command_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "fig9", "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig9.png").exists() and (tmp_path / "fig9.json").exists()
    wrong = subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "fig99"], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
    assert wrong.returncode == 2 and "fig99" in wrong.stderr
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unwritable = subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "fig9", "--quick", "--out",
                                 str(blocked / "sub")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert unwritable.returncode == 2 and "--out" in unwritable.stderr and "Traceback" not in unwritable.stderr


def test_bad_configs_name_the_argument():
    with pytest.raises(ValueError, match="epochs"):
        section5.ExperimentConfig(epochs=0)
    with pytest.raises(ValueError, match="tokens_per_epoch"):
        section5.ExperimentConfig(tokens_per_epoch=8)
    with pytest.raises(ValueError, match="checkpoints"):
        section5.ExperimentConfig(checkpoints=0)
    with pytest.raises(ValueError, match="unknown figure"):
        reproduce(["fig2"], out=".", quick=True, log=None)
    with pytest.raises(ValueError, match="workers"):
        section5.run_experiment(section5.ExperimentConfig(), workers=0)
    with pytest.raises(ValueError, match="schedule"):
        section5.ExperimentConfig(schedule="cosine")
    with pytest.raises(ValueError, match="shorter_runs"):
        section5.ExperimentConfig(epochs=10, shorter_runs=(10,))


def test_convergence_study_is_separate_from_all(tmp_path):
    written = reproduce(["convergence"], out=tmp_path, quick=True, log=None)
    studies = json.loads(written["convergence"]["json"].read_text())
    assert set(studies) == set(KINDS)
    for study in studies.values():
        assert study["criterion"][-1]["epochs"] == len(study["record"]["epochs"]) == 8
        assert {m["group"] for m in study["record"]["models"]} == {"normal"}
    assert "convergence" not in FIGURES
    # its jobs are journaled apart from the tasks': --grow over a finished journal trains nothing
    # (no job file is written again) and writes the same study
    jobs = {path: path.stat().st_mtime_ns for path in (tmp_path / "journal" / "convergence").rglob("*.json.gz")}
    assert {path.parent.name for path in jobs} == set(KINDS)
    before = written["convergence"]["json"].read_bytes()
    again = reproduce(["convergence"], out=tmp_path, quick=True, log=None, grow=True)
    assert again["convergence"]["json"].read_bytes() == before
    assert {path: path.stat().st_mtime_ns for path in jobs} == jobs


def test_context_use_and_temperature_check_are_written(quick_all):
    """Every model's context use is measured with its own forward pass (its intact loss is its
    test loss), the layers trained across tasks are measured too, and the temperature check
    (not part of all) trains its models without the scale and judges its claims with and
    without it, reading the linear task's record from the run it follows."""
    out, _ = quick_all
    context = json.loads((out / "context_use.json").read_text())
    for kind in KINDS:
        record = json.loads((out / f"task_{kind}.json").read_text())
        for model in record["models"]:
            found = context["tasks"][kind][model["name"]][str(model["seed"])]
            if model["test_curve"][-1] is not None:   # context use reads the curve's test set
                scale = record["baselines"][str(model["seed"])]["curve_label_variance"]
                last = model["test_curve"][-1] / scale
                assert abs(found["intact"] - last) <= 1e-4 * found["intact"] + 1e-6
    assert set(context["across_tasks"]) == {"paper task (random-features)", "paper task (softmax)"}
    reproduce(["temperature"], out=out, quick=True, log=None)   # the linear record from out
    temperature = json.loads((out / "temperature.json").read_text())
    assert temperature["record"]["config"]["temperature"] is False
    assert {c["id"] for c in temperature["claims"]} == {"linear-alpha-negative-faster", "linear-alpha-negative-comparable",
                                                       "linear-g2-faster"}
    for claim in temperature["claims"]:
        assert claim["changes"] == (claim["with"]["verdict"] != claim["without"]["verdict"])


def test_a_quick_run_is_made_once_per_folder_and_copied_after(tmp_path, monkeypatch):
    """With ICL_LENS_QUICK_RUNS set, the first call trains and every later one copies; without
    it, every call trains."""
    from icl_lens import reproduce as module

    made = []

    def fake(names, *, out, quick, log):
        assert quick
        made.append(list(names))
        (out / "task_linear.json").write_text(json.dumps({"run": len(made)}))
        return {"task_linear": {"json": out / "task_linear.json"}}

    monkeypatch.setattr(module, "reproduce", fake)
    monkeypatch.setenv(module.QUICK_RUNS, str(tmp_path / "shared"))
    for reader in ("root", "book"):
        (tmp_path / reader).mkdir()
        written = module.quick_reproduction(["all"], tmp_path / reader)
        assert written == {"task_linear": {"json": tmp_path / reader / "task_linear.json"}}
        assert json.loads(written["task_linear"]["json"].read_text()) == {"run": 1}
        assert sorted(p.name for p in (tmp_path / reader).iterdir()) == ["task_linear.json"]
    assert made == [["all"]]
    monkeypatch.delenv(module.QUICK_RUNS)
    module.quick_reproduction(["all"], tmp_path / "root")
    assert made == [["all"], ["all"]]
