"""The one table of every empirical claim: its rows and fields, three rows recomputed from the raw
records with arithmetic of their own, the family correction, the saved file kept in step with the
records, and the command line."""

import json
import math
import shutil

import pytest

from icl_lens import claims_table, statistics
from icl_lens.__main__ import main
from icl_lens.results import repository_root

DATA = repository_root() / "book" / "data"


@pytest.fixture(scope="module")
def rows():
    return claims_table.every_claim()


def by_id(rows):
    return {row["id"]: row for row in rows}


def test_every_row_has_the_fields_and_a_verdict_in_the_vocabulary(rows):
    assert all(tuple(row) == claims_table.FIELDS for row in rows)
    judged = [row for row in rows if row["verdict"] != "not run"]
    assert {row["verdict"] for row in judged} <= set(claims_table.VOCABULARY) == {"agrees", "disagrees",
                                                                                   "inconclusive"}
    assert len(judged) >= 65 and len({row["id"] for row in rows}) == len(rows)
    assert {row["paper"] for row in rows} == {"R&L", "Li et al."}
    assert sum(row["quantity"].startswith("speed") for row in judged) >= 5
    for row in judged:
        if row["p"] is None:          # a threshold of its own: no seeds to test
            continue
        assert row["kind"] in statistics.KINDS + ("unstable",) and row["scope"] in ("every", "some"), row["id"]
        assert row["n"] >= 1
        if row["verdict"] != "inconclusive":
            assert row["p"] <= 0.05 and (row["coverage"] is None or row["coverage"] >= 0.95), row["id"]
        else:
            assert row["why"], row["id"]      # and seeds_needed: simulated, None meaning more than 100
    # the rows that cannot be run are listed apart, with the reason
    apart = [row for row in rows if row["verdict"] == "not run"]
    assert apart and all(row["why"] and row["p"] is None for row in apart)
    # no seed is set apart for a reason found after training: only the screen, decided before
    for row in judged:
        for reason in (row["seeds_apart"] or {}).values():
            assert reason.startswith("fails the screen"), row["id"]


