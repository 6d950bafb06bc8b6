"""Regenerate the book's saved runs: ``python -m icl_lens reproduce fig3 [--quick] ...``.

Chapters: experiments, across_tasks, closeness_experiment, bert, intro.

Every output is a row of :data:`OUTPUTS`: a name, what it draws on and what it writes. What several
outputs draw on (a task's training record, the rank study, the random-feature study) is computed
at most once per call by :class:`Run`, so adding an output is adding a row.

    fig3    linear task: equivalence (Fig. 3 left) and the regularized, augmented, negative models
    fig6, fig7, fig8   random-feature approximation of attention against d_r, on random layers and
                       on the trained layers of the linear task (one study, one figure)
    fig9    exact against estimated attention at d_r = 1200, on a trained layer of the linear task
    fig10   linear task, each seed on its own
    fig11   trigonometric task;  fig12  exponential task
    fig13   combinations of modifications on the three tasks
    fig14   Rank(W_F) bound against the FFN width on trained attention + FFN layers (Theorem B.1)
    paired  every variant against the normal model of its seed and learning rate, per task
    claims  a verdict for every empirical claim of Section 5 / Appendix E (claims.json, no figure)
    context-use   does each trained layer read its context: the measurements of
                  icl_lens.context_use for every model, and for layers trained across tasks

Not part of ``all`` (minutes more on 2 CPU cores):

    convergence  the normal models of each task trained twice the saved run's epochs, with the
                 runs of 1/4, 1/2 and 3/4 of that length copied off, and the convergence
                 criterion at each doubling
    temperature  the linear task's normal, alpha < 0 and g2 models trained again without the
                 d**-1/4 scale of q and k, and their claims judged with and without it
                 (temperature.json; the linear task's record is read from --out when there;
                 with --reuse, the saved temperature.json is judged again, nothing trains)

Studies of their own chapters (not part of ``all``), each written with its claims
(``<file>_claims.json``):

    multitask    the across-tasks study: one attention layer trained with a new w per prompt
                 against zero, averaging, one GD step at the best learning rate and least squares
    softmax-regression   Li et al.'s experiment rebuilt: a trained softmax self-attention layer
                 against softmax regression after one GD step (closeness.json)
    table1       R&L Table 1 offline: the BERT modifications fine-tuned on the packaged
                 all-MiniLM-L6-v2 and a WordNet entailment task standing in for RTE (needs the
                 [bert] extra; quick mode: a tiny random BERT)

Each figure is written as ``<name>.png`` beside ``<name>.json`` (the numbers it plots); each task's
full training record goes to ``task_<kind>.json``. No timings go into the JSON files, so one seed
and setting give the same bytes.
"""

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from icl_lens import context_use
from icl_lens.device import pick
from icl_lens.figures import prompt_layers as prompt_layer_figures
from icl_lens.figures import section5 as section5_figures
from icl_lens.figures import table1 as table1_figures
from icl_lens.figures import theory as theory_figures
from icl_lens.results import (NUMBER, RecordError, check_writable_folder, load_result, repository_root,
                              results_dir, save_result, to_plain, write_json)
from icl_lens.studies import (across_tasks, ffn_rank, li_et_al, modifications_across_tasks, section5, section5_claims,
                              table1)
from icl_lens.training.journal import plain, record_differences
from icl_lens.validation import check_scheduler

ALL_TASKS = ("linear", "trigonometric", "exponential")
PANELS = ("regularized", "augmented", "negative")


def experiment_config(kind, *, quick=False, seeds=None, deciding=None):
    """A Section 5 task's configuration; quick mode trains its first two seeds unless ``seeds`` names
    them or ``deciding`` asks for more (a seed count asked for is never cut silently)."""
    config = section5.EXPERIMENTS[kind]() if deciding is None else section5.EXPERIMENTS[kind](deciding)
    if seeds is not None:
        config = replace(config, seeds=tuple(seeds))
    if not quick:
        return config
    return config.quick() if seeds is None and deciding is None else replace(config.quick(), seeds=config.seeds)


def check_output_folder(out):
    """Create ``out`` or fail with a clear error naming --out (not a traceback from deep inside)."""
    folder = check_writable_folder(out, "--out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--out {str(out)!r} is not a writable folder: {error.strerror}") from None
    return folder


