"""The modifications across tasks: the Section 5 study under its new-task protocol (a fresh task
weight for every prompt, Adam on batches, one learning rate), its baselines against a direct
computation, its shorter run and its ensemble against separate runs, Section 5's own configs left
as they were, and the linear claims judged again on it."""

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from icl_lens.device import generator
from icl_lens.studies import modifications_across_tasks as study
from icl_lens.studies import section5, section5_claims
from icl_lens.tasks import RegressionTask
from icl_lens.training.data import new_task_sequences
from icl_lens.training.ensemble import AttentionEnsemble, LayerConfig, Modification, squared_errors
from icl_lens.training.loop import train

ROOT = Path(__file__).resolve().parents[1]


def test_every_prompt_has_its_own_task_weight():
    task = RegressionTask.linear()
    tokens, targets = new_task_sequences(task, 6, generator=generator(3))
    assert tokens.shape == (6, task.num_tokens, task.token_dim) and targets.shape == (6, 1)
    assert torch.all(tokens[:, -1, task.input_dim:] == 0)            # the query's label is masked
    # each prompt's labels are a linear map of its inputs: least squares recovers it exactly, and
    # the recovered maps differ from prompt to prompt
    recovered = []
    for i in range(6):
        x, y = tokens[i, :-1, : task.input_dim], tokens[i, :-1, task.input_dim]
        w = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)
        assert float(tokens[i, -1, : task.input_dim] @ w) == pytest.approx(float(targets[i, 0]), abs=1e-9)
        recovered.append(w)
    assert min(float((a - b).norm()) for i, a in enumerate(recovered) for b in recovered[i + 1:]) > 0.1
    # the exponential link: labels are exp(W t)
    exponential = RegressionTask.exponential()
    tokens, targets = new_task_sequences(exponential, 3, generator=generator(4))
    assert torch.all(tokens[:, :-1, exponential.input_dim] > 0) and torch.all(targets > 0)


def test_new_task_baselines_match_a_direct_computation():
    task = RegressionTask.linear()
    tokens, targets = new_task_sequences(task, 200, generator=generator(1))
    found = section5.new_task_baselines(task, tokens, targets, seed=0)
    y = targets[:, 0]
    x, labels, query = tokens[:, :-1, :11], tokens[:, :-1, 11], tokens[:, -1, :11]
    assert found["zero"] == pytest.approx(float((y ** 2).mean()))
    assert found["label_variance"] == pytest.approx(float(((y - y.mean()) ** 2).mean()))
    assert found["context_mean"] == pytest.approx(float(((labels.mean(1) - y) ** 2).mean()))
    # one step from w = 0: w1 = lr / N sum_i y_i x_i, the prediction w1 . x_q, lr chosen on other prompts
    step = found["one_gd_step_lr"] / labels.shape[1] * (labels.unsqueeze(-1) * x).sum(1)
    assert found["one_gd_step"] == pytest.approx(float((((step * query).sum(-1) - y) ** 2).mean()))
    tuning, tuning_targets = new_task_sequences(task, 1024, generator=generator(section5.ONE_STEP_TUNING))
    g = (tuning[:, :-1, 11].unsqueeze(-1) * tuning[:, :-1, :11]).mean(1).mul(tuning[:, -1, :11]).sum(-1)
    assert found["one_gd_step_lr"] == pytest.approx(float((g * tuning_targets[:, 0]).sum() / (g * g).sum()))
    assert found["least_squares"] < 1e-20                             # 15 demonstrations, 11 inputs, no noise
    assert found["one_gd_step"] < found["zero"]


def small(kind="linear", **changes):
    """A float64 study config small enough for a test."""
    config = study.StudyConfig(kind=kind, variants="pilot", seeds=(0, 1)).quick()
    config = replace(config, **{"epochs": 4, "steps_per_epoch": 3, "batch": 5, "num_features": 24, **changes})
    return replace(config.experiment(), dtype="float64")


def run(config, variants):
    records, _ = section5.run_experiments([config], progress=False, variants=[variants])
    return records[0]


