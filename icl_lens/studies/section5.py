"""The Section 5 study: R&L's in-context regression experiments (Section 5, Appendix E), Figs. 3
and 6-13, trained and recorded; a record is read by :mod:`icl_lens.studies.section5_readings` and
its claims are judged in :mod:`icl_lens.studies.section5_claims`.

Chapters: experiments.

One :class:`ExperimentConfig` per task, with the paper's settings where it gives them (math spec,
Section 9): one fixed task weight per seed, N + 1 = 16 / 128 / 512 tokens, 16384 tokens per epoch,
one sequence per SGD step, lr 0.003 for the normal and regularized models of the linear task and
0.005 otherwise, d_r = 100 (d_t + d_s). What the paper leaves open is ours and stated in the config:
the epoch count of each task (chosen so that its normal model has converged by
:func:`convergence`, at that length and at twice it), the decay of the learning rate over the last
fifth of the steps (the paper keeps it constant), five seeds, the alpha, k, beta grids, and the
learning-rate controls (a normal model at every learning rate any variant of the task uses, so each
variant has a normal model of the same seed and learning rate to be compared with).

Every model of a task (all variants, all seeds) trains as one
:class:`icl_lens.training.ensemble.AttentionEnsemble`:
model m sees its own seed's sequences, one per step, with its own learning rate. Each seed also has a
fixed test set, on which every model is evaluated at ``checkpoints`` points of training and the
training-free baselines of :mod:`icl_lens.baselines` are measured.
"""

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from icl_lens import baselines, context_use
from icl_lens.context_use import random_orders
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.tasks import RegressionTask, sample_sequences, sample_task_weight, task_labels
from icl_lens.training.data import new_task_data, new_task_test_sets, task_data, test_sets
from icl_lens.training.ensemble import (AttentionEnsemble, LayerConfig, Modification, equivalence_curve,
                                       squared_errors, test_loss, used_switches)
from icl_lens.training.journal import Journal
from icl_lens.training.loop import decay_schedule, fork, fork_point, job_threads, run_jobs, train
from icl_lens.validation import check_positive_float, check_positive_int, check_seeds
# what is read off a record lives in section5_readings; it is named here too, so that
# ``section5.X`` reaches every piece of the study
from icl_lens.studies.section5_readings import (CONVERGENCE_TOLERANCE, SCREEN_MARGIN, SEEDS_THAT_CAN,  # noqa: F401
                                                ModelRecord, TaskRecord, approximation_config,
                                                approximation_study, context_use_by_model, convergence, criteria,
                                                curves, describe_config, equivalence_gaps, finite_or_none,
                                                heatmaps, log_ratio, normalised_baselines, normalised_loss,
                                                reported_loss, run_length, seed_key, trained_layers, window_loss)

ALPHAS = (-0.5, -0.1, 0.1, 0.5)   # the paper's BERT grid
LINEAR_COMBINATIONS = (
    Modification(alpha=0.1, value_map="gelu"),
    Modification(alpha=0.1, key_map="gelu"),
    Modification(value_map="gelu", negative_k=3, beta=0.1),
    Modification(key_map="gelu", negative_k=3, beta=0.1),
    Modification(alpha=0.1, negative_k=3, beta=0.1),
    Modification(alpha=0.1, value_map="gelu", negative_k=3, beta=0.1),
)
# offsets of the generators, apart from the task's (the seed itself), the layer's (10_000 + seed) and
# the test set's (icl_lens.training.data.TEST_SET)
TEMPERATURE_SET = 3_000_000
OTHER_TASK, SHUFFLE = 4_000_000, 5_000_000      # the context-use measurements' draws
TEST_PARTS = 4     # the final test set read as this many disjoint parts at the end of a run
FINAL_TEST_SET = 8_000_000     # the generator offset of the final test set (the curve's: TEST_SET)
# the twin of a seed's normal model starts with one weight of W_Q scaled by 1 + 2**-20 (8 to 16
# float32 steps of that weight): a run that ends elsewhere is chaotic at round-off level
TWIN_NUDGE = 2.0 ** -20
PROTOCOLS = ("fixed task", "new task per prompt")
# ExperimentConfig's fields of the new-task protocol at their Section 5 values, which a record's
# config leaves out (plain_config)
SECTION5_DEFAULTS = {"protocol": "fixed task", "optimizer": "sgd", "batch": 1}


def regularized_grid(alphas, forms=("proportional", "constant")):
    """Both readings of the regularized form (Section 8.1 of the math spec) over ``alphas``."""
    return tuple(Modification(alpha=a, alpha_form=f) for f in forms for a in alphas)


@dataclass(frozen=True)
class Variant:
    """One model of a seed: its group, its switches and its learning rate."""

    group: str
    modification: Modification
    lr: float
    control: bool = False     # a normal model at a learning rate other than the paper's

    @property
    def name(self):
        if self.group == "twin":
            return "normal twin"
        return f"normal lr={self.lr:g}" if self.control else self.modification.name


