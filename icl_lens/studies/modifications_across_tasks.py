"""R&L's attention modifications where in-context learning happens: the Section 5 layer trained with
a new task weight W for every prompt (the pilot of the study; the fixed-task protocol is
:mod:`icl_lens.studies.section5`).

Chapters: none (a pilot: its chapter comes with the study).

R&L train each modified layer on one fixed task per seed (Sec. 5, App. E.1) and leave "the
multi-task scenario" open. Here the same layer, :class:`icl_lens.training.ensemble.AttentionEnsemble`
with the same :class:`~icl_lens.training.ensemble.Modification` switches (one implementation of
each modification for both protocols), trains on prompts whose task weight is drawn afresh for each
prompt, with Adam on batches of prompts (the across-tasks chapter found one sequence per SGD step
too slow to leave the plateau). Each seed fixes the initial layer, the training prompts and the test
prompts; every model of a seed sees the same prompts, so models are compared seed by seed.

The pilot measures, for the normal layer and one modified layer, the time per step and the test
loss over training against the training-free baselines (zero, the context mean, one gradient step
at its best learning rate, least squares), so that the study's steps, batch and learning rate are
fixed before any verdict is computed.
"""

import time
from dataclasses import dataclass, field

import torch

from icl_lens import baselines
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.tasks import LINKS, RegressionTask
from icl_lens.training.ensemble import AttentionEnsemble, LayerConfig, Modification, squared_errors, test_loss
from icl_lens.validation import check_positive_float, check_positive_int, check_seeds

# the generators of a seed: its training prompts (the seed itself), its test prompts and the
# prompts that choose one gradient step's learning rate (the layer's is 10_000 + seed)
TEST_PROMPTS, TUNING_PROMPTS = 6_000_000, 7_000_000


@dataclass(frozen=True)
class PilotConfig:
    """One pilot run: every variant for every seed, trained as one ensemble with Adam."""

    task: RegressionTask = field(default_factory=RegressionTask.linear)
    variants: tuple = (Modification(), Modification(key_map="gelu"))   # normal and g2
    seeds: tuple = (0, 1)
    batch: int = 64                 # prompts per step, each with its own task weight
    steps: int = 2000
    lr: float = 1e-3                # Adam
    checkpoints: int = 20
    test_prompts: int = 1024
    num_features: int = None        # None: 100 * token_dim, as Section 5
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("batch", "steps", "checkpoints", "test_prompts"):
            check_positive_int(getattr(self, name), name)
        check_positive_float(self.lr, "lr")
        check_seeds(self.seeds)
        if not self.variants or not all(isinstance(v, Modification) for v in self.variants):
            raise ValueError("variants must hold at least one Modification")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    def quick(self):
        """Small sizes for tests and CI (seconds)."""
        return PilotConfig(task=self.task, variants=self.variants, seeds=self.seeds[:2], batch=16, steps=40,
                           lr=self.lr, checkpoints=4, test_prompts=64, num_features=self.num_features,
                           dtype=self.dtype)


def new_task_sequences(task, count, *, generator=None):
    """``count`` sequences of ``task``, each with its own task weight W ~ N(0, 1) (float64, cpu):
    tokens (count, num_tokens, token_dim) with the query's label 0, targets (count, output_dim)."""
    check_positive_int(count, "count")
    weights = torch.randn(count, task.output_dim, task.input_dim, generator=generator, dtype=torch.float64)
    uniform = torch.rand(count, task.num_tokens, task.input_dim, generator=generator, dtype=torch.float64)
    inputs = task.input_low + (task.input_high - task.input_low) * uniform
    labels = LINKS[task.kind](inputs @ weights.transpose(-1, -2))
    targets = labels[:, -1, :].clone()
    labels[:, -1, :] = 0.0
    return torch.cat([inputs, labels], dim=-1), targets