NORMAL = section5.Variant("normal", Modification(), 1e-2)
G2 = section5.Variant("augmented", Modification(key_map="gelu"), 1e-2)


def test_a_model_in_the_ensemble_trains_as_it_would_alone():
    """Adam is elementwise and no weight is shared, so the normal model of seed 0 trained beside a
    g2 model and another seed ends where it ends alone (float64): curves, training losses and the
    losses at both run lengths."""
    together = run(small(), [NORMAL, G2])
    alone = run(replace(small(), seeds=(0,)), [NORMAL])
    mine = section5_claims.find_model(together, "normal", 0)
    theirs = alone["models"][0]
    for key in ("test_curve", "train_loss", "test_loss_by_length"):
        assert mine[key] == pytest.approx(theirs[key], rel=1e-10), key
    # and the modified model is another run: it does not end where the normal one does
    g2 = section5_claims.find_model(together, "g2=gelu", 0)
    assert not math.isclose(g2["test_loss"], mine["test_loss"], rel_tol=1e-6)


def test_the_half_length_run_is_a_separate_run_of_half_the_epochs(monkeypatch):
    """The shorter run is copied off at its own decay with Adam's state (moments and step count):
    its end equals a separate run of half the epochs, bit for bit in float64 up to round-off."""
    whole = run(small(epochs=4), [NORMAL])
    half = run(small(epochs=2), [NORMAL])
    for seed in (0, 1):
        long_run = section5_claims.find_model(whole, "normal", seed)
        short_run = section5_claims.find_model(half, "normal", seed)
        assert long_run["test_loss_by_length"][0] == pytest.approx(short_run["test_loss"], rel=1e-12)
    # a copy that started Adam afresh (its moments and step count lost) would be another run: the check can fail
    monkeypatch.setattr(torch.optim.Adam, "load_state_dict", lambda self, state: None)
    fresh = run(small(epochs=4), [NORMAL])
    assert fresh["models"][0]["test_loss_by_length"][0] != pytest.approx(half["models"][0]["test_loss"], rel=1e-6)


def test_every_prompt_of_a_training_step_has_its_own_task():
    """What the loop trains on: a batch of prompts per model and step, each drawn with its own W."""
    config = small()
    data, tests, finals = section5.seed_data(config, (0,))
    tokens, _ = data.epoch((0,), 8, torch.float64, "cpu")
    task = config.task
    maps = [torch.linalg.lstsq(tokens[0, i, :-1, :11], tokens[0, i, :-1, 11:]).solution for i in range(8)]
    assert min(float((a - b).norm()) for i, a in enumerate(maps) for b in maps[i + 1:]) > 0.1
    assert tests[0][0].shape == (config.test_sequences, task.num_tokens, task.token_dim)
    assert finals[0][0].shape[0] == config.final_test_sequences
    assert not data.fixed_task and section5.seed_data(section5.ExperimentConfig(seeds=(0,)), (0,))[0].fixed_task


def test_section5_configs_are_written_as_they_were():
    """The new-task fields at their Section 5 values are left out of a record's config, so the saved
    records and the sweep's journal (its configuration.json) match the current configs."""
    for kind, make in section5.EXPERIMENTS.items():
        plain = section5.plain_config(replace(make(deciding=1), seeds=(0,)))
        assert not {"protocol", "optimizer", "batch"} & set(plain)
        saved = ROOT / "book" / "data" / "experiments" / "journal" / kind / "configuration.json"
        assert json.loads(json.dumps(section5.journal_config(make()))) == json.loads(saved.read_text())["config"]
    assert {"protocol", "optimizer", "batch"} <= set(section5.plain_config(study.StudyConfig().experiment()))