@dataclass(frozen=True)
class ExperimentConfig:
    """One task's training runs; defaults are the linear task of Figs. 3 and 10."""

    task: RegressionTask = field(default_factory=RegressionTask.linear)
    # not printed in the paper; chosen so that :func:`convergence` holds at this length and at twice
    # it (``reproduce convergence``)
    epochs: int = 160
    tokens_per_epoch: int = 16384
    seeds: tuple = (0, 1, 2, 3, 4)
    regularized: tuple = regularized_grid(ALPHAS)
    augmentations: tuple = (("gelu", "none"), ("none", "gelu"), ("gelu", "gelu"), ("none", "mlp-gelu"))
    negatives: tuple = ((1, 0.1), (1, 0.2), (3, 0.1), (3, 0.2), (5, 0.1), (5, 0.2))   # (k, beta)
    combinations: tuple = LINEAR_COMBINATIONS
    lr_normal: float = 0.003              # normal and regularized models
    lr_other: float = 0.005               # augmented, negative, combinations
    # a fixed test set per seed for the curve (the checkpoints and the speeds), and a larger one for
    # the losses at the end of each run length (the final results, the baselines), read also as
    # TEST_PARTS disjoint parts whose spread is the test set's own noise. On the exponential task
    # a loss over 64 sequences moves by 0.35 in log between disjoint sets, paired with another
    # model of the seed (0.70 alone): 4096 sequences bring that to about 0.044, half the band
    test_sequences: int = 256
    final_test_sequences: int = 4096
    checkpoints: int = 32                 # test losses measured at epochs * j / checkpoints
    kernel: str = "performer"
    temperature: bool = True              # q, k times d**-1/4 (LayerConfig.temperature)
    dtype: str = "float32"
    # not the paper's: its constant rate, then a linear fall to 0 over the last ``decay_fraction``
    # of the steps, so a run ends on its weights rather than on one draw of SGD's noise, and the
    # same run at half the epochs comes almost free (:func:`train_seeds`); "constant" is the paper's
    schedule: str = "decay"
    decay_fraction: float = 0.2
    shorter_runs: tuple = ()              # further run lengths (epochs) to branch off ("decay" only)
    # a twin of each seed's normal model, nudged at round-off level (TWIN_NUDGE): where the two end
    # apart by more than a verdict's band, that seed's runs are chaotic and it cannot decide one
    twins: bool = True
    # quick mode (CI): two seeds, 4 short epochs; ``quick_tokens_per_epoch`` passes the linear
    # task's early plateau
    quick_tokens_per_epoch: int = 8192
    # the protocol R&L leave open (App. E.1), with a new task weight for every sequence
    # (icl_lens.studies.modifications_across_tasks): Adam on batches of ``batch`` prompts per step,
    # one learning rate for every model. Left at these defaults they are not written in a record's
    # config, so Section 5's saved records and journals are what they were
    protocol: str = "fixed task"          # or "new task per prompt"
    optimizer: str = "sgd"                # or "adam"
    batch: int = 1                        # sequences per model per step
    num_features: int = None              # d_r; None: 100 (d_t + d_s), the paper's

    def __post_init__(self):
        check_positive_int(self.epochs, "epochs")
        check_positive_int(self.tokens_per_epoch, "tokens_per_epoch")
        check_positive_int(self.quick_tokens_per_epoch, "quick_tokens_per_epoch")
        check_seeds(self.seeds)
        check_positive_float(self.lr_normal, "lr_normal")
        check_positive_float(self.lr_other, "lr_other")
        if self.kernel not in ("performer", "softmax"):      # LayerConfig's kernels, checked before any work
            raise ValueError(f"kernel must be 'performer' or 'softmax', got {self.kernel!r}")
        check_positive_int(self.test_sequences, "test_sequences")
        check_positive_int(self.final_test_sequences, "final_test_sequences")
        check_positive_int(self.checkpoints, "checkpoints")
        if self.tokens_per_epoch < self.task.num_tokens:
            raise ValueError(
                f"tokens_per_epoch ({self.tokens_per_epoch}) must hold at least one sequence of {self.task.num_tokens} tokens"
            )
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        if self.schedule not in ("decay", "constant"):
            raise ValueError(f"schedule must be 'decay' or 'constant', got {self.schedule!r}")
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction!r}")
        if any(not isinstance(n, int) or not 0 < n < self.epochs for n in self.shorter_runs):
            raise ValueError(f"shorter_runs must hold epoch counts in (0, epochs={self.epochs}), got {self.shorter_runs!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        check_positive_int(self.batch, "batch")
        if self.num_features is not None:
            check_positive_int(self.num_features, "num_features")
        if self.optimizer == "adam" and self.lr_normal != self.lr_other:
            raise ValueError(f"optimizer='adam' trains every model at one learning rate: lr_normal ({self.lr_normal}) "
                             f"and lr_other ({self.lr_other}) must be equal")
        if self.tokens_per_epoch < self.task.num_tokens * self.batch:
            raise ValueError(f"tokens_per_epoch ({self.tokens_per_epoch}) must hold at least one step of {self.batch} "
                             f"sequences of {self.task.num_tokens} tokens")

    @property
    def steps_per_epoch(self):
        return self.tokens_per_epoch // (self.task.num_tokens * self.batch)

    @property
    def layer(self):
        return LayerConfig(token_dim=self.task.token_dim, kernel=self.kernel, temperature=self.temperature,
                           num_features=self.num_features)

    @property
    def checkpoint_epochs(self):
        """The epochs after which every model's test loss is measured (the last epoch included)."""
        count = min(self.checkpoints, self.epochs)
        return sorted({math.ceil(self.epochs * j / count) for j in range(1, count + 1)})

    @property
    def run_lengths(self):
        """The epoch counts whose end-of-run test losses the record holds: with the "decay" schedule
        the run itself and the same run at half the epochs (the convergence check), else the run."""
        if self.schedule == "constant":
            return [self.epochs]
        return sorted({self.epochs // 2, self.epochs, *self.shorter_runs} - {0})

    @property
    def trained_epochs(self):
        """Epochs of training a run costs: its own and those of the shorter runs copied off it."""
        return self.epochs + sum(n - fork_point(n, self.decay_fraction) for n in self.run_lengths[:-1])

    def learning_rate(self, group):
        return self.lr_normal if group in ("normal", "regularized") else self.lr_other

    def variants(self):
        """Every model of one seed: a normal model at each learning rate in use (the paper's own
        first), then the regularized, augmented, negative-sample and combined models."""
        listed = [Variant("regularized", m, self.learning_rate("regularized")) for m in self.regularized]
        listed += [Variant("augmented", Modification(value_map=g1, key_map=g2), self.lr_other)
                   for g1, g2 in self.augmentations]
        listed += [Variant("negative", Modification(negative_k=k, beta=b), self.lr_other) for k, b in self.negatives]
        listed += [Variant("combination", m, self.lr_other) for m in self.combinations]
        rates = dict.fromkeys([self.lr_normal] + [v.lr for v in listed])
        twins = [Variant("twin", Modification(), self.lr_normal)] if self.twins else []
        return [Variant("normal", Modification(), lr, lr != self.lr_normal) for lr in rates] + listed + twins

    def quick(self):
        """Small sizes for tests and CI: the first two seeds, 4 epochs of ``quick_tokens_per_epoch``
        tokens, 16 test sequences (32 for the final losses), 4 checkpoints; every grid value is kept."""
        return replace(self, epochs=4, tokens_per_epoch=self.quick_tokens_per_epoch, test_sequences=16,
                       final_test_sequences=32, seeds=self.seeds[:2], checkpoints=4)


def screen(task, seed):
    """Can the task draw of ``seed`` show an effect? Decided before training, on the 256 sequences
    that choose Nadaraya-Watson's temperature (not the test set): the normalised losses of the
    context mean and of Nadaraya-Watson, and ``passes``, whether the latter gains at least
    :data:`SCREEN_MARGIN` of the label variance."""
    weight = task_data(task, [seed]).weights[seed]
    tokens, targets = sample_sequences(task, 256, weight, generator=make_generator(TEMPERATURE_SET + seed))
    x_context, y_context, x_query = prompts(task, tokens)
    y = targets[:, 0]
    temperature = baselines.best_temperature(x_context, y_context, x_query, y, NADARAYA_WATSON_TEMPERATURES)
    variance = float(y.var(unbiased=False))

    def normalised(prediction):
        return float(((prediction - y) ** 2).mean()) / variance

    context_mean = normalised(baselines.context_mean(x_context, y_context, x_query))
    nadaraya_watson = normalised(baselines.nadaraya_watson(x_context, y_context, x_query, temperature))
    return {"context_mean": context_mean, "nadaraya_watson": nadaraya_watson,
            "gain": context_mean - nadaraya_watson, "passes": context_mean - nadaraya_watson >= SCREEN_MARGIN}


def screened_seeds(task, count=SEEDS_THAT_CAN, limit=100):
    """Seeds 0, 1, 2, ... up to the ``count``-th that passes :func:`screen`: every drawn seed is
    trained, those that fail are reported apart from the verdicts."""
    drawn, passing = [], 0
    for seed in range(limit):
        drawn.append(seed)
        passing += screen(task, seed)["passes"]
        if passing == count:
            return tuple(drawn)
    raise ValueError(f"only {passing} of the first {limit} seeds of the {task.kind} task pass the screen")


def linear_experiment(deciding=SEEDS_THAT_CAN):
    """Figs. 3 and 10: s = W t, d_t = 11, N + 1 = 16; seeds drawn until ``deciding`` pass the screen."""
    return ExperimentConfig(seeds=screened_seeds(RegressionTask.linear(), deciding))


def trigonometric_experiment(deciding=SEEDS_THAT_CAN):
    """Fig. 11: s = cos(W t), d_t = 7, N + 1 = 128, lr 0.005; the two-layer g2^+ uses ELU.

    A smaller grid than the linear task's (each step costs 8x more): both regularized readings at
    alpha = +-0.5, g1, g2, g1 and g2, g2^+, k in {3, 5} at beta = 0.1, and two combinations."""
    task = RegressionTask.trigonometric()
    return ExperimentConfig(
        task=task,
        seeds=screened_seeds(task, deciding),
        epochs=320,
        lr_normal=0.005,
        quick_tokens_per_epoch=2048,
        regularized=regularized_grid((-0.5, 0.5)),
        augmentations=(("gelu", "none"), ("none", "gelu"), ("gelu", "gelu"), ("none", "mlp-elu")),
        negatives=((3, 0.1), (5, 0.1)),
        combinations=(Modification(alpha=0.1, key_map="gelu"), Modification(key_map="gelu", negative_k=3, beta=0.1)),
    )


def exponential_experiment(deciding=SEEDS_THAT_CAN):
    """Fig. 12: s = exp(W t), d_t = 6, N + 1 = 512, settings of the trigonometric task.

    The paper's best "alpha = 16" is run where a reading defines it: the constant form (renormalised
    and raw) and the proportional form without renormalisation; alpha = 1/6 (a lost fraction?) in
    both forms."""
    sixth = 1 / 6
    task = RegressionTask.exponential()
    return ExperimentConfig(
        task=task,
        seeds=screened_seeds(task, deciding),
        epochs=600,
        lr_normal=0.005,
        quick_tokens_per_epoch=2048,
        regularized=(*regularized_grid((-0.5, sixth, 0.5), ("proportional",)),
                     *regularized_grid((-0.5, sixth, 16.0), ("constant",)),
                     Modification(alpha=16.0, renormalise=False),
                     Modification(alpha=16.0, alpha_form="constant", renormalise=False)),
        augmentations=(("gelu", "none"), ("none", "gelu"), ("gelu", "gelu")),
        negatives=((3, 0.1),),
        combinations=(Modification(alpha=0.1, key_map="gelu"), Modification(key_map="gelu", negative_k=3, beta=0.1)),
    )


def temperature_experiment():
    """The temperature check: the linear task's normal, alpha < 0 (both readings) and g2 models with
    q and k left unscaled (``temperature=False``; the book's layers scale each by d**-1/4, so that
    exp(q . k) is softmax's exp(q . k / sqrt(d)), which the papers' dual-model theorems leave out)."""
    return replace(linear_experiment(), temperature=False, regularized=regularized_grid((-0.5, -0.1)),
                   augmentations=(("none", "gelu"),), negatives=(), combinations=(), twins=False)


EXPERIMENTS = {"linear": linear_experiment, "trigonometric": trigonometric_experiment, "exponential": exponential_experiment}


NADARAYA_WATSON_TEMPERATURES = tuple(float(t) for t in torch.logspace(-2, 2, 17, dtype=torch.float64))


def prompts(task, tokens):
    """Sequences of a task as prompts: the demonstrations' inputs and labels and the query's input."""
    inputs, labels = tokens[..., : task.input_dim], tokens[..., task.input_dim]
    return inputs[:, :-1], labels[:, :-1], inputs[:, -1]


def baseline_losses(task, weight, tokens, targets, seed):
    """Mean squared errors of the training-free predictors on one seed's test set (float64):

    ``label_variance`` (predicting the test labels' mean), ``context_mean`` (uniform attention),
    ``nadaraya_watson`` (softmax attention on the raw inputs; its temperature, also saved, chosen
    on 256 training sequences), ``least_squares`` (with an intercept, on the prompt), and for the
    exponential task ``log_least_squares`` (least squares on log s, exact there since log s = W t).
    """
    y = targets[:, 0]
    chosen_from, chosen_targets = sample_sequences(task, 256, weight, generator=make_generator(TEMPERATURE_SET + seed))
    temperature = baselines.best_temperature(*prompts(task, chosen_from), chosen_targets[:, 0],
                                             NADARAYA_WATSON_TEMPERATURES)
    x_context, y_context, x_query = prompts(task, tokens)

    def mse(prediction):
        return float(((prediction - y) ** 2).mean())

    found = {
        "label_variance": float(y.var(unbiased=False)),
        "context_mean": mse(baselines.context_mean(x_context, y_context, x_query)),
        "nadaraya_watson": mse(baselines.nadaraya_watson(x_context, y_context, x_query, temperature)),
        "nadaraya_watson_temperature": temperature,
        "least_squares": mse(baselines.least_squares(x_context, y_context, x_query, intercept=True)),
    }
    if task.kind == "exponential":
        found["log_least_squares"] = mse(torch.exp(baselines.least_squares(x_context, torch.log(y_context), x_query)))
    return found


# the generator offset of the prompts that choose one gradient step's learning rate (new-task protocol)
ONE_STEP_TUNING = 7_000_000


def new_task_baselines(task, tokens, targets, seed):
    """The training-free predictors' test MSE on one seed's test set under the new-task protocol
    (float64): ``label_variance`` (predicting the labels' mean), ``zero``, ``context_mean``,
    ``least_squares`` (with an intercept, on the prompt) and ``one_gd_step``, one gradient step
    from W = 0 on the prompt's squared loss at its best learning rate ``one_gd_step_lr``, chosen on
    1024 prompts apart from the test set (von Oswald et al.'s comparator of a trained layer)."""
    y = targets[:, 0]
    tuning_tokens, tuning_targets = new_task_test_sets(task, [seed], 1024, offset=ONE_STEP_TUNING)[seed]
    lr_star = baselines.optimal_one_step_lr(*prompts(task, tuning_tokens), tuning_targets[:, 0])
    x_context, y_context, x_query = prompts(task, tokens)

    def mse(prediction):
        return float(((prediction - y) ** 2).mean())

    squares = (y ** 2).sort(descending=True).values
    return {"label_variance": float(y.var(unbiased=False)), "zero": mse(torch.zeros_like(y)),
            # how much of the labels' second moment the largest 1% of the prompts carry: near 1, a
            # handful of prompts decides every mean squared error on this set
            "label_tail_share": float(squares[: max(1, len(y) // 100)].sum() / squares.sum()),
            "context_mean": mse(baselines.context_mean(x_context, y_context, x_query)),
            "least_squares": mse(baselines.least_squares(x_context, y_context, x_query, intercept=True)),
            "one_gd_step": mse(baselines.one_step_gd(x_context, y_context, x_query, lr_star)),
            "one_gd_step_lr": float(lr_star)}


def seed_data(config, seeds):
    """The training streams, curve test sets and final test sets of ``seeds`` under the config's
    protocol: one task weight per seed (Section 5) or a new one for every sequence."""
    if config.protocol == "fixed task":
        data = task_data(config.task, seeds)
        return (data, test_sets(config.task, data.weights, config.test_sequences),
                test_sets(config.task, data.weights, config.final_test_sequences, offset=FINAL_TEST_SET))
    return (new_task_data(config.task, seeds), new_task_test_sets(config.task, seeds, config.test_sequences),
            new_task_test_sets(config.task, seeds, config.final_test_sequences, offset=FINAL_TEST_SET))


def train_seeds(config, variants, seeds, compile=False, progress=True, position=0, *, device="cpu"):
    """Train ``variants`` for ``seeds`` as one ensemble; return, per model (seed-major order), the
    per-epoch training losses, the test losses at the checkpoints and at the end of each run length
    of ``config.run_lengths``, and the equivalence curve and trained weights of each seed's first
    normal model; and the seconds the call took.

    With the "decay" schedule a run of L < epochs epochs shares the constant-rate part of the
    whole run, so it is copied off (weights and data streams) at the epoch where its own decay
    starts and trained from there: it is the run a separate call with ``epochs=L`` makes, at a
    ``decay_fraction`` of its cost."""
    started = time.perf_counter()
    device = pick(device)
    dtype = getattr(torch, config.dtype)
    models = [(variant, seed) for seed in seeds for variant in variants]
    ensemble = AttentionEnsemble(
        config.layer, [v.modification for v, _ in models], [s for _, s in models], dtype=dtype, device=device
    )
    with torch.no_grad():
        for m, (variant, _) in enumerate(models):
            if variant.group == "twin":
                ensemble.W_Q[m, 0, 0] *= 1 + TWIN_NUDGE
    data, tests, finals = seed_data(config, seeds)
    test_tokens = torch.stack([tests[s][0] for _, s in models]).to(dtype=dtype, device=device)
    test_targets = torch.stack([tests[s][1] for _, s in models]).to(dtype=dtype, device=device)
    final_tokens = torch.stack([finals[s][0] for _, s in models]).to(dtype=dtype, device=device)
    final_targets = torch.stack([finals[s][1] for _, s in models]).to(dtype=dtype, device=device)
    count = min(TEST_PARTS, config.final_test_sequences)

    def final_losses(trained):
        """(parts, models): the test loss on each disjoint part of the final test set."""
        return torch.stack([test_loss(trained, tokens, targets) for tokens, targets in
                            zip(final_tokens.tensor_split(count, dim=1), final_targets.tensor_split(count, dim=1))])

    sizes = torch.tensor([len(part) for part in torch.arange(config.final_test_sequences).tensor_split(count)],
                         dtype=torch.float64)

    def whole(parts):   # the loss on the whole final test set, from its parts
        return (parts * sizes[:, None]).sum(0) / config.final_test_sequences
    lr = torch.tensor([v.lr for v, _ in models], dtype=dtype, device=device)
    optimizer = None
    if config.optimizer == "adam":   # one rate for all
        if len({v.lr for v in variants}) != 1:
            raise ValueError(f"optimizer='adam' trains every model at one learning rate, got {sorted({v.lr for v in variants})}")
        lr = variants[0].lr
        optimizer = torch.optim.Adam(ensemble.parameters(), lr=lr)
    steps, checkpoints, curves_at, ended = config.steps_per_epoch, config.checkpoint_epochs, [], {}
    shorter = config.run_lengths[:-1]

    def schedule(length):
        return decay_schedule(length * steps, config.decay_fraction) if config.schedule == "decay" else None

    def measure(epoch):
        if epoch in checkpoints:
            curves_at.append(test_loss(ensemble, test_tokens, test_targets))

    def branch(epoch):
        for length in shorter:
            if fork_point(length, config.decay_fraction) == epoch:
                short, short_data, state = fork(ensemble, data, optimizer)
                short_optimizer = None
                if optimizer is not None:   # the shorter run goes on with the optimiser's state so far
                    short_optimizer = torch.optim.Adam(short.parameters(), lr=lr)
                    short_optimizer.load_state_dict(state)
                train(short, short_data, steps=steps, epochs=length, lr=lr, schedule=schedule(length),
                      first_epoch=epoch, progress=bar, step_errors=squared_errors, compile=compile,
                      batch=config.batch, optimizer=short_optimizer)
                ended[length] = whole(final_losses(short))

    bar = (tqdm(total=config.trained_epochs * steps, unit="step", position=position, mininterval=2,
                desc=f"{config.task.kind} seeds {list(seeds)} ({len(models)} models)") if progress else None)
    history = train(ensemble, data, steps=steps, epochs=config.epochs, lr=lr, schedule=schedule(config.epochs),
                    before_epoch=branch, progress=bar, step_errors=squared_errors, after_epoch=measure,
                    compile=compile, batch=config.batch, optimizer=optimizer)
    if bar is not None:
        bar.close()
    tested = torch.stack(curves_at)
    # the final test loss on each of TEST_PARTS disjoint parts of the final test set: their spread
    # is the noise the test set adds to a seed's number (fewer parts where the set is smaller)
    parts = final_losses(ensemble)
    ended[config.epochs] = whole(parts)
    by_length = torch.stack([ended[length] for length in config.run_lengths])
    equivalence, trained = {}, {}
    for seed in seeds:
        normal = next((i for i, (v, s) in enumerate(models) if v.group == "normal" and s == seed), None)
        if normal is None:      # a part of a seed's variants without its normal model (workers > 1)
            continue
        equivalence[seed_key(seed)] = equivalence_curve(ensemble, normal, data, seed)
        trained[seed_key(seed)] = {name: getattr(ensemble, name)[normal].detach().cpu().tolist() for name in ("W_Q", "W_K", "W_V")}
    context = measure_context_use(ensemble, data, tests, config.task)
    return {"train_loss": history.T.tolist(), "test_curve": tested.T.tolist(), "by_length": by_length.T.tolist(),
            "equivalence": equivalence, "trained_normal": trained, "context_use": context,
            "test_parts": parts.T.tolist(), "seeds": list(seeds), "device": str(device),
            "threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - started}   # for the log, not the record


def measure_context_use(ensemble, data, tests, task):
    """The measurements of :mod:`icl_lens.context_use` for every model of a trained ensemble, on
    its seed's test set: one dict per model. The other task's weight and the shuffles are drawn per
    seed, so the models of a seed are measured on the same prompts."""
    dtype, device = ensemble.W_Q.dtype, ensemble.W_Q.device
    seeds, output_dim = ensemble.seeds, task.output_dim
    tokens = torch.stack([tests[s][0] for s in seeds]).to(dtype=dtype, device=device)
    targets = torch.stack([tests[s][1] for s in seeds]).to(dtype=dtype, device=device)
    num_prompts, n = tokens.shape[1], tokens.shape[2]
    other, order = {}, {}
    for s in sorted(set(seeds)):
        weight = sample_task_weight(task, generator=make_generator(OTHER_TASK + s))
        other[s] = task_labels(task, tests[s][0][:, :-1, : task.input_dim], weight)
        order[s] = random_orders(num_prompts, n - 1, make_generator(SHUFFLE + s))
    chunk = max(1, 2**22 // (ensemble.num_models * n * ensemble.omega.shape[1]))

    def chunked(function, prompts):
        return torch.cat([function(prompts[:, i : i + chunk]) for i in range(0, num_prompts, chunk)], dim=1)

    found = context_use.measure(
        lambda prompts: chunked(lambda part: ensemble(part)[..., -output_dim:], prompts),
        lambda prompts: chunked(lambda part: ensemble.attend(part)[0][..., -1], prompts),
        tokens, targets, other_labels=torch.stack([other[s] for s in seeds]).to(dtype=dtype, device=device),
        order=torch.stack([order[s] for s in seeds]).to(device),
        label_variance=torch.tensor([float(tests[s][1].var(unbiased=False)) for s in seeds], dtype=dtype,
                                    device=device))
    if data.fixed_task:   # W_V's label row against the seed's one task weight
        found["label_row_cosine"] = context_use.label_row_cosine(
            ensemble.W_V.detach(), torch.stack([data.weights[s] for s in seeds]))
    return [{name: float(values[m]) for name, values in found.items()} for m in range(ensemble.num_models)]


def ensemble_cost(variants):
    """A rank, not a time: how long training ``variants`` as one ensemble takes against the other
    parts of a run, for handing the longest out first. Per model, the plain layer and each map or
    negative sampling that the ensemble computes (:func:`used_switches`); the parts with the maps
    and negative samples take up to 1.5x as long (benchmarks/batched_training.py)."""
    uses = used_switches([v.modification for v in variants])
    return len(variants) * (1 + uses["value_map"] + uses["key_map"] + uses["negative"])


# the order in which a pool shared by the three tasks (:func:`run_experiments`) takes their jobs:
# the longest jobs first (a full run's exponential jobs take about 110-160 s, linear 110-120 s,
# trigonometric 70-90 s; benchmarks/batched_training.py), so that the last ones are short and a
# process that finishes early waits little for the other
POOL_ORDER = ("exponential", "linear", "trigonometric")


def run_experiment(config, *, device="cpu", progress=True, compile=False, variants=None, workers=1,
                   scheduler=None):
    """Train every variant of ``config`` for every seed; return a JSON-ready :class:`TaskRecord`.

    With ``workers=1`` all seeds train as one ensemble on ``device`` (the form for a GPU). With
    ``workers > 1`` (CPU only) each seed's variants are split into ``workers`` parts, each its own
    ensemble, and ``workers`` processes share the CPU threads: small ensembles stay in cache, one
    thread per process avoids the threading overhead of small kernels, and the equal parts keep
    every process busy whatever the number of seeds; the parts that cost more (:func:`ensemble_cost`)
    are handed out first. Models are independent either way; float32 round-off depends on how
    models are grouped and on compilation (not on the order or process), so one setting gives one
    set of bytes.

    ``compile=True`` runs the training step through ``torch.compile`` (``benchmarks/batched_training.py``
    measures what it gains), after seconds of compilation per process. ``variants`` replaces
    ``config.variants()``, a list of :class:`Variant`. The record holds, per model, the training
    loss of every epoch and the test loss at every checkpoint (``test_curve``, on the seed's fixed
    test set), and per seed the baselines of :func:`baseline_losses` on that test set and the
    trained W_Q, W_K, W_V of its normal model. ``scheduler``: the address of a Dask scheduler that
    takes the jobs instead of local processes (:func:`icl_lens.training.loop.run_jobs`; the same
    records).
    """
    records, _ = run_experiments([config], device=device, progress=progress, compile=compile,
                                 variants=None if variants is None else [variants], workers=workers,
                                 scheduler=scheduler)
    return records[0]


def run_experiments(configs, *, device="cpu", progress=True, compile=False, variants=None, workers=1,
                    finished=None, scheduler=None, journal=None, keep=False):
    """:func:`run_experiment` for several configs (the tasks of a full run) with one pool: the
    jobs of every config go to the same ``workers`` processes, config by config in the order
    given, each config's costliest first, so that no process waits for the other between two
    configs and each spawns and imports once. ``variants``: None, or one list per config.
    ``finished(i, record, seconds)``, where given, is called as soon as config ``i``'s jobs have
    all ended (to save its record before the others end).

    Returns (records, seconds): a :class:`TaskRecord` per config, and per config the seconds its
    jobs took, summed over the jobs and divided by ``workers`` (its share of the pool's time; the
    wall time of a config alone is not defined when its jobs overlap another's). The numbers are
    those of a separate :func:`run_experiment` per config (every job is seeded).

    ``journal``, a folder, keeps each job's result as it ends (:class:`icl_lens.training.journal.Journal`,
    one sub-folder per task); with ``keep=True`` the jobs already finished there are read back, not
    trained, so that an interrupted run continues and a saved run grows by new seeds (with
    ``workers > 1`` a job is one seed's part, so every seed already trained is reused)."""
    check_positive_int(workers, "workers")
    variants = [config.variants() for config in configs] if variants is None else variants
    if len(variants) != len(configs):
        raise ValueError(f"variants must hold one list per config, got {len(variants)} for {len(configs)} configs")
    journals = [None] * len(configs)
    if journal is not None:
        threads = job_threads(workers, scheduler)
        journals = [Journal(Path(journal) / config.task.kind,
                            {"config": journal_config(config), "compile": bool(compile), "workers": workers,
                             "threads": threads, "device": str(pick(device))}, keep=keep)
                    for config in configs]
    jobs, owner = [], []
    for index, (config, listed) in enumerate(zip(configs, variants)):
        if workers == 1:
            parts = [(config, listed, config.seeds, compile, progress, 0)]
        else:
            size = math.ceil(len(listed) / workers)
            chunks = [listed[i : i + size] for i in range(0, len(listed), size)]
            parts = [(config, chunk, (seed,), compile, progress, i % workers)
                     for i, (seed, chunk) in enumerate((s, c) for s in config.seeds for c in chunks)]
        jobs += parts
        owner += [index] * len(parts)
    results, records, seconds = [None] * len(jobs), [None] * len(configs), [None] * len(configs)

    def job_name(i):   # the job's seeds and what it trains, as its journal names it
        return jobs[i][2], {"seeds": list(jobs[i][2]), "variants": [asdict(v) for v in jobs[i][1]]}

    def collect(i, result, save=True):
        results[i] = result
        index = owner[i]
        if save and journals[index] is not None:
            journals[index].save(*job_name(i), result)
        parts = [results[j] for j in range(len(jobs)) if owner[j] == index]
        if all(part is not None for part in parts):
            records[index] = task_record(configs[index], variants[index], parts, compile)
            seconds[index] = sum(part["seconds"] for part in parts) / workers
            if finished is not None:
                finished(index, records[index], seconds[index])

    waiting = []
    for i in range(len(jobs)):
        found = None if journals[owner[i]] is None else journals[owner[i]].finished(*job_name(i))
        if found is None:
            waiting.append(i)
        else:
            collect(i, found, save=False)
    # config by config (two equal configs keep their places), each config's costliest first
    costs = [(-owner[i], ensemble_cost(jobs[i][1])) for i in waiting]
    if waiting:
        run_jobs(train_seeds, [jobs[i] for i in waiting], device=device, workers=workers, costs=costs,
                 done=lambda k, result: collect(waiting[k], result), scheduler=scheduler)
    return records, seconds


def journal_config(config):
    """What a task's jobs depend on apart from the job itself: its config without the seed list."""
    plain = plain_config(config)
    del plain["seeds"]
    return plain


def task_record(config, variants, parts, compile):
    """The :class:`TaskRecord` of ``config`` from its jobs' results (:func:`train_seeds`), in the
    jobs' order: seed by seed and, within a seed, variant part by part."""
    train_losses = [row for part in parts for row in part["train_loss"]]
    test_curves = [row for part in parts for row in part["test_curve"]]
    by_length = [row for part in parts for row in part["by_length"]]
    context_uses = [row for part in parts for row in part["context_use"]]
    test_parts = [row for part in parts for row in part["test_parts"]]
    models = [(variant, seed) for seed in config.seeds for variant in variants]
    data, curves, tests = seed_data(config, config.seeds)
    if data.fixed_task:
        baseline = {s: baseline_losses(config.task, data.weights[s], *tests[s], s) for s in config.seeds}
        # can the seed's task draw show an effect? (decided before training: :func:`screen`)
        screening = {seed_key(s): screen(config.task, s) for s in config.seeds}
    else:   # every seed draws the same family of tasks: none is screened out
        baseline = {s: new_task_baselines(config.task, *tests[s], s) for s in config.seeds}
        screening = {}
    record = {
        "task": config.task.kind,
        "config": plain_config(config),
        "compiled": bool(compile),
        "epochs": list(range(1, config.epochs + 1)),
        "checkpoint_epochs": config.checkpoint_epochs,
        "run_lengths": config.run_lengths,
        "models": [
            {
                "group": variant.group,
                "name": variant.name,
                "seed": seed,
                "modification": asdict(variant.modification),
                "lr": variant.lr,
                "train_loss": [finite_or_none(x) for x in train_losses[i]],
                "test_curve": [finite_or_none(x) for x in test_curves[i]],
                # on the final test set, at the end of the run (test_loss_by_length's last)
                "test_loss": finite_or_none(by_length[i][-1]),
                # the test loss at the end of a run of each of ``run_lengths`` epochs
                "test_loss_by_length": [finite_or_none(x) for x in by_length[i]],
                # does the trained layer read its context? (icl_lens.context_use)
                "context_use": {name: finite_or_none(x) for name, x in context_uses[i].items()},
                # the final test loss on each disjoint part of the final test set (its noise)
                "test_loss_parts": [finite_or_none(x) for x in test_parts[i]],
            }
            for i, (variant, seed) in enumerate(models)
        ],
        "baselines": {seed_key(s): {**baseline[s],
                                    # the curve's test set: what its losses and the context use read
                                    "curve_label_variance": float(curves[s][1].var(unbiased=False))}
                      for s in config.seeds},
        "screening": screening,
        "equivalence": {seed: curve for part in parts for seed, curve in part["equivalence"].items()},
        # the trained weights of each seed's normal model (Figs. 6-9 measure trained layers)
        "trained_normal": {seed: w for part in parts for seed, w in part["trained_normal"].items()},
        # where each seed trained: the device and the threads of its jobs
        "trained_on": {seed_key(seed): sorted({f"{part['device']}, {part['threads']} thread(s)"
                                               for part in parts if seed in part["seeds"]})
                       for seed in config.seeds},
    }
    record["config"]["deciding"] = (sum(screened["passes"] for screened in screening.values()) if data.fixed_task
                                    else len(config.seeds))
    record["convergence"] = convergence(record)
    return record


LONG_RUN = 2     # the convergence study trains the normal models this many times the saved run's epochs


def convergence_studies(kinds, *, quick=False, epochs=None, device="cpu", workers=2, compile=True,
                        progress=False, scheduler=None, journal=None, keep=False):
    """{kind: study} for each of ``kinds``: only the normal model of each seed, at the task's
    settings, trained ``LONG_RUN`` times the saved run's epochs (or ``epochs``), with the runs of
    1/4, 1/2 and 3/4 of that length copied off: does the loss, and the criterion's verdict, keep
    changing past the saved run's epochs? The run of the saved run's length is the saved run's
    normal model (same seeds, data, schedule). ``quick``: the task's quick sizes
    (:meth:`ExperimentConfig.quick`). The tasks' jobs (one a seed) share one pool
    (:func:`run_experiments`), so the processes stay busy across tasks; ``journal`` and ``keep``
    are its: each finished job kept, and a run that was killed continued."""
    configs, longs = [], []
    for kind in kinds:
        config = EXPERIMENTS[kind]().quick() if quick else EXPERIMENTS[kind]()
        length = LONG_RUN * config.epochs if epochs is None else epochs
        lengths = tuple(sorted({length * j // 4 for j in range(1, 4)} - {0, length}))
        configs.append(config)
        longs.append(replace(config, epochs=length, checkpoints=min(length, 80), shorter_runs=lengths))
    normal = [[Variant("normal", Modification(), config.lr_normal)] for config in configs]
    records, _ = run_experiments(longs, device=device, workers=workers, compile=compile, progress=progress,
                                 variants=normal, scheduler=scheduler, journal=journal, keep=keep)
    return {kind: {"task": kind, "saved_run_epochs": config.epochs, "record": record, "criterion": criteria(record)}
            for kind, config, record in zip(kinds, configs, records)}


def plain_config(config):
    plain = asdict(config)
    plain["steps_per_epoch"] = config.steps_per_epoch
    plain["num_features"] = config.layer.features
    for name, value in SECTION5_DEFAULTS.items():   # Section 5's records keep the config they had
        if plain[name] == value:
            del plain[name]
    return plain