class Run:
    """One call's settings and what its outputs share, each computed (or, with ``reuse``, read from
    ``out``) the first time an output asks for it; ``reproduce all`` trains the three tasks
    together (:meth:`tasks`) before its first output."""

    def __init__(self, out, *, quick, device, seeds, compile, reuse, workers, log, grow=False, scheduler=None,
                 deciding=None):
        self.out, self.quick, self.device, self.seeds = out, quick, device, seeds
        self.compile, self.reuse, self.workers, self.log = compile, reuse, workers, log
        self.grow, self.scheduler, self.deciding = grow, scheduler, deciding
        self.written, self._tasks, self._shared = {}, {}, {}

    def save(self, key, file, record, figure=None):
        self.written[key] = save_result(self.out, file, record, figure)
        return self.written[key]

    def saved(self, file):
        """The record ``file.json`` saved in ``out``. Reusing never trains, so a missing record is an
        error naming the command that makes it."""
        path = Path(self.out) / f"{file}.json"
        if not path.exists():
            quick = " --quick" if self.quick else ""
            raise RecordError(f"{path} is missing, and reusing saved records never trains: make it with "
                              f"python -m icl_lens reproduce {MADE_BY[file]}{quick} --out {self.out}")
        return load_result(self.out, file, expect=SCHEMAS.get(file))

    def say(self, line):
        if self.log is not None:
            self.log.write(line + "\n")

    def task(self, kind):
        """The training record of a Section 5 task (``task_<kind>.json``)."""
        return self.tasks((kind,))[kind]

    def tasks(self, kinds=ALL_TASKS):
        """{kind: training record}; the kinds not trained yet train together, their jobs in one
        pool of the run's workers (:func:`icl_lens.studies.section5.run_experiments`), taken in
        :data:`icl_lens.studies.section5.POOL_ORDER`."""
        missing = [kind for kind in section5.POOL_ORDER if kind in kinds and kind not in self._tasks]
        if self.reuse:
            self._tasks.update({kind: self.saved(f"task_{kind}") for kind in missing})
        elif missing:
            start = time.perf_counter()
            configs = [experiment_config(kind, quick=self.quick, seeds=self.seeds, deciding=self.deciding)
                       for kind in missing]
            if self.grow:
                for kind, config in zip(missing, configs):
                    self.check_growable(kind, config)

            def finished(i, record, seconds):   # saved as soon as its jobs end, before the others
                self._tasks[missing[i]] = record
                self.save(f"task_{missing[i]}", f"task_{missing[i]}", record)
                self.say(f"{missing[i]}: {len(record['models'])} models, {configs[i].epochs} epochs, {seconds:.1f} s "
                         f"(its jobs' time over {self.workers} worker(s))")

            # every finished job is kept in out/journal as it ends: --grow continues from there
            section5.run_experiments(configs, device=self.device, progress=self.log is not None,
                                     compile=self.compile, workers=self.workers, finished=finished,
                                     scheduler=self.scheduler, journal=Path(self.out) / JOURNAL, keep=self.grow)
            self.say(f"{' + '.join(missing)} (one pool): {time.perf_counter() - start:.1f} s")
        return {kind: self._tasks[kind] for kind in kinds}

    def check_growable(self, kind, config):
        """A saved task record without a journal can be grown only where it is of ``config``."""
        if (Path(self.out) / JOURNAL / kind / "configuration.json").exists() or \
                not (Path(self.out) / f"task_{kind}.json").exists():
            return   # the journal checks its own configuration
        saved = load_result(self.out, f"task_{kind}", expect={"config": dict})["config"]
        changed = record_differences(saved, plain(section5.journal_config(config)))
        if changed:
            raise ValueError(f"--grow: {self.out}/task_{kind}.json was trained with another configuration "
                             f"({'; '.join(changed[:4])}), so none of its runs can be reused; train it anew "
                             "without --grow")

    def shared(self, file, compute, draw, *, read_back=True, trains=False):
        """A study that several outputs use, saved once as ``file`` (read back with ``reuse``, unless
        ``read_back`` is False: then ``compute`` itself decides what it may reuse). A study that
        ``trains`` is never computed with ``reuse``: its record must be there."""
        if file not in self._shared:
            if read_back and self.reuse and (trains or (Path(self.out) / f"{file}.json").exists()):   # redraw only
                record = self.saved(file)
            else:
                record = compute()
            self._shared[file] = record
            self.save(file, file, record, draw(record))
        return self._shared[file]


