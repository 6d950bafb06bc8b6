"""Figures of the two studies of one attention layer trained on prompts: the across-tasks study
and Li et al.'s experiment, and the per-seed runs both chapters show.

Chapters: across_tasks, closeness_experiment.
"""

import math

import matplotlib.pyplot as plt
import torch

from icl_lens.figures.style import COLUMN, CURVES, LAYER_COLOURS, integer_ticks, median_band, styled
from icl_lens.studies import li_et_al
from icl_lens.training.prompt_layer import reported_value


BASELINE_STYLES = {"zero": ":", "context mean": "-.", "one GD step (lr*)": "--", "least squares": (0, (1, 3))}


def _steps_panel(axis, entry, key, *, scale, label, colour):
    """Median and interquartile band over seeds of one recorded measure against training steps."""
    runs = entry["runs"]
    steps = runs[0]["steps"]
    values = torch.tensor([[math.nan if x is None else x / scale for x in r[key]] for r in runs],
                          dtype=torch.float64)
    median_band(axis, steps, values, color=colour, label=label)


def setting_colours(settings):
    """{setting: colour}: "paper task (<layer>)" in its layer's colour (:data:`LAYER_COLOURS`, as in
    Li et al.'s figure), every other setting in the next colour no layer has."""
    spare = iter(c for c in CURVES if c not in LAYER_COLOURS.values())
    return {name: LAYER_COLOURS.get(name.removeprefix("paper task (").removesuffix(")")) or next(spare)
            for name in settings}


@styled
def across_tasks_figure(record, *, title):
    """Across tasks: (a) von Oswald's setting, test loss and Model Cos against steps; (b) the paper's
    task drawn per prompt, every layer's test loss; (c) loss against the number of demonstrations;
    (d) the paper's own optimiser. Losses are divided by the label variance; lines are baselines.
    A setting has one colour in every panel; one legend under the figure names them all."""
    figure, axes = plt.subplots(2, 2, figsize=(COLUMN, 7.8))
    settings = record["settings"]
    colours = setting_colours(settings)
    panels = (("(a) von Oswald et al.'s setting\n(d = 10, N = 10)", ["von Oswald (linear attention)"]),
              ("(b) the paper's linear task,\na new $w$ per prompt",
               [n for n in settings if n.startswith("paper task (") and "SGD" not in n]),
              (None, None),
              ("(d) SGD at lr 0.003, one prompt a step", ["paper task (paper's SGD)"]))
    for axis, (panel_title, names) in zip(axes.flat, panels):
        if names is None:
            continue
        for name in names:
            entry = settings[name]
            _steps_panel(axis, entry, "loss", scale=entry["label_variance"], label=name, colour=colours[name])
        entry = settings[names[0]]
        for baseline, style in BASELINE_STYLES.items():
            level = float(torch.tensor([r["baselines"][baseline] for r in entry["runs"]]).median())
            axis.axhline(level / entry["label_variance"], color="0.35", linestyle=style, linewidth=1, label=baseline)
        axis.set(title=panel_title, xlabel="training step", ylabel="test loss / label variance", ylim=(-0.03, 1.25))
        integer_ticks(axis, most=5)
    axis = axes[1, 0]
    curves = [r["demos_curve"] for n in panels[1][1] for r in settings[n]["runs"] if "demos_curve" in r]
    scale = settings["paper task (linear)"]["label_variance"]
    counts = sorted(int(n) for n in curves[0])
    for name in panels[1][1]:
        runs = [r for r in settings[name]["runs"] if "demos_curve" in r]
        if runs:
            values = torch.tensor([[r["demos_curve"][str(n)]["trained layer"] / scale for n in counts] for r in runs])
            median_band(axis, counts, values, color=colours[name], label=name)
    for baseline, style in BASELINE_STYLES.items():
        values = torch.tensor([[c[str(n)][baseline] / scale for n in counts] for c in curves])
        axis.plot(counts, values.median(0).values.tolist(), color="0.35", linestyle=style, linewidth=1, label=baseline)
    axis.axvline(settings["paper task (linear)"]["distribution"]["num_demos"], color="0.7", linewidth=0.8)
    axis.set(title="(c) against N (layers trained at N = 15)", xlabel="demonstrations N",
             ylabel="test loss / label variance", ylim=(-0.03, 1.6))
    integer_ticks(axis)
    _legend_below(figure, axes.flat, columns=3)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.1, 1, 1))   # the legend's rows under the panels
    return figure


def _legend_below(figure, axes, columns):
    """One legend under the figure with every distinct line of ``axes`` (each once; the trained
    layers first, then the grey baselines), at the book's legend size: the panels keep their
    curves clear."""
    entries = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    entries = dict(sorted(entries.items(), key=lambda entry: entry[1].get_color() == "0.35"))
    figure.legend(entries.values(), entries.keys(), loc="lower center", ncol=min(columns, len(entries)),
                  frameon=False)


CLOSENESS_MEASURES = (("loss", "test loss / label variance"), ("preds_diff", "Preds Diff"),
                      ("model_diff", "Model Diff"), ("model_cos", "Model Cos"))