def test_three_rows_recomputed_from_the_raw_records(rows):
    found = by_id(rows)
    # 1. trigonometric-negative-worse: each negative-sample model's final loss against the normal
    # model's, seeds that pass the screen, log ratios; "worse" on every setting
    record = json.loads((DATA / "experiments" / "task_trigonometric.json").read_text())
    seeds = [int(s) for s, screen in record["screening"].items() if screen["passes"]]

    def disagreeing(length):
        """p of disagreeing at one run length, and the settings' median log ratios."""
        at = record["run_lengths"].index(length)
        loss = {(m["name"], m["seed"]): m["test_loss_by_length"][at] for m in record["models"]}
        p_values, effects = [], []
        for name in ("k=3 beta=0.1", "k=5 beta=0.1"):
            x = sorted(math.log(loss[name, s] / loss["normal", s]) for s in seeds)
            n = len(x)
            effects.append((x[(n - 1) // 2] + x[n // 2]) / 2)
            below_band = sum(v < math.log(1.1) for v in x)
            p_values.append(sum(math.comb(n, j) for j in range(below_band, n + 1)) / 2 ** n)
        # disagreeing needs one of the two settings to have its median below the band: a union of
        # two tests, each at 0.025, so p = 2 x the smaller; agreeing needs both worse by the band
        return min(1.0, 2 * min(p_values)), effects

    p_end, effects = disagreeing(len(record["epochs"]))
    p_half, _ = disagreeing(len(record["epochs"]) // 2)
    row = found["trigonometric-negative-worse"]
    # decided at the end and at half of training alike; the row's p is the larger of the two
    decided = p_end <= 0.05 and p_half <= 0.05
    assert row["verdict"] == ("disagrees" if decided else "inconclusive")
    if row["verdict"] == "disagrees":
        assert row["p"] == pytest.approx(max(p_end, p_half))
    assert any(row["effect"] == pytest.approx(e) for e in effects)
    # 2. table1-negative: negative samples against the normal model on the stand-in, accuracy at 5 epochs
    table = json.loads((DATA / "table1" / "table1.json").read_text())
    accuracy = {(r["setting"], r["seed"]): r["validation"][-1][table["metric"]] for r in table["runs"]
                if r["epochs"] == table["study"]["epochs"]}
    worse = [accuracy["normal", s] - accuracy["r=0.2 beta=0.1", s] for s in table["study"]["seeds"]]
    row = found["table1-negative"]
    n = len(worse)
    assert row["effect"] == pytest.approx(sorted(worse)[n // 2])
    below_band = sum(v < 0.01 for v in worse)
    assert row["p"] == pytest.approx(sum(math.comb(n, j) for j in range(below_band, n + 1)) / 2 ** n)
    assert row["verdict"] == ("disagrees" if row["p"] <= 0.05 else "inconclusive")
    # 3. li-model-cos-rises-n25: Model Cos at the last checkpoint minus the first, per seed
    closeness = json.loads((DATA / "closeness" / "closeness.json").read_text())
    rises = sorted(r["model_cos"][-1] - r["model_cos"][0] for r in closeness["lengths"]["25"]["softmax"])
    row = found["li-model-cos-rises-n25"]
    n = len(rises)
    above = sum(v > 0 for v in rises)
    p = sum(math.comb(n, j) for j in range(above, n + 1)) / 2 ** n
    assert row["effect"] == pytest.approx(rises[n // 2]) and row["p"] == pytest.approx(p)
    assert row["lower"] == pytest.approx(rises[0]) and row["upper"] == pytest.approx(rises[-1])   # k = 1 at n = 5
    assert row["verdict"] == ("agrees" if p <= 0.05 and rises[n // 2] >= 0.01 else "inconclusive")


def test_family_correction_over_the_rows(rows):
    """Both tests of every comparative row enter Benjamini-Yekutieli unless their smallest attainable
    p cannot pass its largest threshold; a row survives only with its deciding test's adjusted p <= 0.05.
    Each family (the main one, the new-task protocol's) is corrected on its own."""
    for new_task in (False, True):
        members = claims_table.in_family(rows, new_task)
        comparative = [row for row in members if row["p"] is not None]
        m = 2 * len(comparative)
        largest_threshold = 0.05 / sum(1 / i for i in range(1, m + 1)) if m else 0.0
        # with every n at 5, no test can reach that threshold: the family is empty and nothing survives
        if all(row["n"] <= 5 for row in comparative):
            assert 0.5 ** 5 > largest_threshold
            assert all(row["p_family"] is None and row["survives_family"] is None for row in members)
        for row in members:
            if row["survives_family"]:
                assert row["verdict"] != "inconclusive" and row["p_family"] <= 0.05
        assert claims_table.surviving(rows, new_task) == {
            verdict: sum(bool(r["survives_family"]) and r["verdict"] == verdict for r in members)
            for verdict in ("agrees", "disagrees")}


def test_saved_table_is_the_table_of_the_saved_records(rows):
    assert claims_table.saved() == json.loads(json.dumps(rows))


def test_a_stale_saved_table_is_refused_with_the_claim_named(tmp_path):
    shutil.copytree(DATA, tmp_path / "data", ignore=shutil.ignore_patterns("*.png"))
    path = tmp_path / "data" / "claims.json"
    table = json.loads(path.read_text())
    table["claims"][1]["verdict"] = "disagrees" if table["claims"][1]["verdict"] != "disagrees" else "agrees"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=table["claims"][1]["id"]):
        claims_table.saved(path)


def test_why_an_inconclusive_row_is_inconclusive():
    four = {"n": 4, "k": 1, "cannot_decide": True, "lower": None, "upper": None, "smallest_agree": 1 / 16,
            "smallest_disagree": 1 / 16}
    assert "cannot decide at n = 4" in claims_table.why_inconclusive(four, "inconclusive", "inconclusive")
    five = {"n": 5, "k": 1, "cannot_decide": False, "lower": -1.0, "upper": 1.0, "effect": 0.0,
            "smallest_agree": 1 / 32, "smallest_disagree": 1 / 32}
    assert claims_table.why_inconclusive(five, "agrees", "inconclusive") == \
        "agrees at the end, inconclusive at half of training"
    assert "reach both sides" in claims_table.why_inconclusive(five, "inconclusive", "inconclusive")
    within = dict(five, lower=0.01, upper=0.5, effect=0.05)
    assert "within the band" in claims_table.why_inconclusive(within, "inconclusive", "inconclusive",
                                                              kind="directional", band=0.1)
    chosen = dict(five, k=2, smallest_agree=2 / 32)
    assert "agreeing cannot reach 0.05" in claims_table.why_inconclusive(chosen, "inconclusive", "inconclusive")


def test_claims_command_prints_each_row_with_its_id_and_the_counts(capsys, tmp_path, rows):
    main(["claims"])
    printed = capsys.readouterr().out
    table = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(table) == len(rows) + 1          # the header and one line a claim
    assert all(f"`{row['id']}`" in printed for row in rows)
    found = claims_table.counts(rows)
    assert f"agrees {found['agrees']}, disagrees {found['disagrees']}" in printed and "Benjamini-Yekutieli" in printed
    with pytest.raises(SystemExit) as stopped:
        main(["claims", "--data", str(tmp_path / "nowhere")])
    assert stopped.value.code == 2
    assert "--data" in capsys.readouterr().err


def test_claims_rerun_judges_one_study_again_from_its_saved_record(capsys, tmp_path):
    """--rerun table1 rewrites that study's saved claims from its record (no training): a verdict
    tampered with in the copy comes back; --train without --rerun is refused."""
    shutil.copytree(DATA, tmp_path / "data", ignore=shutil.ignore_patterns("*.png"))
    claims = tmp_path / "data" / "table1" / "table1_claims.json"
    before = claims.read_text()
    tampered = json.loads(before)
    tampered["claims"][0]["verdict"] = "tampered"
    claims.write_text(json.dumps(tampered))
    main(["claims", "--data", str(tmp_path / "data"), "--rerun", "table1"])
    assert json.loads(claims.read_text()) == json.loads(before)
    assert "no regularized setting beats" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["claims", "--train"])
    assert "--rerun" in capsys.readouterr().err


def test_a_saved_verdict_its_record_does_not_give_is_refused(capsys, tmp_path):
    """The claims command recomputes each study's verdicts from its record before printing: a saved
    Section 5 or Table 1 verdict changed by hand ends in exit 2 naming the file and the claim."""
    for study, file, key in (("experiments", "claims.json", "linear-g2-plus-faster-late"),
                             ("experiments", "claims.json", "random-features-majority"),
                             ("table1", "table1_claims.json", "table1-small-alpha")):
        data = tmp_path / f"{study}-{key}"
        shutil.copytree(DATA, data, ignore=shutil.ignore_patterns("*.png"))
        path = data / study / file
        saved = json.loads(path.read_text())
        claim = next(c for c in saved["claims"] if c["id"] == key)
        claim["verdict"] = "agrees" if claim["verdict"] != "agrees" else "disagrees"
        path.write_text(json.dumps(saved))
        with pytest.raises(SystemExit) as stopped:
            main(["claims", "--data", str(data)])
        assert stopped.value.code == 2
        error = capsys.readouterr().err
        assert claim["id"] in error and file in error


def test_an_exact_identity_is_checked_by_its_verdict_not_its_round_off():
    """The round-off an exact identity measures moves with the machine's arithmetic, so a saved
    measurement five times the recomputed one passes; a changed verdict or tolerance does not, and
    on a statistical row a changed number is refused with the field named."""
    from icl_lens.claims_table import check_saved

    exact = {"id": "identity", "rule": "exact", "verdict": "agrees",
             "measurement": {"worst_relative_squared_gap": 7.0e-31, "tolerance": 1e-20, "layers": 20}}
    saved = json.loads(json.dumps(exact))
    saved["measurement"]["worst_relative_squared_gap"] = 3.7e-30
    check_saved([saved], [exact], "claims.json", "rewrite")
    for field, value in (("verdict", "disagrees"), ("tolerance", 1e-10)):
        wrong = json.loads(json.dumps(exact))
        if field == "verdict":
            wrong["verdict"] = value
        else:
            wrong["measurement"]["tolerance"] = value
        with pytest.raises(ValueError, match=field):
            check_saved([wrong], [exact], "claims.json", "rewrite")
    paired = {"id": "paired", "rule": "paired", "verdict": "agrees", "measured": {"effect": 0.2}}
    moved = {**paired, "measured": {"effect": 0.2000001}}
    with pytest.raises(ValueError, match="differing: measured"):
        check_saved([moved], [paired], "claims.json", "rewrite")


def test_a_bar_in_a_claim_does_not_split_its_row(rows):
    """Claims may write |alpha|: every line of every grouped table keeps the header's cells."""
    import re

    text = claims_table.markdown([row for row in rows if row["verdict"] != "not run"])
    assert any("\\|alpha\\|" in line for line in text.splitlines())
    for line in text.splitlines():
        if line.startswith("|"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 6, line


def test_the_new_task_family_folds_under_its_counts(rows):
    """The claims page shows the new-task family's counts and folds its rows into a dropdown; the
    other groups stay open."""
    from icl_lens.studies import modifications_across_tasks

    judged = [row for row in claims_table.in_family(rows) if row["verdict"] != "not run"]
    linear = [row for row in judged if row["task"] == "linear"][:3]
    moved = [{**row, "task": modifications_across_tasks.FAMILY, "id": row["id"] + "-new-task"} for row in linear]
    text = claims_table.markdown(judged + moved)
    name = claims_table.GROUPS[4][0]
    block = text.split(f"### {name}")[1].split("### ")[0]
    verdicts = [row["verdict"] for row in moved]
    for verdict in set(verdicts):
        assert f"{verdicts.count(verdict)} {verdict}" in block
    assert ":::{admonition} Its 3 rows\n:class: dropdown" in block and block.rstrip().endswith(":::")
    assert sum(line.startswith("| [") for line in block.splitlines()) == 3
    # the fixed-task linear group is not folded
    first = text.split(f"### {claims_table.GROUPS[0][0]}")[1].split("### ")[0]
    assert "dropdown" not in first


def test_a_random_feature_row_says_where_its_error_rises():
    """An error that falls by more than the band overall but rises at one step is inconclusive,
    and the row names that step instead of "between the rule's two thresholds"."""
    from icl_lens.studies.trained_layer_claims import random_feature_claim

    study = {"feature_counts": [10, 100, 300, 1000], "attention_mse": [0.04, 0.035, 0.036, 0.03]}
    claim = random_feature_claim(study)
    assert claim["verdict"] == "inconclusive"
    row = claims_table.threshold_row(claim)
    assert row["why"] == ("it falls by more than the band overall but not at every step: "
                          "0.035 at d_r = 100 to 0.036 at 300")
    falling = random_feature_claim(dict(study, attention_mse=[0.04, 0.036, 0.035, 0.03]))
    assert falling["verdict"] == "agrees" and "why" not in claims_table.threshold_row(falling)


def test_the_temperature_verdict_names_the_seeds_it_was_read_at(rows):
    """The temperature check is a study of its own seeds, not the table's: its verdict beside a row
    says how many it ran."""
    check = json.loads((DATA / "experiments" / "temperature.json").read_text())
    seeds = len(check["record"]["config"]["seeds"])
    found = by_id(rows)
    for claim in check["claims"]:
        assert found[claim["id"]]["without_temperature"] == f"{claim['without']['verdict']} (at its {seeds} seeds)"