def rank_study(run):
    """Fig. 14 on trained layers (``fig14.json``)."""
    def compute():
        config = ffn_rank.TrainedRankConfig()
        return ffn_rank.trained_rank_bound(config.quick() if run.quick else config, device=run.device,
                                           progress=run.log is not None)

    return run.shared("fig14", compute, lambda rank: theory_figures.rank_bound_figure(
        rank, paper_saturation=rank["paper_saturation"]), trains=True)


def approximation_study(run):
    """Figs. 6-8 (``fig6-8.json``)."""
    repeats = section5.approximation_config(run.quick).repeats
    return run.shared("fig6-8", lambda: section5.approximation_study(run.task("linear"), quick=run.quick,
                                                                     device=run.device),
                      lambda study: theory_figures.approximation_error_figure(
                          study, title=f"R&L Figs. 6-8: random features, median and quartiles of {repeats} repeats"))


def figure_numbers(result, groups):
    """The part of a task record that a figure plots."""
    keep = ("task", "config", "epochs", "checkpoint_epochs", "run_lengths", "baselines", "equivalence", "convergence")
    numbers = {key: result[key] for key in keep}
    numbers["models"] = [m for m in result["models"] if m["group"] in ("normal", *groups)]
    return numbers


def task_figure(name, kind):
    """Figs. 3, 11, 12: one task's panels, median and quartiles over seeds."""
    def write(run):
        result = run.task(kind)
        trained, voting = len(result["config"]["seeds"]), len(section5_claims.deciding_seeds(result))
        over = (f"{trained} seeds" if voting == trained
                else f"all {trained} trained seeds ({voting} vote)")
        title = (f"R&L Fig. {name[3:]}: {result['task']} task, {result['config']['epochs']} epochs, "
                 f"median and quartiles over {over}")
        figure = section5_figures.experiment_figure(result, PANELS, title=title)
        return run.save(name, name, figure_numbers(result, PANELS), figure)
    return write


# R&L Fig. 10 shows two seeds besides Fig. 3's; ours shows the first FIG10_ROWS trained seeds by
# number (fixed before training, not picked by how they trained); Fig. 3's median covers them all
FIG10_ROWS = 5


def seeds_figure(run):
    result = run.task("linear")
    seeds = result["config"]["seeds"]
    shown = seeds[:FIG10_ROWS]
    rows = "one seed a row" if len(shown) == len(seeds) else f"seeds {shown[0]}-{shown[-1]} of {len(seeds)}, one a row"
    title = f"R&L Fig. 10: linear task, {result['config']['epochs']} epochs, {rows}"
    figure = section5_figures.seeds_figure(result, PANELS, shown, title=title)
    return run.save("fig10", "fig10", figure_numbers(result, PANELS), figure)


def combinations_figure(run):
    tasks = run.tasks()
    epochs = ", ".join(f"{kind} {r['config']['epochs']}" for kind, r in tasks.items())
    figure = section5_figures.combinations_figure(tasks, title=f"R&L Fig. 13: combinations (epochs: {epochs})")
    numbers = {kind: figure_numbers(result, ("combination",)) for kind, result in tasks.items()}
    return run.save("fig13", "fig13", numbers, figure)


def paired_figure(run):
    rows = {kind: section5_claims.variant_rows(result) for kind, result in run.tasks().items()}
    figure = section5_figures.paired_figure(rows, title="every variant against the normal model of its seed and "
                                                        "learning rate")
    return run.save("paired", "paired", rows, figure)


def approximation_figure(run):
    approximation_study(run)
    return run.written["fig6-8"]


def heatmaps_study(run):
    """Fig. 9 on the first seed's trained layer (``fig9.json``)."""
    def compute():
        compared = section5.heatmaps(run.task("linear"), run.device)
        return {key: value.tolist() for key, value in compared.items()}

    return run.shared("fig9", compute, lambda compared: theory_figures.attention_heatmaps_figure(
        *(torch.tensor(compared[key]) for key in ("attention", "attention_estimate", "output", "output_estimate")),
        1200))