def baseline_losses(task, tokens, targets, tuning_tokens, tuning_targets):
    """The training-free predictors' test MSE on one seed's prompts (float64): zero (the label
    variance, W ~ N(0, I) has mean 0), the context mean, one gradient step from 0 at its best
    learning rate (chosen on the tuning prompts) and least squares on the prompt."""
    def split(sequences):
        inputs, labels = sequences[..., : task.input_dim], sequences[..., task.input_dim]
        return inputs[:, :-1], labels[:, :-1], inputs[:, -1]

    x_context, y_context, x_query = split(tokens)
    y = targets[:, 0]
    lr_star = baselines.optimal_one_step_lr(*split(tuning_tokens), tuning_targets[:, 0])
    predictions = {"zero": torch.zeros_like(y), "context mean": baselines.context_mean(x_context, y_context, x_query),
                   "one GD step (lr*)": baselines.one_step_gd(x_context, y_context, x_query, lr_star),
                   "least squares": baselines.least_squares(x_context, y_context, x_query)}
    found = {name: float(((p - y) ** 2).mean()) for name, p in predictions.items()}
    return {**found, "label_variance": float((y ** 2).mean()), "lr_star": float(lr_star)}


def run_pilot(config, *, device="cpu", progress=False):
    """Train every variant of ``config`` for every seed; return a JSON-ready record: per model the
    test MSE at the checkpoints (the seed's fixed test prompts), per seed the baselines, and the
    seconds per step."""
    device = pick(device)
    dtype = getattr(torch, config.dtype)
    models = [(variant, seed) for seed in config.seeds for variant in config.variants]
    layer = LayerConfig(token_dim=config.task.token_dim, num_features=config.num_features)
    ensemble = AttentionEnsemble(layer, [v for v, _ in models], [s for _, s in models], dtype=dtype, device=device)
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=config.lr)
    streams = {s: make_generator(s) for s in config.seeds}
    tests = {s: new_task_sequences(config.task, config.test_prompts, generator=make_generator(TEST_PROMPTS + s))
             for s in config.seeds}
    tuning = {s: new_task_sequences(config.task, config.test_prompts, generator=make_generator(TUNING_PROMPTS + s))
              for s in config.seeds}
    seed_of = [s for _, s in models]

    def stacked(per_seed, part):
        return torch.stack([per_seed[s][part] for s in seed_of]).to(dtype=dtype, device=device)

    test_tokens, test_targets = stacked(tests, 0), stacked(tests, 1)
    marks = sorted({max(1, config.steps * j // config.checkpoints) for j in range(1, config.checkpoints + 1)})
    curve, train_loss, started = [], [], time.perf_counter()
    for step in range(1, config.steps + 1):
        drawn = {s: new_task_sequences(config.task, config.batch, generator=streams[s]) for s in config.seeds}
        errors = squared_errors(ensemble, stacked(drawn, 0), stacked(drawn, 1))
        optimizer.zero_grad(set_to_none=True)
        errors.sum().backward()
        optimizer.step()
        train_loss.append(errors.detach().to(torch.float64))
        if step in marks:
            curve.append(test_loss(ensemble, test_tokens, test_targets))
    seconds = time.perf_counter() - started
    curve = torch.stack(curve).T
    return {
        "config": {"task": config.task.kind, "variants": [v.name for v in config.variants], "seeds": list(config.seeds),
                   "batch": config.batch, "steps": config.steps, "lr": config.lr, "optimizer": "adam",
                   "test_prompts": config.test_prompts, "num_features": layer.features, "dtype": config.dtype},
        "checkpoint_steps": marks,
        "models": [{"name": v.name, "seed": s, "test_curve": [float(x) for x in curve[i]],
                    "train_loss": [float(x) for x in torch.stack(train_loss)[:, i]]}
                   for i, (v, s) in enumerate(models)],
        "baselines": {str(s): baseline_losses(config.task, *tests[s], *tuning[s]) for s in config.seeds},
        "seconds_per_step": seconds / config.steps,
        "device": str(device), "threads": torch.get_num_threads(),
    }

