"""What is read off a saved Section 5 task record: the losses a verdict uses (at the end of a run
or of its half-length copy), the convergence criterion, the curves and baselines the figures draw,
the config in words, and the trained layers whose random-feature estimate Figs. 6-9 measure. The
records themselves are made by :mod:`icl_lens.studies.section5`.

Chapters: experiments.
"""

import math
from typing import TypedDict

import torch

from icl_lens import statistics, verdicts
from icl_lens.approximation import ApproximationConfig, AttentionLayer, approximation_error, compare
from icl_lens.device import generator as make_generator
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.tasks import RegressionTask
from icl_lens.training.data import task_data, test_sets
from icl_lens.training.ensemble import Modification

# a task draw can show an effect when Nadaraya-Watson (softmax attention on the raw inputs, nothing
# trained) beats the context mean by this share of the label variance: below it the draw has no
# local structure an attention layer could learn from its prompt
SCREEN_MARGIN = 0.05
# seeds are drawn 0, 1, 2, ... until this many pass the screen: at 20 the exact 95% interval of a
# median runs from the 6th to the 15th value (95.9%), at 5 it was the range (93.8%)
SEEDS_THAT_CAN = 20


def seed_key(seed):
    """A seed as the key of a record's per-seed maps (``baselines``, ``equivalence``,
    ``trained_normal``, the convergence numbers): JSON's object keys are strings, so the seed, an
    int everywhere else (``ModelRecord["seed"]``, configs), is written as its decimal string."""
    return str(int(seed))


class ModelRecord(TypedDict):
    """One trained model of a task record (losses are raw MSE; None where a run diverged)."""

    group: str                      # normal, regularized, augmented, negative, combination
    name: str                       # Variant.name: unique within a seed
    seed: int
    modification: dict              # asdict of its Modification
    lr: float
    train_loss: list                # mean training loss of every epoch
    test_curve: list                # test loss at each of the record's checkpoint_epochs
    test_loss: float | None         # the last checkpoint's
    test_loss_by_length: list       # test loss at the end of a run of each of run_lengths epochs
    context_use: dict               # icl_lens.context_use.MEASURES at the end of the run


class TaskRecord(TypedDict):
    """What :func:`run_experiment` returns and ``task_<kind>.json`` holds."""

    task: str
    config: dict                    # plain_config(ExperimentConfig)
    compiled: bool
    epochs: list                    # 1 .. epochs
    checkpoint_epochs: list
    run_lengths: list
    models: list                    # ModelRecord, seed by seed
    baselines: dict                 # seed_key -> baseline_losses(...)
    equivalence: dict               # seed_key -> equivalence_curve(...)
    trained_normal: dict            # seed_key -> {"W_Q", "W_K", "W_V"} of the seed's normal model
    convergence: dict               # convergence(record)
    screening: dict                 # seed_key -> screen(...): can the draw show an effect


def context_use_by_model(record):
    """{model name: {seed: the measurements of icl_lens.context_use}} of a task record."""
    found = {}
    for model in record["models"]:
        found.setdefault(model["name"], {})[seed_key(model["seed"])] = model["context_use"]
    return found


def curve_scale(record, seed):
    """What a seed's test curve is divided by: the label variance of its final test set, or, for a
    record with ``speed_scale`` "curve" (a new task per prompt, where the labels' variance moves
    by about a tenth between test sets of 256 prompts), that of the curve's own test set."""
    baselines = record["baselines"][seed_key(seed)]
    return baselines["curve_label_variance"] if record.get("speed_scale") == "curve" else baselines["label_variance"]


def window_loss(record, model, until=1.0):
    """A model's test loss averaged over the checkpoints of one quarter of training, the quarter that
    ends at ``until`` x epochs (1.0: the last quarter, 0.5: the second). Constant-rate SGD leaves the
    loss fluctuating from checkpoint to checkpoint; the average is what verdicts use. Returns inf for
    a model that diverged (a null in the window) and nan for an empty window."""
    epochs = len(record["epochs"])
    picked = [loss for epoch, loss in zip(record["checkpoint_epochs"], model["test_curve"])
              if epochs * (until - 0.25) < epoch <= epochs * until + 1e-9]
    if not picked:
        return math.nan
    return math.inf if any(x is None for x in picked) else sum(picked) / len(picked)