def heatmaps_figure(run):
    heatmaps_study(run)
    return run.written["fig9"]


def rank_figure(run):
    rank_study(run)
    return run.written["fig14"]


def section5_verdicts(run):
    verdicts = section5_claims.every_verdict(run.tasks(), approximation_study(run), heatmaps_study(run),
                                             rank_study(run))
    return run.save("claims", "claims", {"rules": section5_claims.RULES, "claims": verdicts})


def context_use_output(run):
    """Does each trained layer read its context (``context_use.json``): the measurements of
    :mod:`icl_lens.context_use` of every model of the three tasks (from their records), and of the
    layers trained with a new task per prompt (:func:`icl_lens.studies.across_tasks.context_use_study`,
    trained here: the same layers as the across-tasks study's)."""
    def across():
        if run.reuse:   # trained before: read back
            return run.saved("context_use")["across_tasks"]
        study = across_tasks.StudyConfig()
        study = study.quick() if run.quick else study
        if run.seeds is not None:
            study = replace(study, seeds=tuple(run.seeds))
        return across_tasks.context_use_study(study, device=run.device, workers=run.workers,
                                              scheduler=run.scheduler)

    def compute():   # the task records' part is read from them, so it follows a retrained task
        return {"measures": context_use.MEASURES,
                "tasks": {kind: section5.context_use_by_model(record) for kind, record in run.tasks().items()},
                "across_tasks": across()}

    run.shared("context_use", compute, section5_figures.context_use_figure, read_back=False)
    return run.written["context_use"]


def temperature_check(run):
    """The linear task's normal, alpha < 0 and g2 models trained again without the d**-1/4 scale of
    q and k, and the claims about them judged with and without it (``temperature.json``)."""
    def compute():
        config = section5.temperature_experiment()
        if run.seeds is not None:
            config = replace(config, seeds=tuple(run.seeds))
        config = config.quick() if run.quick else config
        return judged(section5.run_experiment(config, device=run.device, progress=run.log is not None,
                                              compile=run.compile, workers=run.workers,
                                              scheduler=run.scheduler))

    def judged(record):
        record["convergence"] = section5.convergence(record)   # a reused record: by the current criterion
        return {"record": record, "claims": section5_claims.temperature_check(linear(), record)}

    def linear():   # the run the check compares with: the one saved in out, if there, never overwritten
        if not run.reuse and (Path(run.out) / "task_linear.json").exists():
            return load_result(run.out, "task_linear", expect=SCHEMAS["task_linear"])
        return run.task("linear")

    if run.reuse:   # judged again, no training
        return run.save("temperature", "temperature", judged(run.saved("temperature")["record"]))
    run.shared("temperature", compute, lambda record: None)
    return run.written["temperature"]


def convergence_study(run):
    if run.reuse:   # judged again, no training
        studies = run.saved("convergence")
        for study in studies.values():
            study["criterion"] = section5.criteria(study["record"])
    else:
        # its own journal (its long runs are another configuration than the tasks'): --grow continues it
        studies = section5.convergence_studies(section5.POOL_ORDER, quick=run.quick, device=run.device,
                                               workers=run.workers, compile=run.compile, progress=run.log is not None,
                                               scheduler=run.scheduler, journal=Path(run.out) / JOURNAL / "convergence",
                                               keep=run.grow)
        studies = {kind: studies[kind] for kind in section5.EXPERIMENTS}   # the figure's order
    return run.save("convergence", "convergence", studies, section5_figures.convergence_figure(studies))


@dataclass(frozen=True)
class Study:
    """A study of its own chapter: its module (with ``StudyConfig``, ``run_study`` and ``claims``),
    the file it is saved as and its figure; ``config``, ``run`` and ``claims`` stand in for the
    module's three where one module holds two outputs (a study and its pilot). A module with
    ``JOURNALED`` keeps each finished job in ``<out>/journal/<file>`` (``--grow`` continues it)."""

    module: object
    file: str
    figure: object
    config: object = None
    run: object = None
    claims: object = None

    def default_config(self):
        return (self.config or self.module.StudyConfig)()

    def train(self, *args, **kwargs):
        return (self.run or self.module.run_study)(*args, **kwargs)

    def judge(self, record):
        return (self.claims or self.module.claims)(record)

    @property
    def journaled(self):
        return getattr(self.module, "JOURNALED", False)