@styled
def softmax_layer_figure(record, *, title):
    """Li et al.'s panels, rebuilt: for each document length, the trained layers' test loss and
    the three measures against GD* over training (median and quartiles over seeds), with the
    baselines as lines; below, the final test loss against d."""
    lengths = list(li_et_al.in_numeric_order(record["lengths"]))
    figure = plt.figure(figsize=(COLUMN, 2.6 * (2 * len(lengths) + 1)))
    grid = figure.add_gridspec(2 * len(lengths) + 1, 2)
    colours = LAYER_COLOURS
    for row, n in enumerate(lengths):
        for place, (key, label) in enumerate(CLOSENESS_MEASURES):
            axis = figure.add_subplot(grid[2 * row + place // 2, place % 2])
            for attention, runs in record["lengths"][n].items():
                scales = [r["label_variance"] if key == "loss" else 1.0 for r in runs]
                values = torch.tensor([[math.nan if x is None else x / s for x in r[key]]
                                       for r, s in zip(runs, scales)], dtype=torch.float64)
                if key == "model_cos":   # a cosine may be negative: no floor
                    low, mid, high = torch.quantile(values, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)
                    line, = axis.plot(runs[0]["steps"], mid, color=colours[attention], label=f"{attention} layer")
                    axis.fill_between(runs[0]["steps"], low, high, color=line.get_color(), alpha=0.15, linewidth=0)
                    axis.set_ylim(-0.05, 1.05)
                else:
                    median_band(axis, runs[0]["steps"], values, color=colours[attention], label=f"{attention} layer")
            if key == "loss":
                runs = next(iter(record["lengths"][n].values()))
                for name, style in (("one GD step (lr*)", "--"), ("linearised GD step", "-."), ("zero", ":")):
                    level = float(torch.tensor([r["baselines"][name] / r["label_variance"] for r in runs]).median())
                    axis.axhline(level, color="0.35", linestyle=style, linewidth=1, label=name)
                axis.set_ylim(0, 1.2)
            axis.set(title=f"$n$ = {n}: {label}", xlabel="training step")
            integer_ticks(axis)
    axis = figure.add_subplot(grid[2 * len(lengths), :])
    dims = list(li_et_al.in_numeric_order(record["dims"]))
    for attention in layer_names(record):
        values = torch.tensor([[reported_value(r, "loss") / r["label_variance"] for r in record["dims"][d][attention]]
                               for d in dims], dtype=torch.float64).T
        median_band(axis, [int(d) for d in dims], values, color=colours[attention], label=f"{attention} layer",
                     marker="o")
    gd = torch.tensor([[r["baselines"]["one GD step (lr*)"] / r["label_variance"]
                        for r in record["dims"][d]["softmax"]] for d in dims], dtype=torch.float64).T
    linear = torch.tensor([[r["baselines"]["linearised GD step"] / r["label_variance"]
                            for r in record["dims"][d]["softmax"]] for d in dims], dtype=torch.float64).T
    # the baselines in the loss panels' styles, so one legend names them in every panel
    median_band(axis, [int(d) for d in dims], linear, color="0.35", linestyle="-.", label="linearised GD step",
                 marker="^")
    median_band(axis, [int(d) for d in dims], gd, color="0.35", linestyle="--", label="one GD step (lr*)", marker="s")
    axis.set(title=f"final test loss against $d$ ($n$ = {record['study']['lengths'][0]})", xlabel="$d$",
             ylabel="test loss / label variance",
             ylim=(0, 1.2))
    axis.set_xticks([int(d) for d in dims], [d for d in dims])
    _legend_below(figure, figure.axes[:1], columns=3)
    figure.suptitle(title)
    bottom = 0.45 / figure.get_figheight()   # inches for the legend's two rows
    figure.tight_layout(rect=(0, bottom, 1, 0.98))   # room for the title and the legend
    return figure


def layer_names(record):
    """The layers a closeness record holds, in the order they were run."""
    return list(next(iter(record["dims"].values())))


@styled
def seed_runs_figure(runs, scales, baselines, *, title):
    """One setting, every seed (an explorer frame): test loss divided by ``scales[i]`` (left) and
    Model Cos against one GD step (right) over training; ``baselines`` maps a name to the key in
    each run's ``baselines`` drawn as a dotted level (median over seeds)."""
    figure, axes = plt.subplots(1, 2, figsize=(COLUMN, 3.6))
    for index, (run, scale) in enumerate(zip(runs, scales)):
        seed = run.get("config", {}).get("seed", index)   # closeness runs are stored in seed order
        line, = axes[0].plot(run["steps"], [math.nan if x is None else x / scale for x in run["loss"]],
                             linewidth=1, label=f"seed {seed}")
        axes[1].plot(run["steps"], [math.nan if x is None else x for x in run["model_cos"]], linewidth=1,
                     color=line.get_color())
    for (name, key), style in zip(baselines.items(), (":", "--", "-.", (0, (1, 3)))):
        level = float(torch.tensor([r["baselines"][key] / s for r, s in zip(runs, scales)]).median())
        axes[0].axhline(level, color="0.35", linestyle=style, linewidth=1, label=name)
    axes[0].set(xlabel="training step", ylabel="test loss / label variance", ylim=(0, 1.3), title="test loss")
    axes[1].set(xlabel="training step", ylabel="Model Cos", ylim=(-0.05, 1.05), title="Model Cos against GD*")
    for axis in axes:
        integer_ticks(axis, most=5)
        axis.grid(True, alpha=0.3)
    _legend_below(figure, axes[:1], columns=7)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.08, 1, 1))   # the legend under the panels
    return figure