def run_length(record, until):
    """The epochs of the run of ``until`` x the record's epochs (0.5: half of them, rounded down)."""
    return int(until * len(record["epochs"]) + 1e-9)


def reported_loss(record, model, until=1.0):
    """The test loss a verdict uses, of the run of ``until`` x epochs (1.0: the run, 0.5: half of it).

    With the "decay" schedule it is the loss at the end of that run (its step size has fallen to 0,
    so the weights are the run's, not one draw of SGD's noise). With the paper's constant rate it is
    :func:`window_loss`, the mean over the quarter of training that ends there. inf for a model
    that diverged."""
    if record.get("config", {}).get("schedule", "constant") == "constant":
        return window_loss(record, model, until)
    length = run_length(record, until)
    if length not in record["run_lengths"]:
        raise ValueError(f"until={until} asks for a run of {length} epochs; the record holds {record['run_lengths']}")
    loss = model["test_loss_by_length"][record["run_lengths"].index(length)]
    return math.inf if loss is None else loss


def normalised_loss(record, model, until=1.0):
    """:func:`reported_loss` divided by the label variance of the model's seed (1 = predicting the mean)."""
    return reported_loss(record, model, until) / record["baselines"][seed_key(model["seed"])]["label_variance"]


# a doubling of training that moves a seed's loss by less than a tenth, either way, leaves it where
# it is: the band of the verdicts (:data:`icl_lens.studies.section5_claims.BAND`)
CONVERGENCE_TOLERANCE = math.log(1.1)
# the absolute criterion: a doubling moves the normalised loss by less than 1% of the label variance
ABSOLUTE_TOLERANCE = 0.01


def convergence(record, tolerance=CONVERGENCE_TOLERANCE, until=1.0):
    """The stopping criterion, measured on the normal models: per seed, how far training twice as
    long (the run of ``until`` x epochs against the run of half that) moves the normalised test
    loss, as log(half / full) (positive: it improved). Two-sided and relative: a seed that gets
    *worse* by a tenth has not converged either, and a loss of 0.01 that halves has moved as much
    as one of 0.5 that halves. A seed has converged when the move is within ``tolerance``
    (log 1.1) either way; the task, when the median over seeds of the moves' sizes is. The
    median, so that one seed escaping a plateau late does not decide it; the seeds that meet it on
    their own are counted beside. The flag is decided by the sign-test bounds of that median
    (:func:`bounded_state`), relative (log 1.1) and absolute (:data:`ABSOLUTE_TOLERANCE`):
    ``holds`` names the criterion that holds ("relative", "absolute" or "neither"), ``converged``
    is whether one does, and ``median_rule`` keeps the median's own reading.

    Returns the per-seed numbers, the median move and whether the criterion holds, for the normal
    model at the paper's learning rate (the first normal model of each seed)."""
    first = {}
    for model in record["models"]:
        if model["group"] == "normal":
            first.setdefault(model["seed"], model)
    half = {s: normalised_loss(record, m, until / 2) for s, m in first.items()}
    full = {s: normalised_loss(record, m, until) for s, m in first.items()}
    moves = {s: log_ratio(half[s], full[s]) for s in first}
    criterion = verdicts.converged(list(moves.values()), tolerance, two_sided=True)
    relative = bounded_state([abs(m) for m in moves.values()], tolerance)
    absolute = bounded_state([abs(half[s] - full[s]) for s in first], ABSOLUTE_TOLERANCE)
    holds = "relative" if relative == "holds" else "absolute" if absolute == "holds" else "neither"
    return {
        "criterion": f"median over seeds of |log(half / full)|, how far the normal model's normalised test "
                     f"loss moves when training twice as long, is below log(1.1) = {tolerance:.3f}",
        "tolerance": tolerance,
        "epochs": run_length(record, until),
        "half": {seed_key(s): finite_or_none(v) for s, v in half.items()},
        "full": {seed_key(s): finite_or_none(v) for s, v in full.items()},
        "move": {seed_key(s): finite_or_none(v) for s, v in moves.items()},
        "seeds_converged": criterion["seeds_converged"],
        "median_move": finite_or_none(criterion["median_improvement"]),
        "median_rule": criterion["converged"],
        # decided by sign-test bounds, not by where the median falls, so that round-off (the
        # grouping of float32 sums) cannot flip it: "holds", "fails" or "undecided" at this n
        "relative": relative,
        "absolute": absolute,
        "absolute_tolerance": ABSOLUTE_TOLERANCE,
        "holds": holds,
        "converged": holds != "neither",
    }