def study_title(name, record):
    seeds = tuple(record["study"]["seeds"])
    if name == "multitask":
        return f"one attention layer across tasks: median and quartiles over seeds {seeds}"
    if name == "table1":
        model = "a tiny random BERT" if record["study"]["model"] == table1.TINY_BERT else "all-MiniLM-L6-v2"
        return f"Table 1 offline: {model} on WordNet entailment, seeds {seeds}"
    if name == "modifications-across-tasks":
        return f"R&L's modifications with a new task per prompt (linear task): median and quartiles over {len(seeds)} seeds"
    if name == "modifications-pilot":
        return f"pilots of the new-task protocol: the normal layer (and g2), seeds {seeds}"
    return f"a trained softmax layer against one GD step (Li et al., rebuilt): median and quartiles over seeds {seeds}"


STUDIES = {
    "multitask": Study(across_tasks, "multitask", prompt_layer_figures.across_tasks_figure),
    "softmax-regression": Study(li_et_al, "closeness", prompt_layer_figures.softmax_layer_figure),
    "table1": Study(table1, "table1", table1_figures.table1_figure),
    "modifications-across-tasks": Study(
        modifications_across_tasks, "modifications_across_tasks",
        lambda record, title: section5_figures.experiment_figure(
            record["record"], ["regularized", "augmented", "negative", "combination"], title=title)),
    "modifications-pilot": Study(
        modifications_across_tasks, "modifications_pilot",
        lambda record, title: section5_figures.pilot_figure(record["records"], title=title),
        config=modifications_across_tasks.PilotConfig, run=modifications_across_tasks.run_pilot,
        claims=modifications_across_tasks.pilot_claims),
}


def chapter_study(name):
    """The output of a study of its own chapter: ``<file>.json`` and its figure, and the study's
    claims as ``<file>_claims.json`` (``reuse``: redrawn from the JSON already in ``out``; ``grow``:
    the saved record's runs kept and only the runs the current configuration adds trained)."""
    study = STUDIES[name]

    def write(run):
        config = study.default_config()
        config = config.quick() if run.quick else config
        if run.seeds is not None:
            config = replace(config, seeds=tuple(run.seeds))
        there = (Path(run.out) / f"{study.file}.json").exists()
        if run.reuse:   # redraw only
            record = run.saved(study.file)
            if hasattr(study.module, "summarise"):   # its summary follows the study's current rules
                record["summary"] = study.module.summarise(record)
        else:
            lent = {}
            if study.journaled:   # each finished job is kept; --grow reads them back
                lent = {"journal": Path(run.out) / JOURNAL / study.file, "keep": run.grow}
            elif run.grow and there:
                # the saved record lends the runs the study shares with it; only the others train
                if not hasattr(study.module, "reusable_runs"):
                    raise ValueError(f"--grow: the {name} study cannot reuse a saved record's runs")
                lent["previous"] = load_result(run.out, study.file, expect=SCHEMAS.get(study.file))
                if not study.module.reusable_runs(config, lent["previous"]):
                    raise ValueError(f"--grow: {run.out}/{study.file}.json was trained with another model, data "
                                     "or optimiser, so none of its runs can be reused; train it anew without --grow")
            start = time.perf_counter()
            record = study.train(config, device=run.device, progress=run.log is not None,
                                 workers=run.workers, scheduler=run.scheduler, **lent)
            run.say(f"{name}: {time.perf_counter() - start:.1f} s")
        paths = run.save(name, study.file, record, study.figure(record, title=study_title(name, record)))
        # judged on the record as saved (JSON sorts its keys), as the chapter reads it back
        saved = load_result(run.out, study.file)
        run.save(f"{name} claims", f"{study.file}_claims", {"claims": study.judge(saved)})
        return paths
    return write


