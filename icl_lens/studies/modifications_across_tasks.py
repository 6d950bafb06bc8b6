"""R&L's attention modifications where in-context learning happens: the Section 5 layer trained with
a new task weight W for every prompt, and the linear task's Section 5 claims judged again on it.

Chapters: modifications_across_tasks.

R&L train each modified layer on one fixed task per seed (Sec. 5, App. E.1) and leave "the
multi-task scenario" open: with a new task at each step "a single attention layer" gave
"disordered predictions". The across-tasks chapter found that one layer does learn the linear task
with a new task per prompt when trained with Adam on batches of prompts. Here the Section 5 study
itself (:func:`icl_lens.studies.section5.run_experiments`: the same
:class:`~icl_lens.training.ensemble.AttentionEnsemble`, the same modifications, decay schedule,
half-length run, test sets, round-off twins, context use, journal and pool) runs under its
``protocol="new task per prompt"``: every training and test sequence has its own W ~ N(0, I), Adam
on ``batch`` prompts per step, one learning rate for every model (learning-rate matched), the
primary (proportional) reading of alpha. The training-free baselines are those of a new task per
prompt: zero, the context mean, least squares and one gradient step at its best learning rate
(:func:`icl_lens.studies.section5.new_task_baselines`).

The claims of the linear task (:data:`icl_lens.studies.section5_claims.CLAIMS`) are judged on this
record by the same rules, as rows of their own family: :func:`claims`.
"""

import math
from dataclasses import asdict, dataclass, field, replace

from icl_lens.studies import section5, section5_claims
from icl_lens.studies.section5 import ALPHAS, ExperimentConfig, regularized_grid
from icl_lens.tasks import RegressionTask
from icl_lens.training.data import new_task_sequences  # noqa: F401  (the protocol's draw, named here too)
from icl_lens.training.ensemble import Modification
from icl_lens.validation import check_positive_float, check_positive_int, check_seeds

PROTOCOL = "new task per prompt"
TASKS = {"linear": RegressionTask.linear, "trigonometric": RegressionTask.trigonometric,
         "exponential": RegressionTask.exponential}
# the rows of this protocol are judged on the record under this name (claims.json's "task")
FAMILY = "linear (new task per prompt)"
# The levels the speed rows are read at (fractions of the label variance) follow a rule declared
# before the pilot ran, on the pilot's normal models only (:func:`levels_from_pilot`): the layers
# plateau near 0.7 of the label variance here (0.01-0.03 on one fixed task), so the fixed-task
# levels are never reached. Each level lies between the normal models' first loss and the highest
# running minimum they reach by half the run, at these fractions of the way in log loss:
LEVEL_FRACTIONS = {"speed, early": 0.25, "speed": 0.5, "speed, late": 0.75}
# the pilot the full study reads its levels from (the seeds are not the study's: nothing tuned on
# the pilot votes)
PILOT = ("book", "data", "modifications_pilot")
PILOT_SEEDS = (1000, 1001)
# the generators of a seed's draws are offset by up to 9_000_000 (icl_lens.training.data and
# icl_lens.studies.section5) and its layer by 10_000: seeds below this stay apart from them all
LARGEST_SEED = 9_999


