"""Regenerate the paper's synthetic figures: ``python -m icl_lens reproduce fig3 [--quick] ...``.

Figures and what they need:

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

Not part of ``all`` (minutes more on 2 CPU cores):

    convergence  the normal models of each task trained twice the saved run's epochs, with the
                 runs of 1/4, 1/2 and 3/4 of that length copied off, and the convergence
                 criterion at each doubling

Studies of their own chapters (not part of ``all``):

    multitask    one attention layer trained across tasks (a new w per prompt) against zero,
                 averaging, one GD step at the best learning rate and least squares
    softmax-regression   Li et al.'s experiment rebuilt: a trained softmax self-attention layer
                 against softmax regression after one GD step (closeness.json)
    table1       R&L Table 1 offline: the BERT modifications fine-tuned on the packaged
                 all-MiniLM-L6-v2 and a WordNet entailment task standing in for RTE (needs the
                 [bert] extra; quick mode: a tiny random BERT)

Each figure is written as ``<name>.png`` beside ``<name>.json`` (the numbers it plots); each task's
full training record goes to ``task_<kind>.json``. A task is trained once per call, however many
figures use it. No timings go into the JSON files, so one seed and setting give the same bytes.
"""

import sys
import time
from dataclasses import replace

from pathlib import Path

from icl_lens import approximation, claims, closeness, experiments, ffn_rank, multitask, plots, table1
from icl_lens.device import generator, pick
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.results import load_result, repository_root, save_result

ALL_TASKS = ("linear", "trigonometric", "exponential")
TASK_OF_FIGURE = {"fig3": ("linear",), "fig10": ("linear",), "fig11": ("trigonometric",), "fig12": ("exponential",),
                  "fig13": ALL_TASKS, "paired": ALL_TASKS, "claims": ALL_TASKS,
                  "fig6": ("linear",), "fig7": ("linear",), "fig8": ("linear",), "fig9": ("linear",)}
APPROXIMATION_FIGURES = ("fig6", "fig7", "fig8")
FIGURES = ("fig3", "fig6", "fig7", "fig8", "fig9", "fig10", "fig11", "fig12", "fig13", "fig14", "paired", "claims")
PANELS = ("regularized", "augmented", "negative")
EXTRA = ("convergence",)   # named on the command line only, never by "all"
STUDIES = ("multitask", "softmax-regression", "table1")   # chapters of their own, never by "all"
STUDY_FILES = {"multitask": "multitask", "softmax-regression": "closeness", "table1": "table1"}   # JSON / PNG
STUDY_MODULES = {"multitask": multitask, "softmax-regression": closeness, "table1": table1}
# what ``reproduce all`` writes (JSON names), which the experiments chapter reads
OUTPUTS = ("fig3", "fig6-8", "fig9", "fig10", "fig11", "fig12", "fig13", "fig14", "paired", "claims",
           *(f"task_{kind}" for kind in ALL_TASKS))


def experiment_config(kind, *, quick=False, seeds=None):
    config = experiments.EXPERIMENTS[kind]()
    if seeds is not None:
        config = replace(config, seeds=tuple(seeds))
    return config.quick() if quick else config


def approximation_config(quick=False, orthogonal=False):
    if quick:
        return approximation.ApproximationConfig(feature_counts=(10, 100, 1200), repeats=5, orthogonal=orthogonal)
    return approximation.ApproximationConfig(orthogonal=orthogonal)


def figure_numbers(result, groups):
    """The part of a task record that a figure plots."""
    keep = ("task", "config", "epochs", "checkpoint_epochs", "run_lengths", "baselines", "equivalence", "convergence")
    numbers = {key: result[key] for key in keep}
    numbers["models"] = [m for m in result["models"] if m["group"] in ("normal", *groups)]
    return numbers


def check_output_folder(out):
    """Create ``out`` or fail with a clear error naming --out (not a traceback from deep inside)."""
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise ValueError(f"--out {str(out)!r} is not a writable folder: {error.strerror}") from None
    return folder