# name: (what it writes, part of ``all``)
OUTPUTS_TABLE = {
    "fig3": (task_figure("fig3", "linear"), True),
    "fig6": (approximation_figure, True),
    "fig7": (approximation_figure, True),
    "fig8": (approximation_figure, True),
    "fig9": (heatmaps_figure, True),
    "fig10": (seeds_figure, True),
    "fig11": (task_figure("fig11", "trigonometric"), True),
    "fig12": (task_figure("fig12", "exponential"), True),
    "fig13": (combinations_figure, True),
    "fig14": (rank_figure, True),
    "paired": (paired_figure, True),
    "claims": (section5_verdicts, True),
    "context-use": (context_use_output, True),
    "temperature": (temperature_check, False),
    "convergence": (convergence_study, False),
    **{name: (chapter_study(name), False) for name in STUDIES},
}
# the Section 5 outputs drawn from the task records grow them through the journal (out/journal);
# with "all" the other outputs are computed as without --grow
GROWS = (*(name for name, study in STUDIES.items() if hasattr(study.module, "reusable_runs") or study.journaled),
         "fig3", "fig10", "fig11", "fig12", "fig13", "paired", "convergence", "all")
JOURNAL = "journal"
FIGURES = tuple(name for name, (_, in_all) in OUTPUTS_TABLE.items() if in_all)
EXTRA = ("convergence", "temperature")   # named on the command line only, never by "all"
STUDY_FILES = {name: study.file for name, study in STUDIES.items()}
# what the outputs read of each saved record, checked when it is read back (a field missing or of
# another type is an error naming the file and the field, not a KeyError while drawing)
TASK_RECORD = {"task": str, "config": dict, "config.seeds[]": int, "config.epochs": int, "epochs[]": int,
               "checkpoint_epochs[]": int, "run_lengths[]": int, "baselines[].label_variance": float,
               "equivalence[].squared_error[]": NUMBER, "models": list, "models[].name": str, "models[].group": str,
               "models[].seed": int, "models[].lr": float, "models[].test_loss": NUMBER,
               "models[].test_curve[]": NUMBER, "models[].train_loss[]": NUMBER, "convergence": dict}
STUDY_RECORD = {"study": dict, "study.seeds[]": int}
SCHEMAS = {**{f"task_{kind}": TASK_RECORD for kind in ALL_TASKS},
           "temperature": {"record": dict, **{f"record.{key}": kind for key, kind in TASK_RECORD.items()}},
           "convergence": {"[].record": dict, "[].saved_run_epochs": int,
                           **{f"[].record.{key}": kind for key, kind in TASK_RECORD.items() if key != "convergence"}},
           "context_use": {"measures": dict, "tasks": dict, "across_tasks": dict},
           "fig14": {"hidden_sizes[]": int, "paper_saturation": int, "bound_per_seed[][]": NUMBER},
           "multitask": {**STUDY_RECORD, "settings": dict},
           "closeness": {**STUDY_RECORD, "dims": dict, "lengths": dict},
           "table1": {**STUDY_RECORD, "study.model": str, "runs[].setting": str, "runs[].seed": int,
                      "runs[].train_loss[]": NUMBER}}
# the output that trains each saved record, named when reusing finds the record missing
MADE_BY = {"task_linear": "fig3", "task_trigonometric": "fig11", "task_exponential": "fig12", "fig14": "fig14",
           "context_use": "context-use", "temperature": "temperature", "convergence": "convergence",
           **{study.file: name for name, study in STUDIES.items()}}
# what ``reproduce all`` writes (JSON names), which the experiments chapter reads
OUTPUTS = ("fig3", "fig6-8", "fig9", "fig10", "fig11", "fig12", "fig13", "fig14", "paired", "claims",
           "context_use",
           *(f"task_{kind}" for kind in ALL_TASKS))