@dataclass(frozen=True)
class StudyConfig:
    """The study (or a pilot) of one task under the new-task protocol. Defaults: the linear task's
    study. ``variants`` "claims": every model the linear claims name (normal, alpha in
    {-0.5, -0.1, 0.1, 0.5} proportional, g1, g2, g1 + g2, g2+, the six negative-sample settings, the
    six combinations) and the normal model's round-off twin; "pilot": normal and g2; "normal": the
    normal model alone (the learnability pilots)."""

    kind: str = "linear"
    variants: str = "claims"
    seeds: tuple = tuple(range(20))
    # Sized by a first pilot (linear task, normal and g2, seeds 1000-1001, Section 5's d_r = 1200,
    # 2000 steps of 64 prompts): 716 s for its 4 models beside the Section 5 sweep, about 20
    # seeds x 22 models at 6.7 h here, and seed 1001 never left the first plateau (0.99 of the
    # label variance; the across-tasks layers left it after 0.5-0.7 million prompts). So: 6000
    # steps of 128 prompts (768 thousand prompts), d_r = 128, an epoch of 25 steps read at every
    # epoch (the first fall, within tens of Adam steps at 0.01, is resolved)
    epochs: int = 240
    steps_per_epoch: int = 25
    batch: int = 128                # prompts per step, each with its own W
    lr: float = 1e-2                # Adam, every model
    num_features: int = 128         # d_r (Section 5's 100 (d_t + d_s) = 1200 does not fit the budget)
    # the curve's test set: 1024 prompts, since its labels' variance (each prompt its own W)
    # scales the speed levels
    test_sequences: int = 1024
    final_test_sequences: int = 4096
    checkpoints: int = 240
    # the speed levels: None reads them from the saved pilot (levels_from_pilot); "own" applies the
    # rule to the study's own normal models (quick mode only: its verdicts decide nothing)
    speed_levels: object = None

    def __post_init__(self):
        if self.kind not in TASKS:
            raise ValueError(f"kind must be one of {sorted(TASKS)}, got {self.kind!r}")
        if self.variants not in ("claims", "pilot", "normal"):
            raise ValueError(f"variants must be 'claims', 'pilot' or 'normal', got {self.variants!r}")
        if self.variants == "claims" and self.kind != "linear":
            raise ValueError("variants='claims' is the linear task's study; the other tasks have a pilot ('normal')")
        check_seeds(self.seeds)
        if max(self.seeds) > LARGEST_SEED:
            raise ValueError(f"seeds must be at most {LARGEST_SEED} (their draws' generators are offset from the "
                             f"seed), got {max(self.seeds)}")
        if self.speed_levels not in (None, "own") and not isinstance(self.speed_levels, tuple):
            raise ValueError(f"speed_levels must be None, 'own' or a tuple of (quantity, level), got "
                             f"{self.speed_levels!r}")
        for name in ("epochs", "steps_per_epoch", "batch", "test_sequences", "final_test_sequences", "checkpoints"):
            check_positive_int(getattr(self, name), name)
        if self.num_features is not None:
            check_positive_int(self.num_features, "num_features")
        check_positive_float(self.lr, "lr")

    def experiment(self):
        """The Section 5 config of this study."""
        task = TASKS[self.kind]()
        return ExperimentConfig(
            task=task, protocol=PROTOCOL, optimizer="adam", batch=self.batch, lr_normal=self.lr, lr_other=self.lr,
            epochs=self.epochs, tokens_per_epoch=self.steps_per_epoch * self.batch * task.num_tokens,
            seeds=tuple(self.seeds), regularized=regularized_grid(ALPHAS, forms=("proportional",)),
            num_features=self.num_features, test_sequences=self.test_sequences,
            final_test_sequences=self.final_test_sequences, checkpoints=self.checkpoints)

    def variant_list(self):
        config = self.experiment()
        if self.variants == "claims":
            return config.variants()
        normal = section5.Variant("normal", Modification(), self.lr)
        if self.variants == "normal":
            return [normal]
        return [normal, section5.Variant("augmented", Modification(key_map="gelu"), self.lr)]

    def quick(self):
        """CI sizes (well under a minute): two seeds, 4 epochs of 4 steps of 16 prompts, d_r = 64;
        the speed levels from its own normal models."""
        return replace(self, seeds=tuple(self.seeds)[:2], epochs=4, steps_per_epoch=4, batch=16, num_features=64,
                       test_sequences=16, final_test_sequences=32, checkpoints=4, speed_levels="own")


@dataclass(frozen=True)
class PilotConfig:
    """The pilots, run before the study: on the linear task the normal and g2 models (steps to
    convergence and time per step, which fixed the study's sizes and speed levels), on the
    trigonometric and exponential tasks the normal model alone (can one layer learn them across
    tasks at all, and is their loss measurable?), at the study's sizes."""

    seeds: tuple = PILOT_SEEDS
    kinds: tuple = tuple(TASKS)
    quick_sizes: bool = False

    def __post_init__(self):
        check_seeds(self.seeds)
        if max(self.seeds) > LARGEST_SEED:
            raise ValueError(f"seeds must be at most {LARGEST_SEED}, got {max(self.seeds)}")
        unknown = [k for k in self.kinds if k not in TASKS]
        if not self.kinds or unknown:
            raise ValueError(f"kinds must name tasks of {sorted(TASKS)}, got {self.kinds!r}")

    def studies(self):
        found = [StudyConfig(kind=kind, variants="pilot" if kind == "linear" else "normal", seeds=self.seeds)
                 for kind in self.kinds]
        return [study.quick() for study in found] if self.quick_sizes else found

    def quick(self):
        return replace(self, seeds=tuple(self.seeds)[:2], quick_sizes=True)