def test_the_linear_claims_are_judged_again_under_the_protocol():
    fixed = [c for c in section5_claims.CLAIMS if c.task == "linear" and c.pairs is not None]
    assert [c.id for c in study.CLAIMS] == [f"{c.id}-new-task" for c in fixed]
    for ours, theirs in zip(study.CLAIMS, fixed):
        assert (ours.sentence, ours.kind, ours.direction, ours.quantity, ours.scope) == \
               (theirs.sentence, theirs.kind, theirs.direction, theirs.quantity, theirs.scope)
        assert ours.task == study.FAMILY and ours.other_reading is None
    # on a small record of the study's own variants every row finds its models
    config = small(epochs=2)
    record = run(config, study.StudyConfig().variant_list())
    record["speed_levels"] = dict(study.QUICK_LEVELS)
    rows = study.claims({"record": record})
    assert [r["id"] for r in rows] == [c.id for c in study.CLAIMS]
    assert all(r["protocol"] == study.PROTOCOL and r["fixed_task_id"] + "-new-task" == r["id"] for r in rows)
    g2 = next(r for r in rows if r["id"] == "linear-g2-faster-new-task")
    assert g2["settings"] == [["g2=gelu", "normal"], ["g2=gelu", "g1=gelu"], ["g2=gelu", "g1=gelu + g2=gelu"]]
    assert all(r["paper_learning_rate"] is None for r in rows)      # one learning rate: no paper's-rate note


def test_the_study_trains_every_model_the_linear_claims_name():
    names = {v.name for v in study.StudyConfig().variant_list()}
    assert {"normal", "normal twin", "alpha=-0.5", "alpha=-0.1", "alpha=0.1", "alpha=0.5", "g1=gelu", "g2=gelu",
            "g1=gelu + g2=gelu", "g2=mlp-gelu", "k=3 beta=0.1"} <= names
    assert not any("const" in n for n in names)                       # the primary reading only
    assert len({v.lr for v in study.StudyConfig().variant_list()}) == 1


def test_the_loop_refuses_what_it_cannot_do():
    ensemble = AttentionEnsemble(LayerConfig(token_dim=4, num_features=8), [Modification()], [0])
    optimizer = torch.optim.Adam(ensemble.parameters())
    data = section5.seed_data(replace(section5.ExperimentConfig(), task=RegressionTask(input_dim=3), seeds=(0,)),
                              (0,))[0]
    with pytest.raises(ValueError, match="compile"):
        train(ensemble, data, steps=1, epochs=1, lr=0.1, step_errors=squared_errors, optimizer=optimizer, compile=True)
    with pytest.raises(ValueError, match="compile"):
        train(ensemble, data, steps=1, epochs=1, lr=0.1, step_errors=squared_errors, batch=2, compile=True)
    with pytest.raises(ValueError, match="lr must be a number"):
        train(ensemble, data, steps=1, epochs=1, lr=torch.tensor([0.1]), step_errors=squared_errors,
              optimizer=optimizer)
    with pytest.raises(ValueError, match="batch"):
        train(ensemble, data, steps=1, epochs=1, lr=0.1, step_errors=squared_errors, batch=0)


@pytest.mark.parametrize("changes, named", [({"protocol": "many tasks"}, "protocol"), ({"optimizer": "lbfgs"}, "optimizer"),
                                            ({"batch": 0}, "batch"), ({"num_features": -1}, "num_features"),
                                            ({"optimizer": "adam", "lr_normal": 0.003}, "lr_normal"),
                                            ({"batch": 2, "tokens_per_epoch": 16}, "tokens_per_epoch")])
def test_a_bad_experiment_setting_is_refused_naming_it(changes, named):
    with pytest.raises(ValueError, match=named):
        replace(section5.ExperimentConfig(), **changes)


@pytest.mark.parametrize("field, value", [("kind", "cubic"), ("variants", "all"), ("seeds", (1, 1)), ("batch", 0),
                                          ("epochs", 1.5), ("lr", 0.0), ("lr", float("nan")), ("num_features", 0),
                                          ("checkpoints", -2)])
def test_a_bad_study_setting_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        replace(study.StudyConfig(), **{field: value})
    with pytest.raises(ValueError, match="claims"):
        study.StudyConfig(kind="exponential")
    with pytest.raises(ValueError, match="kinds"):
        study.PilotConfig(kinds=("cubic",))