def reproduce(names, *, out, quick=False, device="cpu", seeds=None, compile=None, reuse=False, workers=None,
              log=sys.stderr, grow=False, scheduler=None, deciding_seeds=None):
    """Write the named outputs of :data:`OUTPUTS_TABLE` (or ``"all"``: every one that is part of
    it) under ``out``; return {name: paths written}.

    ``compile`` trains through ``torch.compile`` (default: in full mode); ``workers`` (default: 2 in
    full mode on the CPU, else 1) trains in that many processes, one thread each, see
    :func:`icl_lens.training.loop.run_jobs`. ``reuse=True`` draws from the records already in
    ``out`` instead of training again (to restyle figures or recompute verdicts), and never trains:
    a record it needs and does not find is a :class:`icl_lens.results.RecordError` naming the
    command that makes it; ``grow=True`` keeps a saved record's runs and trains only those the
    current configuration adds (Table 1; the Section 5 tasks through the journal of finished jobs in
    ``out/journal``: new seeds, or the jobs an interrupted run had not finished). ``deciding_seeds``:
    the Section 5 tasks draw seeds until this many pass the screen (default
    :data:`icl_lens.studies.section5.SEEDS_THAT_CAN`; not with ``seeds``).
    ``scheduler``, a Dask scheduler's address, sends the training jobs to that cluster
    (:func:`icl_lens.training.loop.run_jobs`): the same records as the local pool of ``workers``.
    """
    everything = "all" in names
    names = list(FIGURES) + [n for n in names if n in OUTPUTS_TABLE and n not in FIGURES] \
        if everything else list(dict.fromkeys(names))
    unknown = [n for n in names if n not in OUTPUTS_TABLE]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {list(OUTPUTS_TABLE)} or 'all'")
    if grow and reuse:
        raise ValueError("--grow trains what the saved record lacks, --reuse never trains: give one of them")
    check_scheduler(scheduler)
    if scheduler is not None and reuse:
        raise ValueError("--scheduler sends training jobs, --reuse never trains: give one of them")
    if deciding_seeds is not None:
        if seeds is not None:
            raise ValueError("--seeds names the seeds, --deciding-seeds draws them: give one of them")
        if reuse:
            raise ValueError("--deciding-seeds chooses seeds to train, --reuse never trains: give one of them")
        if not isinstance(deciding_seeds, int) or isinstance(deciding_seeds, bool) or deciding_seeds < 1:
            raise ValueError(f"--deciding-seeds must be a positive integer, got {deciding_seeds!r}")
    if grow and not everything and [n for n in names if n not in GROWS]:
        raise ValueError(f"--grow applies to {', '.join(GROWS)} only, not {', '.join(n for n in names if n not in GROWS)}")
    if reuse and not Path(out).is_dir():
        raise RecordError(f"{out} is not a folder of saved records, and reusing them never trains: make them "
                          f"with python -m icl_lens reproduce {' '.join(names)} --out {out}")
    out = check_output_folder(out)
    device = pick(device)
    compile = (not quick) if compile is None else compile
    if workers is None:
        workers = 2 if (not quick and device.type == "cpu") else 1
    run = Run(out, quick=quick, device=device, seeds=seeds, compile=compile, reuse=reuse, workers=workers, log=log,
              grow=grow, scheduler=scheduler, deciding=deciding_seeds)
    try:
        if everything:
            run.tasks()   # the three tasks in one pool, before the first output asks for one of them
        for name in names:
            write, _ = OUTPUTS_TABLE[name]
            run.written[name] = write(run)
    except KeyboardInterrupt:
        raise Interrupted(saved_paths(run.written)) from None
    return run.written