def reproduce(names, *, out, quick=False, device="cpu", seeds=None, compile=None, reuse=False, workers=None,
              log=sys.stderr):
    """Write the named figures (or ``"all"``) under ``out``; return {name: paths written}.

    ``compile`` trains through ``torch.compile`` (default: in full mode); ``workers`` (default: 2 in
    full mode on the CPU, else 1) trains the seeds in that many processes, one thread each, see
    :func:`icl_lens.experiments.run_experiment`.
    ``reuse=True`` draws from the ``task_*.json`` records already in ``out`` instead of training
    again (to restyle figures or recompute verdicts).
    """
    extra = (*EXTRA, *STUDIES)
    names = list(FIGURES) + [n for n in names if n in extra] if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in names if n not in FIGURES and n not in extra]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {list(FIGURES)} or 'all'")
    out = check_output_folder(out)
    device = pick(device)
    compile = (not quick) if compile is None else compile
    if workers is None:
        workers = 2 if (not quick and device.type == "cpu") else 1
    written, tasks = {}, {}
    for kind in dict.fromkeys(kind for n in names for kind in TASK_OF_FIGURE.get(n, ())):
        if reuse:
            tasks[kind] = load_result(out, f"task_{kind}")
            continue
        start = time.perf_counter()
        config = experiment_config(kind, quick=quick, seeds=seeds)
        tasks[kind] = experiments.run_experiment(config, device=device, progress=log is not None, compile=compile,
                                                 workers=workers)
        written[f"task_{kind}"] = save_result(out, f"task_{kind}", tasks[kind])
        if log is not None:
            log.write(f"{kind}: {len(tasks[kind]['models'])} models, {config.epochs} epochs, "
                      f"{time.perf_counter() - start:.1f} s\n")
    study = rank = None
    if "claims" in names or "fig14" in names:
        if reuse and (Path(out) / "fig14.json").exists():   # redraw only
            rank = load_result(out, "fig14")
        else:
            config = ffn_rank.TrainedRankConfig()
            rank = ffn_rank.trained_rank_bound(config.quick() if quick else config, progress=log is not None)
        figure = plots.rank_bound_figure(rank, paper_saturation=rank["paper_saturation"])
        written["fig14"] = save_result(out, "fig14", rank, figure)
    for name in names:
        if name in ("fig3", "fig11", "fig12"):
            result = tasks[TASK_OF_FIGURE[name][0]]
            title = (f"Fig. {name[3:]}: {result['task']} task, {result['config']['epochs']} epochs, "
                     f"median and quartiles over {len(result['config']['seeds'])} seeds")
            figure = plots.experiment_figure(result, PANELS, title=title)
            written[name] = save_result(out, name, figure_numbers(result, PANELS), figure)
        elif name == "fig10":
            result = tasks["linear"]
            seeds_shown = result["config"]["seeds"]
            figure = plots.seeds_figure(result, PANELS, seeds_shown,
                                        title=f"Fig. 10: linear task, {result['config']['epochs']} epochs, one seed a row")
            written[name] = save_result(out, name, figure_numbers(result, PANELS), figure)
        elif name == "fig13":
            epochs = {kind: r["config"]["epochs"] for kind, r in tasks.items()}
            epochs = ", ".join(f"{kind} {count}" for kind, count in epochs.items())
            figure = plots.combinations_figure(tasks, title=f"Fig. 13: combinations (epochs: {epochs})")
            numbers = {kind: figure_numbers(result, ("combination",)) for kind, result in tasks.items()}
            written[name] = save_result(out, name, numbers, figure)
        elif name == "paired":
            rows = {kind: claims.variant_rows(result) for kind, result in tasks.items()}
            figure = plots.paired_figure(rows, title="every variant against the normal model of its seed and learning rate")
            written[name] = save_result(out, name, rows, figure)
        elif name in APPROXIMATION_FIGURES or name == "claims":
            if study is None:
                if reuse and (Path(out) / "fig6-8.json").exists():   # redraw only
                    study = load_result(out, "fig6-8")
                else:
                    study = approximation_study(tasks["linear"], quick=quick, device=device)
                figure = plots.approximation_error_figure(
                    study, title=f"Figs. 6-8: random features, median and quartiles of {approximation_config(quick).repeats} repeats")
                written["approximation"] = save_result(out, "fig6-8", study, figure)
            if name == "claims":
                verdicts = [claims.equivalence_claim(tasks), *claims.evaluate(tasks),
                            claims.random_feature_claim(study["trained layers (linear task)"]),
                            claims.rank_claim(rank)]
                written[name] = save_result(out, "claims", {"rules": claims.RULES, "claims": verdicts})
            else:
                written[name] = written["approximation"]
        elif name == "fig14":
            written.setdefault(name, {"json": Path(out) / "fig14.json"})
        elif name == "fig9":
            written[name] = save_result(out, name, *heatmaps(tasks["linear"], device))
        elif name == "convergence" and reuse and (Path(out) / "convergence.json").exists():   # redraw only
            studies = load_result(out, "convergence")
            written[name] = save_result(out, name, studies, plots.convergence_figure(studies))
        elif name == "convergence":
            studies = {kind: experiments.convergence_study(
                kind, quick=quick, device=device, workers=workers,
                compile=compile, progress=log is not None) for kind in experiments.EXPERIMENTS}
            figure = plots.convergence_figure(studies)
            written[name] = save_result(out, name, studies, figure)
        elif name in STUDIES:
            written[name] = chapter_study(name, out, quick=quick, device=device, reuse=reuse, log=log, workers=workers,
                                          seeds=seeds)
    return written