def run_pilot(config, *, device="cpu", progress=False, workers=1, scheduler=None, journal=None, keep=False):
    """Train the pilots in one pool: {"study": the pilot config, "records": {task: task record},
    "seconds": {task: training seconds}}."""
    studies = config.studies()
    records, seconds = section5.run_experiments([s.experiment() for s in studies], device=device, progress=progress,
                                                compile=False, variants=[s.variant_list() for s in studies],
                                                workers=workers, scheduler=scheduler, journal=journal, keep=keep)
    for record in records:
        record["protocol"] = PROTOCOL
        record["speed_scale"] = "curve"
        try:
            record["speed_levels"] = levels_from_pilot(record)
        except ValueError as error:   # a task whose normal layer does not fall: no level to place
            record["speed_levels"], record["speed_levels_from"] = None, str(error)
    return {"study": {**asdict(config), "seeds": list(config.seeds),
                      "sizes": {s.kind: asdict(s) for s in studies}},
            "records": {s.kind: r for s, r in zip(studies, records)},
            "seconds": {s.kind: t for s, t in zip(studies, seconds)}}


def pilot_claims(saved):
    """The pilots decide no claim: their reading is :func:`learnability` (in the chapter)."""
    return []


# a job of the study is one seed's part of its models, as in Section 5; the journal keeps them
JOURNALED = True


def run_study(config, *, device="cpu", progress=False, workers=1, scheduler=None, journal=None, keep=False):
    """Train the study: {"study": its config, "record": the task record (Section 5's format,
    read by :mod:`icl_lens.studies.section5_readings`) with this protocol's speed levels}."""
    records, seconds = section5.run_experiments([config.experiment()], device=device, progress=progress,
                                                compile=False, variants=[config.variant_list()], workers=workers,
                                                scheduler=scheduler, journal=journal, keep=keep)
    record = records[0]
    record["protocol"] = PROTOCOL
    record["speed_scale"] = "curve"
    if config.speed_levels == "own":
        try:
            record["speed_levels"], source = levels_from_pilot(record), "by the rule on this run's own normal models"
        except ValueError as error:   # too short a run to fall: any levels serve a run that decides nothing
            record["speed_levels"], source = dict(QUICK_LEVELS), f"fixed for a quick run ({error})"
    elif config.speed_levels is None:
        record["speed_levels"], source = pilot_levels(), "read from the saved pilot (" + "/".join(PILOT) + ")"
    else:
        record["speed_levels"], source = dict(config.speed_levels), "as given"
    record["speed_levels_from"] = source
    return {"study": {**asdict(config), "seeds": list(config.seeds), "seconds": seconds[0]}, "record": record}