def bounded_state(sizes, tolerance, alpha=0.05):
    """Whether the median of ``sizes`` (how far each seed moved) is below ``tolerance``, by the
    one-sided sign-test bounds at ``alpha``: "holds" where the upper bound is below it, "fails"
    where the lower bound is at or above it, "undecided" between (and below 5 seeds)."""
    finite = [x if math.isfinite(x) else math.inf for x in sizes if not math.isnan(x)]
    lower, upper, _ = statistics.one_sided_bounds(finite, alpha)
    if upper is not None and upper < tolerance:
        return "holds"
    if lower is not None and lower >= tolerance:
        return "fails"
    return "undecided"


def log_ratio(before, after):
    """log(before / after): how much a loss fell (negative: it rose); inf where only ``after``
    diverged, -inf where only ``before`` did, nan where both did."""
    if math.isinf(before) and math.isinf(after):
        return math.nan
    if math.isinf(after) or math.isinf(before):
        return -math.inf if math.isinf(after) else math.inf
    return math.log(max(before, 1e-300) / max(after, 1e-300))


def criteria(record):
    """:func:`convergence` at every run length of a long run whose half-length run it also holds."""
    epochs = len(record["epochs"])
    marks = [length for length in record["run_lengths"] if length // 2 in record["run_lengths"]]
    return [convergence(record, until=length / epochs) for length in marks]


def finite_or_none(value):
    """JSON has no nan: a diverged loss is written as null."""
    return value if math.isfinite(value) else None


def curves(result, group, seed=None, *, kind="test"):
    """{name: (seeds, points) tensor} for one group, nan where a run diverged: ``kind="test"`` gives
    the test losses at the checkpoints divided by each seed's label variance (that of the curve's
    own test set for a record with ``speed_scale`` "curve", a new task per prompt), ``kind="train"``
    the raw per-epoch training losses."""
    found = {}
    for model in result["models"]:
        if model["group"] == group and (seed is None or model["seed"] == seed):
            if kind == "test":
                scale = curve_scale(result, model["seed"])
                losses = [math.nan if x is None else x / scale for x in model["test_curve"]]
            else:
                losses = [math.nan if x is None else x for x in model["train_loss"]]
            found.setdefault(model["name"], []).append(losses)
    return {name: torch.tensor(rows, dtype=torch.float64) for name, rows in found.items()}


def normalised_baselines(result):
    """{baseline: (seeds,) tensor}: each baseline's test loss divided by the seed's label variance."""
    per_seed = list(result["baselines"].values())
    names = [n for n in per_seed[0] if n not in ("label_variance", "nadaraya_watson_temperature")]
    return {n: torch.tensor([b[n] / b["label_variance"] for b in per_seed], dtype=torch.float64) for n in names}


def equivalence_gaps(records):
    """{(task, seed): (squared gap at t = 0, at t = N)} of the equivalence curves of task records."""
    return {(kind, seed): (curve["squared_error"][0], curve["squared_error"][-1])
            for kind, record in records.items() for seed, curve in record["equivalence"].items()}


def describe_config(config):
    """The choices the paper leaves open, as a Markdown list, from a task record's config."""
    def names(items):
        return ", ".join(f"`{Modification(**m).name}`" for m in items)

    if config.get("schedule", "constant") == "decay":
        schedule = (f"the learning rate decays linearly to 0 over the last {config['decay_fraction']:.0%} of the "
                    f"steps; the same run at {config['epochs'] // 2} epochs is copied off (convergence check)")
    else:
        schedule = "constant learning rate (the paper's)"
    return "\n".join([
        f"- epochs: **{config['epochs']}**, test losses at {config['checkpoints']} checkpoints on "
        f"{config['test_sequences']} fixed test sequences per seed"
        + (f"; final losses and baselines on {config['final_test_sequences']} other fixed sequences"
           if "final_test_sequences" in config else ""),
        f"- schedule: {schedule}",
        f"- seeds: {config['seeds']} (drawn 0, 1, 2, ... until {config.get('deciding', SEEDS_THAT_CAN)} pass "
        "the screen); a seed "
        "fixes the task weight, the data stream, the test set and the initial layer, so the variants of one "
        "seed start from the same weights and see the same sequences"
        + ("; each seed also trains a round-off twin of its normal model" if config.get("twins") else ""),
        f"- learning rates: {config['lr_normal']:g} (normal, regularized), {config['lr_other']:g} (others); "
        "a normal model is trained at each",
        f"- regularized: {names(config['regularized'])}",
        f"- augmented (g1, g2): {', '.join(f'({a}, {b})' for a, b in config['augmentations'])}",
        f"- negative samples (k, beta): {', '.join(f'({k}, {b:g})' for k, b in config['negatives'])}",
        f"- combinations: {names(config['combinations'])}",
    ])


def trained_layers(record, num_tokens=16):
    """One :class:`icl_lens.approximation.AttentionLayer` per seed: the trained normal model's
    weights (float64) on the first ``num_tokens`` tokens of the seed's first test sequence."""
    config = record["config"]
    task = RegressionTask(**config["task"])
    weights = task_data(task, [int(s) for s in record["trained_normal"]]).weights
    layers = []
    for seed, trained in record["trained_normal"].items():
        tokens, _ = test_sets(task, {int(seed): weights[int(seed)]}, 1)[int(seed)]
        W_Q, W_K, W_V = (torch.tensor(trained[n], dtype=torch.float64) for n in ("W_Q", "W_K", "W_V"))
        layers.append(AttentionLayer(tokens[0, :num_tokens], W_Q, W_K, W_V))
    return layers


def approximation_config(quick=False, orthogonal=False):
    """The random-feature study's settings (Figs. 6-8): the paper's, or quick mode's three d_r."""
    if quick:
        return ApproximationConfig(feature_counts=(10, 100, 1200), repeats=5, orthogonal=orthogonal)
    return ApproximationConfig(orthogonal=orthogonal)


def approximation_study(linear, *, quick, device):
    """Figs. 6-8: random layers (iid and orthogonal features) and the trained layers of the linear
    task's normal models (iid features), MSE / MAE against d_r."""
    configs = {"iid (random layers)": approximation_config(quick),
               "orthogonal (random layers)": approximation_config(quick, True)}
    study = {name: approximation_error(c, device=device) for name, c in configs.items()}
    study["trained layers (linear task)"] = approximation_error(
        approximation_config(quick), device=device, layers=trained_layers(linear))
    return study


def heatmaps(linear, device, num_features=1200, seed=0):
    """Fig. 9: the trained normal layer of the linear task's first seed on 16 test tokens, exact
    attention against d_r = 1200 random features (:func:`icl_lens.approximation.compare`)."""
    layer = trained_layers(linear)[0]
    layer = AttentionLayer(*(x.to(device) for x in (layer.tokens, layer.W_Q, layer.W_K, layer.W_V)))
    omega = draw_omega(layer.W_K.shape[0], num_features, generator=make_generator(seed), device=device)
    return compare(layer, PositiveRandomFeatures(omega))