def test_the_quick_study_and_pilot_run_end_to_end_redraw_and_join_the_claims_table(tmp_path):
    from icl_lens import claims_table
    from icl_lens.reproduce import reproduce

    out = tmp_path / "modifications_across_tasks"
    # device "auto" is the GPU where there is one, else the CPU, with the same code (issue 40, item 6)
    written = reproduce(["modifications-pilot", "modifications-across-tasks"], out=out, quick=True, log=None,
                        device="auto")
    saved = json.loads(written["modifications-across-tasks"]["json"].read_text())
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert all(where[0].startswith(expected) for where in saved["record"]["trained_on"].values())
    assert saved["record"]["protocol"] == study.PROTOCOL and saved["record"]["speed_scale"] == "curve"
    assert set(saved["record"]["speed_levels"]) == set(study.LEVEL_FRACTIONS)
    rows = json.loads(written["modifications-across-tasks claims"]["json"].read_text())["claims"]
    assert len(rows) == len(study.CLAIMS)
    pilot = json.loads(written["modifications-pilot"]["json"].read_text())
    assert set(pilot["records"]) == {"linear", "trigonometric", "exponential"}
    for record in pilot["records"].values():
        reading = study.learnable(record)
        assert set(reading["table"]) == {"1000", "1001"} and all(0 < row["zero"] for row in reading["table"].values())
        assert isinstance(reading["learns"], bool) and isinstance(reading["measurable"], bool)
    # each job is in the journal; --reuse redraws the same files without training
    assert len(list((out / "journal" / "modifications_across_tasks" / "linear").glob("seed0-1-*.json.gz"))) == 1
    before = {p.name: p.read_bytes() for p in out.glob("modifications_*")}
    reproduce(["modifications-pilot", "modifications-across-tasks"], out=out, quick=True, log=None, reuse=True)
    assert before == {p.name: p.read_bytes() for p in out.glob("modifications_*")}
    # the claims table takes the rows as a family of their own, each in its own group
    found = claims_table.new_task_rows(tmp_path)
    assert [r["id"] for r in found] == [c.id for c in study.CLAIMS]
    assert {claims_table.group_of(r) for r in found} == {claims_table.GROUPS[4][0]}
    assert all(r["section"] == "modifications_across_tasks" for r in claims_table.family(found))
    assert claims_table.new_task_rows(tmp_path / "elsewhere") == []
    # a saved verdict its record does not give is refused, naming the file
    claims_file = out / "modifications_across_tasks_claims.json"
    tampered = json.loads(claims_file.read_text())
    tampered["claims"][0]["verdict"] = "agrees" if tampered["claims"][0]["verdict"] != "agrees" else "disagrees"
    claims_file.write_text(json.dumps(tampered))
    with pytest.raises(ValueError, match="modifications_across_tasks_claims.json"):
        claims_table.new_task_rows(tmp_path)


def synthetic(first, curves, half_marks):
    """A task record holding only what the level rule reads: normal models with a first training
    loss and a test curve, the curve's label variance 2 on every seed."""
    return {"models": [{"group": "normal", "seed": seed, "train_loss": [2 * start], "test_curve": [2 * x for x in curve]}
                       for seed, (start, curve) in enumerate(zip(first, curves))],
            "baselines": {str(seed): {"curve_label_variance": 2.0} for seed in range(len(first))},
            "epochs": list(range(1, 2 * half_marks[-1] + 1)), "checkpoint_epochs": half_marks + [2 * half_marks[-1]]}


def test_the_speed_levels_follow_the_declared_rule():
    # median first loss 1.0; highest running minimum by half the run 0.7 (seed 1), seed 0 reaches 0.6
    record = synthetic([1.0, 1.2, 0.9], [[0.8, 0.6, 0.1], [0.9, 0.7, 0.1], [0.8, 0.65, 0.1]], [1, 2])
    levels = study.levels_from_pilot(record)
    for quantity, q in study.LEVEL_FRACTIONS.items():
        assert levels[quantity] == pytest.approx(1.0 ** (1 - q) * 0.7 ** q, rel=1e-12)
    assert levels["speed, early"] > levels["speed"] > levels["speed, late"] > 0.7
    # every normal model of the pilot reaches every level by half the run: a check that can fail
    record["baselines"]["1"]["curve_label_variance"] = 2.5   # seed 1 now reaches 0.56: seed 2 (0.65) is highest
    moved = study.levels_from_pilot(record)
    assert moved["speed"] == pytest.approx((0.96 * 0.65) ** 0.5, rel=1e-12)   # median first loss now 0.96
    # a normal layer that does not fall leaves no level to place
    with pytest.raises(ValueError, match="no speed level"):
        study.levels_from_pilot(synthetic([1.0], [[1.2, 1.1, 1.0]], [1, 2]))


