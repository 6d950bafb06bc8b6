"""The paper's in-context regression experiments (Section 5, Appendix E): Figs. 3 and 10-13.

One :class:`ExperimentConfig` per task, with the paper's settings where it gives them (math spec,
Section 9): one fixed task weight per seed, N + 1 = 16 / 128 / 512 tokens, 16384 tokens per epoch,
one sequence per SGD step, lr 0.003 for the normal and regularized models of the linear task and
0.005 otherwise, three seeds, d_r = 100 (d_t + d_s). The paper does not print its epoch count or its
alpha, k, beta grids; ours are stated in the config and chosen as follows: alpha from the BERT grid
{-0.5, -0.1, 0.1, 0.5}, k around the reported best k = 3, beta from the BERT grid {0.1, 0.2}, and the
combinations of Fig. 13 from alpha = 0.1, one GELU layer as g1 or g2, and k = 3 / beta = 0.1 (the
values the paper combines for BERT, with g2 added).

Every model of a task (all variants, all seeds) trains as one :class:`icl_lens.layers.AttentionEnsemble`:
model m sees its own seed's sequences, one per step, with its own learning rate.
"""

import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from icl_lens.attention import kernel_attention
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.dual import dual_model
from icl_lens.kernels import PositiveRandomFeatures
from icl_lens.layers import AttentionEnsemble, LayerConfig, Modification
from icl_lens.tasks import RegressionTask, sample_sequences, sample_task_weight
from icl_lens.validation import check_positive_int

@dataclass(frozen=True)
class ExperimentConfig:
    """One task's training runs; defaults are the linear task of Fig. 3."""

    task: RegressionTask = field(default_factory=RegressionTask.linear)
    epochs: int = 20                      # not printed in the paper; see the experiments chapter
    tokens_per_epoch: int = 16384
    seeds: tuple = (0, 1, 2)
    alphas: tuple = (-0.5, -0.1, 0.1, 0.5)
    negative_ks: tuple = (1, 3, 5)
    betas: tuple = (0.1, 0.2)
    augmentations: tuple = (("gelu", "none"), ("none", "gelu"), ("gelu", "gelu"), ("none", "mlp-gelu"))
    combinations: tuple = (
        Modification(alpha=0.1, value_map="gelu"),
        Modification(alpha=0.1, key_map="gelu"),
        Modification(value_map="gelu", negative_k=3, beta=0.1),
        Modification(key_map="gelu", negative_k=3, beta=0.1),
        Modification(alpha=0.1, negative_k=3, beta=0.1),
        Modification(alpha=0.1, value_map="gelu", negative_k=3, beta=0.1),
    )
    lr_normal: float = 0.003              # normal and regularized models
    lr_other: float = 0.005               # augmented, negative, combinations
    test_sequences: int = 64
    kernel: str = "performer"
    dtype: str = "float32"
    # quick mode: 512 steps an epoch on the linear task, enough to pass its early plateau
    quick_tokens_per_epoch: int = 8192

    def __post_init__(self):
        check_positive_int(self.epochs, "epochs")
        check_positive_int(self.test_sequences, "test_sequences")
        if self.tokens_per_epoch < self.task.num_tokens:
            raise ValueError(
                f"tokens_per_epoch ({self.tokens_per_epoch}) must hold at least one sequence of {self.task.num_tokens} tokens"
            )
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    @property
    def steps_per_epoch(self):
        return self.tokens_per_epoch // self.task.num_tokens

    @property
    def layer(self):
        return LayerConfig(token_dim=self.task.token_dim, kernel=self.kernel)

    def variants(self):
        """(group, Modification) for every model of one seed, normal model first."""
        listed = [("normal", Modification())]
        listed += [("regularized", Modification(alpha=a)) for a in self.alphas]
        listed += [("augmented", Modification(value_map=g1, key_map=g2)) for g1, g2 in self.augmentations]
        listed += [("negative", Modification(negative_k=k, beta=b)) for k in self.negative_ks for b in self.betas]
        listed += [("combination", m) for m in self.combinations]
        return listed

    def learning_rate(self, group):
        return self.lr_normal if group in ("normal", "regularized") else self.lr_other

    def quick(self):
        """Small sizes for tests and CI: 4 epochs of ``quick_tokens_per_epoch`` tokens, 16 test sequences
        per seed; every grid value is kept."""
        return replace(self, epochs=4, tokens_per_epoch=self.quick_tokens_per_epoch, test_sequences=16)


