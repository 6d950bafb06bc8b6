"""Regenerate the paper's synthetic figures: ``python -m icl_lens reproduce fig3 [--quick] ...``.

Figures and what they need:

    fig3   linear task: equivalence (Fig. 3 left) and the regularized, augmented, negative models
    fig6, fig7, fig8   random-feature approximation of attention against d_r (one study, one figure)
    fig9   exact against estimated attention at d_r = 1200
    fig10  linear task, each seed on its own (the paper's other seeds)
    fig11  trigonometric task;  fig12  exponential task
    fig13  combinations of modifications on the three tasks

Each figure is written as ``<name>.png`` beside ``<name>.json`` (the numbers it plots); each task's
full training record goes to ``task_<kind>.json``. A task is trained once per call, however many
figures use it. No timings go into the JSON files, so one seed and device give the same bytes.
"""

import sys
import time
from dataclasses import replace

from icl_lens import approximation, experiments, plots
from icl_lens.device import generator, pick
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.results import load_result, repository_root, save_result

TASK_OF_FIGURE = {"fig3": ("linear",), "fig10": ("linear",), "fig11": ("trigonometric",), "fig12": ("exponential",),
                  "fig13": ("linear", "trigonometric", "exponential")}
APPROXIMATION_FIGURES = ("fig6", "fig7", "fig8")
FIGURES = ("fig3", "fig6", "fig7", "fig8", "fig9", "fig10", "fig11", "fig12", "fig13")
PANELS = ("regularized", "augmented", "negative")


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
    return {
        "task": result["task"],
        "config": result["config"],
        "epochs": result["epochs"],
        "models": [m for m in result["models"] if m["group"] in ("normal", *groups)],
        "equivalence": result["equivalence"],
    }


def reproduce(names, *, out, quick=False, device="cpu", seeds=None, compile=None, reuse=False, log=sys.stderr):
    """Write the named figures (or ``"all"``) under ``out``; return {name: paths written}.

    ``compile`` (default: in full mode only) trains through ``torch.compile``, see
    :func:`icl_lens.experiments.run_experiment`. ``reuse=True`` draws from the ``task_*.json`` records
    already in ``out`` instead of training again (to restyle figures).
    """
    compile = (not quick) if compile is None else compile
    names = list(FIGURES) if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {list(FIGURES)} or 'all'")
    device = pick(device)
    written, tasks = {}, {}
    for kind in dict.fromkeys(kind for n in names for kind in TASK_OF_FIGURE.get(n, ())):
        if reuse:
            tasks[kind] = load_result(out, f"task_{kind}")
            continue
        start = time.perf_counter()
        config = experiment_config(kind, quick=quick, seeds=seeds)
        tasks[kind] = experiments.run_experiment(config, device=device, progress=log is not None, compile=compile)
        written[f"task_{kind}"] = save_result(out, f"task_{kind}", tasks[kind])
        if log is not None:
            log.write(f"{kind}: {len(tasks[kind]['models'])} models, {config.epochs} epochs, {time.perf_counter() - start:.1f} s\n")
    for name in names:
        if name in ("fig3", "fig11", "fig12"):
            result = tasks[TASK_OF_FIGURE[name][0]]
            title = (f"{name}: {result['task']} task, {result['config']['epochs']} epochs, "
                     f"median and min-max over seeds {result['config']['seeds']}")
            figure = plots.experiment_figure(result, PANELS, title=title)
            written[name] = save_result(out, name, figure_numbers(result, PANELS), figure)
        elif name == "fig10":
            result = tasks["linear"]
            seeds_shown = result["config"]["seeds"][1:] or result["config"]["seeds"]
            figure = plots.seeds_figure(result, PANELS, seeds_shown,
                                        title=f"fig10: linear task, {result['config']['epochs']} epochs, seeds {seeds_shown} one by one")
            written[name] = save_result(out, name, figure_numbers(result, PANELS), figure)
        elif name == "fig13":
            epochs = tasks["linear"]["config"]["epochs"]
            figure = plots.combinations_figure(tasks, title=f"fig13: combinations, {epochs} epochs")
            numbers = {kind: figure_numbers(result, ("combination",)) for kind, result in tasks.items()}
            written[name] = save_result(out, name, numbers, figure)
        elif name in APPROXIMATION_FIGURES:
            if "approximation" not in written:
                configs = {"iid": approximation_config(quick), "orthogonal": approximation_config(quick, True)}
                study = {name: approximation.approximation_error(c, device=device) for name, c in configs.items()}
                repeats = configs["iid"].repeats
                figure = plots.approximation_error_figure(study, title=f"figs 6-8: random features, {repeats} repeats")
                written["approximation"] = save_result(out, "fig6-8", study, figure)
            written[name] = written["approximation"]
        elif name == "fig9":
            written[name] = save_result(out, name, *heatmaps(device))
    return written


def saved_or_quick(out, *, quick):
    """Where the chapter's experiment files are: ``("full", folder)`` for the saved full run in
    ``book/data/experiments`` when not ``quick`` and every file is there, else ``("quick", out)``
    after a quick reproduction into ``out``."""
    saved = repository_root() / "book" / "data" / "experiments"
    needed = ["fig3", "fig6-8", "fig9", "fig10", "fig11", "fig12", "fig13",
              "task_linear", "task_trigonometric", "task_exponential"]
    if not quick and all((saved / f"{name}.json").exists() for name in needed):
        return "full", saved
    reproduce(["all"], out=out, quick=True, log=None)
    return "quick", out


def describe_source(source):
    """One Markdown sentence for the chapter: which run it shows."""
    if source == "full":
        return ("**This page shows the full run**, the output of `python -m icl_lens reproduce all` "
                "saved in `book/data/experiments`.")
    return ("**This page shows a quick run**: the saved full run was not found, or quick mode was asked for, "
            "so the page ran `reproduce all --quick` (4 short epochs; the curves show little beyond the early "
            "drop of the linear task, and the reading below is about the full run).")


def heatmaps(device, num_features=1200, seed=0):
    """Fig. 9: one random layer of 16 tokens, d = 12, exact against d_r = 1200 random features."""
    g = generator(seed)
    layer = approximation.random_layer(16, 12, generator=g, device=device)
    compared = approximation.compare(layer, PositiveRandomFeatures(draw_omega(12, num_features, generator=g, device=device)))
    figure = plots.attention_heatmaps_figure(compared["attention"], compared["attention_estimate"],
                                             compared["output"], compared["output_estimate"], num_features)
    return compared, figure