def levels_from_pilot(record):
    """The speed levels by the rule declared before the pilot ran (:data:`LEVEL_FRACTIONS`), on the
    normal models of a task record: with L0 the median over them of the first epoch's training loss
    and L1 the highest running minimum of their test curves by half the run (each divided by the
    curve's label variance), the level at fraction q is L0^(1 - q) L1^q. Every normal model of the
    record reaches every level by half its run."""
    normal = [m for m in record["models"] if m["group"] == "normal"]
    half = section5.run_length(record, 0.5)
    first, reached = [], []
    for model in normal:
        variance = record["baselines"][section5.seed_key(model["seed"])]["curve_label_variance"]
        first.append(model["train_loss"][0] / variance)
        curve = [x / variance for epoch, x in zip(record["checkpoint_epochs"], model["test_curve"]) if epoch <= half]
        reached.append(min(curve) if curve else math.inf)
    start, end = sorted(first)[(len(first) - 1) // 2], max(reached)
    if not (math.isfinite(end) and 0 < end < start):
        raise ValueError(f"the normal models do not fall from {start:.3g} to a finite loss below it by half the run "
                         f"(highest running minimum {end:.3g}): no speed level can be placed")
    return {quantity: start ** (1 - q) * end ** q for quantity, q in LEVEL_FRACTIONS.items()}


def pilot_levels():
    """The linear task's speed levels from the saved pilot (``reproduce modifications-pilot --out
    book/data/modifications_pilot``), which must have run first, at the study's sizes."""
    from icl_lens.results import RecordError, load_result, repository_root

    folder = repository_root().joinpath(*PILOT)
    if not (folder / "modifications_pilot.json").exists():
        raise RecordError(f"the study reads its speed levels from the pilot, which is not in {folder}: run "
                          f"python -m icl_lens reproduce modifications-pilot --out {'/'.join(PILOT)} first")
    saved = load_result(folder, "modifications_pilot")
    if saved["study"].get("quick_sizes"):
        raise RecordError(f"{folder}/modifications_pilot.json is a quick run: run the pilot at the study's sizes")
    return saved["records"]["linear"]["speed_levels"]


def renamed(claim):
    """A linear claim of :data:`~icl_lens.studies.section5_claims.CLAIMS` as a row of this protocol:
    its own id and family; the same sentence, rule and models, with the one learning rate's normal
    model where the fixed-task row names the normal model at 0.005; no second reading of alpha (the
    study trains the primary one)."""
    pairs = claim.pairs
    if claim.id == "linear-g2-faster":
        pairs = section5_claims.against_each(section5_claims.augmented("none", "gelu"),
                                             ["normal", "g1=gelu", "g1=gelu + g2=gelu"])
    note = "" if claim.id == "linear-combination-sufficient" else claim.note   # every model at one rate here
    return replace(claim, id=f"{claim.id}-new-task", task=FAMILY, pairs=pairs, other_reading=None, note=note)


CLAIMS = tuple(renamed(c) for c in section5_claims.CLAIMS if c.task == "linear" and c.pairs is not None)


def claims(saved):
    """Every linear claim judged on the study's record by the one statistical design
    (:func:`icl_lens.studies.section5_claims.evaluate`), each row marked with its protocol and the
    fixed-task row it repeats."""
    rows = section5_claims.evaluate({FAMILY: saved["record"]}, CLAIMS)
    for row in rows:
        row["protocol"] = PROTOCOL
        row["fixed_task_id"] = row["id"].removesuffix("-new-task")
    return rows


def learnability(record):
    """Can one layer learn the task across tasks? Per seed of a task record, the normal model's
    final normalised loss against zero, the context mean, one gradient step and least squares
    (each normalised by the seed's label variance), and the range of its log loss over the four
    parts of the final test set (is the loss measurable?)."""
    found = {}
    for model in record["models"]:
        if model["group"] != "normal":
            continue
        base = record["baselines"][section5.seed_key(model["seed"])]
        variance = base["label_variance"]
        parts = [x for x in model["test_loss_parts"] if x is not None]
        spread = (max(math.log(x) for x in parts) - min(math.log(x) for x in parts)) if parts and min(parts) > 0 else None
        found[section5.seed_key(model["seed"])] = {
            "trained layer": None if model["test_loss"] is None else model["test_loss"] / variance,
            **{name: base[name] / variance for name in ("zero", "context_mean", "one_gd_step", "least_squares")},
            "log_range_over_parts": spread, "label_tail_share": base["label_tail_share"]}
    return found


# The pilots' reading, declared before they ran. A task is learnable across tasks where on every
# pilot seed the normal layer's final loss is below the context mean's by more than the verdicts'
# band (log 1.1); one gradient step at its best rate is reported beside it, not required (the
# Performer layer ends above it on the linear task). Its loss is measurable where on every seed a
# quarter of the final test set moves the log loss by less than twice the band, and the largest
# 1% of the test prompts carry less than half of the labels' second moment (else a handful of
# prompts decides every mean squared error). The action: the linear task's study runs; a task
# that is not learnable or not measurable is listed "not run" with the measurement; a learnable,
# measurable one is listed as the next study to run (each costs about as much as the linear one).
MEASURABLE = 2 * section5_claims.BAND
TAIL_SHARE = 0.5
# the levels of a quick run too short for its normal models to fall (its verdicts decide nothing)
QUICK_LEVELS = {"speed, early": 1.0, "speed": 0.95, "speed, late": 0.9}


def learnable(record):
    """The pilot's reading of one task (the rule above): ``learns`` and ``measurable`` with the
    ``table`` of :func:`learnability`."""
    table = learnability(record)
    learns = all(row["trained layer"] is not None and row["trained layer"] > 0
                 and math.log(row["context_mean"] / row["trained layer"]) > section5_claims.BAND
                 for row in table.values())
    measurable = all(row["log_range_over_parts"] is not None and row["log_range_over_parts"] < MEASURABLE
                     and row["label_tail_share"] < TAIL_SHARE for row in table.values())
    return {"learns": learns, "measurable": measurable, "table": table}