def linear_experiment():
    """Fig. 3 / Fig. 10: s = W t, d_t = 11, N + 1 = 16."""
    return ExperimentConfig()


def trigonometric_experiment():
    """Fig. 11: s = cos(W t), d_t = 7, N + 1 = 128, lr 0.005; the two-layer g2^+ uses ELU."""
    return ExperimentConfig(
        task=RegressionTask.trigonometric(),
        lr_normal=0.005,
        quick_tokens_per_epoch=2048,
        augmentations=(("gelu", "none"), ("none", "gelu"), ("gelu", "gelu"), ("none", "mlp-elu")),
    )


def exponential_experiment():
    """Fig. 12: s = exp(W t), d_t = 6, N + 1 = 512, settings of the trigonometric task."""
    return ExperimentConfig(task=RegressionTask.exponential(), lr_normal=0.005, quick_tokens_per_epoch=2048)


EXPERIMENTS = {"linear": linear_experiment, "trigonometric": trigonometric_experiment, "exponential": exponential_experiment}


class Progress:
    """A one-line progress bar on stderr (or silent with ``stream=None``)."""

    def __init__(self, total, label, stream=sys.stderr, width=28):
        self.total, self.label, self.stream, self.width = total, label, stream, width
        self.start, self.shown = time.perf_counter(), -1

    def update(self, done):
        if self.stream is None:
            return
        filled = self.width * done // self.total
        if filled == self.shown and done != self.total:
            return
        self.shown = filled
        elapsed = time.perf_counter() - self.start
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.label:<14} [{bar}] {done}/{self.total} {elapsed:6.1f} s")
        if done == self.total:
            self.stream.write("\n")
        self.stream.flush()


@dataclass
class TaskData:
    """The fixed task weight and the sequence stream of each seed."""

    task: RegressionTask
    weights: dict
    generators: dict

    def epoch(self, seeds, steps, dtype, device):
        """(models, steps, n, d) tokens and (models, steps, d_s) targets: seed seeds[m]'s stream for model m."""
        drawn = {s: sample_sequences(self.task, steps, self.weights[s], generator=self.generators[s]) for s in sorted(self.weights)}
        tokens = torch.stack([drawn[s][0] for s in seeds]).to(dtype=dtype, device=device)
        targets = torch.stack([drawn[s][1] for s in seeds]).to(dtype=dtype, device=device)
        return tokens, targets


def task_data(task, seeds):
    """Seed s draws its task weight W and then its sequences from generator(s), on cpu in float64."""
    generators = {s: make_generator(s) for s in sorted(set(seeds))}
    weights = {s: sample_task_weight(task, generator=generators[s]) for s in generators}
    return TaskData(task, weights, generators)


def squared_errors(ensemble, tokens, targets):
    """Per-model mean over the batch of |s_hat - s|^2, s_hat the label part of the query's output."""
    output_dim = targets.shape[-1]
    predictions = ensemble(tokens)[..., -output_dim:]
    return ((predictions - targets) ** 2).sum(-1).mean(-1)


def train(ensemble, data, *, steps, epochs, lr, progress=None, step_errors=squared_errors):
    """SGD, one sequence per model per step; returns the per-epoch mean training loss, (epochs, models).

    A model whose loss stops being finite gets nan from then on; the other models are unaffected,
    since no weight is shared. ``step_errors`` may be a compiled :func:`squared_errors`.
    """
    dtype, device = ensemble.W_Q.dtype, ensemble.W_Q.device
    history = []
    for epoch in range(epochs):
        tokens, targets = data.epoch(ensemble.seeds, steps, dtype, device)
        total = torch.zeros(ensemble.num_models, dtype=dtype, device=device)
        for step in range(steps):
            errors = step_errors(ensemble, tokens[:, step : step + 1], targets[:, step : step + 1])
            errors.sum().backward()
            ensemble.sgd_step(lr)
            total += errors.detach()
            if progress is not None:
                progress.update(epoch * steps + step + 1)
        history.append(total.to(torch.float64) / steps)
    return torch.stack(history)