def test_the_full_study_reads_its_levels_from_the_saved_pilot(monkeypatch, tmp_path):
    from icl_lens.results import RecordError, save_result

    monkeypatch.setattr("icl_lens.results.repository_root", lambda: tmp_path)
    with pytest.raises(RecordError, match="reproduce modifications-pilot"):
        study.pilot_levels()
    folder = tmp_path.joinpath(*study.PILOT)
    save_result(folder, "modifications_pilot", {"study": {"quick_sizes": True, "seeds": [1000]},
                                                "records": {"linear": {"speed_levels": {"speed": 0.8}}}})
    with pytest.raises(RecordError, match="quick run"):
        study.pilot_levels()
    save_result(folder, "modifications_pilot", {"study": {"quick_sizes": False, "seeds": [1000]},
                                                "records": {"linear": {"speed_levels": {"speed": 0.8}}}})
    assert study.pilot_levels() == {"speed": 0.8}


def test_the_pilot_rule_reads_learning_and_measurability(monkeypatch):
    row = {"trained layer": 0.7, "zero": 1.0, "context_mean": 1.05, "one_gd_step": 0.42, "least_squares": 0.0,
           "log_range_over_parts": 0.05, "label_tail_share": 0.02}
    table = {"0": dict(row), "1": dict(row)}
    monkeypatch.setattr(study, "learnability", lambda record: table)
    found = study.learnable({})
    assert found["learns"] and found["measurable"]         # above one GD step (0.42) and still learning
    table["1"]["trained layer"] = 1.0                        # within the band of the context mean on one seed
    assert not study.learnable({})["learns"]
    table["1"]["trained layer"] = 0.7
    table["0"]["label_tail_share"] = 0.6                     # a handful of prompts carries the labels' moment
    assert not study.learnable({})["measurable"]
    table["0"]["label_tail_share"] = 0.02
    table["0"]["log_range_over_parts"] = 0.3                 # a quarter of the test set moves the log loss by 0.3
    assert not study.learnable({})["measurable"]


def test_the_saved_pilot_fixes_the_levels_the_study_reads():
    """The saved pilot's levels are the declared rule applied to its normal models, and a saved
    study (once trained) read exactly those: it cannot have run on levels chosen after the pilot."""
    from icl_lens.results import load_result

    folder = ROOT.joinpath(*study.PILOT)
    pilot = load_result(folder, "modifications_pilot")
    assert not pilot["study"]["quick_sizes"] and pilot["study"]["seeds"] == list(study.PILOT_SEEDS)
    linear = pilot["records"]["linear"]
    assert linear["speed_levels"] == pytest.approx(study.levels_from_pilot(linear), rel=1e-12)
    assert study.pilot_levels() == linear["speed_levels"]
    # the pilot's sizes are the study's, seeds apart
    assert pilot["study"]["sizes"]["linear"] == {**asdict(study.StudyConfig(variants="pilot",
                                                                            seeds=study.PILOT_SEEDS)),
                                                 "seeds": list(study.PILOT_SEEDS)}
    saved = ROOT / "book" / "data" / "modifications_across_tasks" / "modifications_across_tasks.json"
    if saved.exists():
        assert json.loads(saved.read_text())["record"]["speed_levels"] == linear["speed_levels"]
    # the pilots' reading: what the chapter prints for each task
    readings = {kind: study.learnable(record) for kind, record in pilot["records"].items()}
    assert readings["linear"]["learns"] and readings["linear"]["measurable"]