def result_summary(written, out):
    """The one line a reproduce command ends with: how many files it wrote where, and the verdict
    counts of every claims file among them."""
    from collections import Counter

    files = saved_paths(written)
    parts = [f"{len(files)} files in {out}"]
    for path in files:
        if path.endswith("claims.json"):
            verdicts = Counter(claim["verdict"] for claim in json.loads(Path(path).read_text())["claims"])
            parts.append(f"{Path(path).name}: " + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items())))
    return "; ".join(parts)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`reproduce`, carrying the files written whole before it (``saved``)."""

    def __init__(self, saved):
        super().__init__(f"{len(saved)} files saved before the interrupt")
        self.saved = saved


def saved_paths(written):
    """The file paths of ``Run.written`` ({output: {"json": path, "png": path}}), in order."""
    found = []
    for paths in written.values():
        for path in (paths.values() if isinstance(paths, dict) else [paths]):
            if isinstance(path, (str, Path)) and str(path) not in found:
                found.append(str(path))
    return found


def saved_or_quick(out, *, quick):
    """Where the chapter's experiment files are: ``("full", folder)`` for the saved full run in
    ``book/data/experiments`` when not ``quick`` and every file is there, else ``("quick", out)``
    after a quick reproduction into ``out``."""
    saved = repository_root() / "book" / "data" / "experiments"
    if not quick and all((saved / f"{name}.json").exists() for name in OUTPUTS):
        return "full", saved
    quick_reproduction(["all"], out)
    return "quick", out


def section5_pages_run(*, quick):
    """What each Section 5 page of the book reads: ``(source, folder, records, claims)``, the
    saved full run (or a quick one, as :func:`saved_or_quick` decides), its three task records by
    task and its saved claims."""
    source, folder = saved_or_quick(results_dir("experiments-quick"), quick=quick)
    records = {kind: load_result(folder, f"task_{kind}") for kind in section5.EXPERIMENTS}
    return source, folder, records, load_result(folder, "claims")


def saved_study_or_quick(name, out, *, quick):
    """Like :func:`saved_or_quick` for a study of its own chapter: ``("full", record, folder)`` from
    ``book/data/<file>/<file>.json``, else ``("quick", record, out)`` after ``reproduce <name>
    --quick`` into ``out``."""
    file = STUDY_FILES[name]
    saved = repository_root() / "book" / "data" / file
    if not quick and (saved / f"{file}.json").exists():
        return "full", load_result(saved, file), saved
    quick_reproduction([name], out)
    return "quick", load_result(out, file), Path(out)


# a folder where quick runs are made once and copied from then on (the test suite sets it, so that
# a chapter run from the repository root and the book build's run of it train once between them)
QUICK_RUNS = "ICL_LENS_QUICK_RUNS"
WRITTEN = "written.json"   # beside a kept quick run's files: what reproduce returned, by file name


def quick_reproduction(names, out):
    """``reproduce(names, out=out, quick=True)``, returning what it wrote ({name: {kind: path}});
    where the environment variable ``ICL_LENS_QUICK_RUNS`` names a folder, the first call makes the
    quick run there (under the names, renamed into place when complete) and every later call, from
    any process, copies its files into ``out`` (callers that start together may each train; one
    run is kept). Files already in ``out`` that the run does not write stay. The variable is meant
    for one test session of one version of the code: nothing checks that a run kept there is
    current."""
    shared = os.environ.get(QUICK_RUNS)
    if not shared:
        return reproduce(names, out=out, quick=True, log=None)
    check_writable_folder(shared, QUICK_RUNS)
    made = Path(shared) / "+".join(names)
    if not made.exists():
        Path(shared).mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=shared))
        building.chmod(0o755)   # mkdtemp's 0700 would be copied onto ``out``
        written = reproduce(names, out=building, quick=True, log=None)
        write_json(building / WRITTEN, {name: {kind: path.name for kind, path in paths.items()}
                                        for name, paths in written.items()})
        try:
            os.rename(building, made)
        except OSError:   # made by another process meanwhile: keep theirs
            shutil.rmtree(building)
    shutil.copytree(made, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(WRITTEN))
    written = load_result(made, Path(WRITTEN).stem)
    return {name: {kind: Path(out) / file for kind, file in paths.items()} for name, paths in written.items()}


def saved_claims(name, folder, record):
    """The claims a study of its own chapter saved beside its record (``<file>_claims.json`` in
    ``folder``), checked against the same claims recomputed from ``record``: the page shows what
    was saved, and fails if the saved verdicts no longer follow from the record."""
    study = STUDIES[name]
    saved = load_result(folder, f"{study.file}_claims")["claims"]
    recomputed = json.loads(json.dumps(to_plain(study.judge(record))))
    if saved != recomputed:
        raise ValueError(f"{folder}/{study.file}_claims.json is not what the record gives: rerun "
                         f"python -m icl_lens reproduce {name} --reuse --out {folder}")
    return saved


def describe_source(source):
    """One Markdown sentence for the chapter: which run it shows."""
    if source == "full":
        return ("**This page shows the full run**, the output of `python -m icl_lens reproduce all` "
                "saved in `book/data/experiments`.")
    return ("**This page shows a quick run**: the saved full run was not found, or quick mode was asked for, "
            "so the page ran `reproduce all --quick` (4 short epochs; the curves show little beyond the early "
            "drop of the linear task, and the reading below is about the full run).")