def test_loss(ensemble, data, num_sequences):
    """Mean squared error of each model on fresh sequences of its seed, without training."""
    dtype, device = ensemble.W_Q.dtype, ensemble.W_Q.device
    tokens, targets = data.epoch(ensemble.seeds, num_sequences, dtype, device)
    # keep the (models, chunk, tokens, d_r) exponent near 2^22 numbers
    chunk = max(1, 2**22 // (ensemble.num_models * tokens.shape[2] * ensemble.omega.shape[1]))
    with torch.no_grad():
        parts = [
            squared_errors(ensemble, tokens[:, i : i + chunk], targets[:, i : i + chunk]) * tokens[:, i : i + chunk].shape[1]
            for i in range(0, num_sequences, chunk)
        ]
    return (torch.stack(parts).sum(0) / num_sequences).to(torch.float64)


def equivalence_curve(ensemble, model, data, seed):
    """Fig. 3 (left) for a trained model: its dual model trained one demonstration at a time.

    On a fresh sequence of the model's task, in float64, returns the squared distance between the
    layer's kernel-attention output for the query and the dual prediction after t = 0..N
    per-demonstration SGD steps (Theorem 3.1 says it is round-off at t = N).
    """
    weights = {name: getattr(ensemble, name)[model].detach().to(torch.float64).cpu() for name in ("W_Q", "W_K", "W_V")}
    feature_map = PositiveRandomFeatures(ensemble.omega[model].to(torch.float64).cpu())
    tokens, _ = sample_sequences(data.task, 1, data.weights[seed], generator=make_generator(1_000_000 + seed))
    X = tokens[0]
    dual = dual_model(X[:-1], X[-1:], weights["W_Q"], weights["W_K"], weights["W_V"], feature_map)
    attention = kernel_attention(X[-1:], X, weights["W_Q"], weights["W_K"], weights["W_V"], feature_map=feature_map)[0]
    predictions = dual.predict(dual.sgd_trajectory(), dual.test_input)
    return {"steps": list(range(len(predictions))), "squared_error": ((predictions - attention) ** 2).sum(-1).tolist()}


def run_experiment(config, *, device="cpu", progress=True, compile=False, variants=None):
    """Train every variant of ``config`` for every seed as one ensemble; return a JSON-ready dict.

    ``compile=True`` runs the training step through ``torch.compile`` (same math, fused kernels: 2-4x
    faster than eager on 2 CPU cores in benchmarks/batched_training.py, after seconds of compilation;
    float32 round-off differs from the eager path). ``variants`` replaces ``config.variants()``, a list of (group, Modification).
    """
    device = pick(device)
    dtype = getattr(torch, config.dtype)
    variants = config.variants() if variants is None else variants
    models = [(group, modification, seed) for seed in config.seeds for group, modification in variants]
    ensemble = AttentionEnsemble(
        config.layer, [m for _, m, _ in models], [s for _, _, s in models], dtype=dtype, device=device
    )
    data = task_data(config.task, config.seeds)
    lr = torch.tensor([config.learning_rate(group) for group, _, _ in models], dtype=dtype, device=device)
    bar = Progress(config.epochs * config.steps_per_epoch, config.task.kind) if progress else None
    step_errors = torch.compile(squared_errors, dynamic=False) if compile else squared_errors
    history = train(ensemble, data, steps=config.steps_per_epoch, epochs=config.epochs, lr=lr, progress=bar,
                    step_errors=step_errors)
    tested = test_loss(ensemble, data, config.test_sequences)
    equivalence = {}
    for seed in config.seeds:
        normal = next(i for i, (group, _, s) in enumerate(models) if group == "normal" and s == seed)
        equivalence[str(seed)] = equivalence_curve(ensemble, normal, data, seed)
    return {
        "task": config.task.kind,
        "config": plain_config(config),
        "compiled": bool(compile),
        "epochs": list(range(1, config.epochs + 1)),
        "models": [
            {
                "group": group,
                "name": modification.name,
                "seed": seed,
                "modification": asdict(modification),
                "lr": config.learning_rate(group),
                "train_loss": [finite_or_none(x) for x in history[:, i].tolist()],
                "test_loss": finite_or_none(float(tested[i])),
            }
            for i, (group, modification, seed) in enumerate(models)
        ],
        "equivalence": equivalence,
    }


def finite_or_none(value):
    """JSON has no nan: a diverged loss is written as null."""
    return value if math.isfinite(value) else None


def plain_config(config):
    plain = asdict(config)
    plain["steps_per_epoch"] = config.steps_per_epoch
    plain["num_features"] = config.layer.features
    return plain


def curves(result, group, seed=None):
    """{name: (seeds, epochs) tensor of training losses} for one group (nan where a run diverged)."""
    found = {}
    for model in result["models"]:
        if model["group"] == group and (seed is None or model["seed"] == seed):
            losses = [math.nan if x is None else x for x in model["train_loss"]]
            found.setdefault(model["name"], []).append(losses)
    return {name: torch.tensor(rows, dtype=torch.float64) for name, rows in found.items()}


def summary_rows(result):
    """One row per variant: final-epoch training loss over the seeds that stayed finite (mean, min,
    max), how many seeds diverged, mean test loss, and on how many seeds the test loss is at least 1%
    below the normal model's of the same seed (same task weight, data and initial weights: a paired
    comparison; the 1% keeps float32 round-off from counting as a difference)."""
    normal = {m["seed"]: m["test_loss"] for m in result["models"] if m["group"] == "normal"}
    rows = {}
    for model in result["models"]:
        row = rows.setdefault((model["group"], model["name"]), {"group": model["group"], "name": model["name"],
                                                                "final": [], "test": [], "below_normal": 0})
        final, test = model["train_loss"][-1], model["test_loss"]
        finite = final is not None and test is not None
        row["final"].append(final if finite else math.nan)
        row["test"].append(test if finite else math.nan)
        row["below_normal"] += int(finite and normal[model["seed"]] is not None and test < 0.99 * normal[model["seed"]])
    for row in rows.values():
        finals, tests = torch.tensor(row.pop("final"), dtype=torch.float64), torch.tensor(row.pop("test"), dtype=torch.float64)
        kept = torch.isfinite(finals)
        row.update(seeds=len(finals), diverged=int((~kept).sum()))
        if kept.any():
            row.update(final_mean=float(finals[kept].mean()), final_min=float(finals[kept].min()),
                       final_max=float(finals[kept].max()), test_mean=float(tests[kept].mean()))
        else:
            row.update(final_mean=math.nan, final_min=math.nan, final_max=math.nan, test_mean=math.nan)
    return list(rows.values())


def markdown_table(rows, digits=3):
    """The rows of :func:`summary_rows` as a Markdown table."""
    lines = ["| group | model | final training loss: mean [min, max] | test loss | seeds 1% below normal | diverged |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        below = "" if r["group"] == "normal" else f"{r['below_normal']} of {r['seeds']}"
        diverged = f"{r['diverged']} of {r['seeds']}" if r["diverged"] else ""
        lines.append(f"| {r['group']} | {r['name']} | {r['final_mean']:.{digits}g} [{r['final_min']:.{digits}g}, "
                     f"{r['final_max']:.{digits}g}] | {r['test_mean']:.{digits}g} | {below} | {diverged} |")
    return "\n".join(lines)


def equivalence_gaps(records):
    """{(task, seed): (squared gap at t = 0, at t = N)} of the equivalence curves of task records."""
    return {(kind, seed): (curve["squared_error"][0], curve["squared_error"][-1])
            for kind, record in records.items() for seed, curve in record["equivalence"].items()}


def describe_config(config):
    """The choices the paper leaves open, as a Markdown list, from a task record's config."""
    return "\n".join([
        f"- epochs: **{config['epochs']}** (the normal model of the linear task levels off after about 10)",
        f"- regularized: alpha in {config['alphas']} (the paper's BERT grid)",
        f"- augmented: (g1, g2) in {config['augmentations']}; 'gelu' is $\\sigma(Wx+b)$, 'mlp-*' two layers "
        "(ELU in the trigonometric task, as the paper says)",
        f"- negative samples: k in {config['negative_ks']}, beta in {config['betas']} "
        "(around the reported best k = 3, beta = 0.1)",
        f"- seeds: {config['seeds']}; a seed fixes the task weight, the data stream and the initial layer, so "
        "the variants of one seed start from the same weights and see the same sequences",
    ])