def chapter_study(name, out, *, quick, device, reuse, log, workers=1, seeds=None):
    """A study of its own chapter: ``multitask.json`` or ``closeness.json`` and its figure
    (``reuse``: redraw from the JSON already in ``out``)."""
    module, file = STUDY_MODULES[name], STUDY_FILES[name]
    if reuse and (Path(out) / f"{file}.json").exists():   # redraw only
        record = load_result(out, file)
    else:
        start = time.perf_counter()
        config = module.StudyConfig()
        config = config.quick() if quick else config
        if seeds is not None:
            config = replace(config, seeds=tuple(seeds))
        record = module.run_study(config, device=device, progress=log is not None, workers=workers)
        if log is not None:
            log.write(f"{name}: {time.perf_counter() - start:.1f} s\n")
    seeds = tuple(record["study"]["seeds"])
    if name == "multitask":
        figure = plots.multitask_figure(record, title=f"one attention layer across tasks: median and "
                                                      f"quartiles over seeds {seeds}")
    elif name == "table1":
        model = "a tiny random BERT" if record["study"]["model"] == table1.TINY_BERT else "all-MiniLM-L6-v2"
        figure = plots.table1_figure(record, title=f"Table 1 offline: {model} on WordNet entailment, seeds {seeds}")
    else:
        figure = plots.softmax_layer_figure(record, title=f"a trained softmax layer against one GD step (Li et al., "
                                                      f"rebuilt): median and quartiles over seeds {seeds}")
    return save_result(out, file, record, figure)


def approximation_study(linear, *, quick, device):
    """Figs. 6-8: random layers (iid and orthogonal features) and the trained layers of the linear
    task's normal models (iid features), MSE / MAE against d_r."""
    configs = {"iid (random layers)": approximation_config(quick),
               "orthogonal (random layers)": approximation_config(quick, True)}
    study = {name: approximation.approximation_error(c, device=device) for name, c in configs.items()}
    study["trained layers (linear task)"] = approximation.approximation_error(
        approximation_config(quick), device=device, layers=experiments.trained_layers(linear))
    return study


def saved_or_quick(out, *, quick):
    """Where the chapter's experiment files are: ``("full", folder)`` for the saved full run in
    ``book/data/experiments`` when not ``quick`` and every file is there, else ``("quick", out)``
    after a quick reproduction into ``out``."""
    saved = repository_root() / "book" / "data" / "experiments"
    if not quick and all((saved / f"{name}.json").exists() for name in OUTPUTS):
        return "full", saved
    reproduce(["all"], out=out, quick=True, log=None)
    return "quick", out


def saved_study_or_quick(name, out, *, quick):
    """Like :func:`saved_or_quick` for a study of its own chapter: ``("full", record, folder)`` from
    ``book/data/<file>/<file>.json``, else ``("quick", record, out)`` after ``reproduce <name>
    --quick`` into ``out``."""
    file = STUDY_FILES[name]
    saved = repository_root() / "book" / "data" / file
    if not quick and (saved / f"{file}.json").exists():
        return "full", load_result(saved, file), saved
    reproduce([name], out=out, quick=True, log=None)
    return "quick", load_result(out, file), Path(out)


def describe_source(source):
    """One Markdown sentence for the chapter: which run it shows."""
    if source == "full":
        return ("**This page shows the full run**, the output of `python -m icl_lens reproduce all` "
                "saved in `book/data/experiments`.")
    return ("**This page shows a quick run**: the saved full run was not found, or quick mode was asked for, "
            "so the page ran `reproduce all --quick` (4 short epochs; the curves show little beyond the early "
            "drop of the linear task, and the reading below is about the full run).")


def heatmaps(linear, device, num_features=1200, seed=0):
    """Fig. 9: the trained normal layer of the linear task's first seed on 16 test tokens, exact
    against d_r = 1200 random features."""
    layer = experiments.trained_layers(linear)[0]
    layer = approximation.AttentionLayer(*(x.to(device) for x in (layer.tokens, layer.W_Q, layer.W_K, layer.W_V)))
    omega = draw_omega(layer.W_K.shape[0], num_features, generator=generator(seed), device=device)
    compared = approximation.compare(layer, PositiveRandomFeatures(omega))
    figure = plots.attention_heatmaps_figure(compared["attention"], compared["attention_estimate"],
                                             compared["output"], compared["output_estimate"], num_features)
    return compared, figure
