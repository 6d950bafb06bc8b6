"""Figures of the Section 5 study (R&L Figs. 3, 10-13, the paired comparisons and the
convergence study) from its saved records, and of the same study with a new task per prompt.

Chapters: experiments, modifications_across_tasks.
"""

import math

import matplotlib.pyplot as plt
import torch

from icl_lens import context_use
from icl_lens.figures.style import COLUMN, FLOOR, LEGEND_CURVES, integer_ticks, median_band, seed_line, styled
from icl_lens.figures.theory import sgd_error_panel
from icl_lens.studies import section5


BASELINES = {   # key in a record's baselines: (legend label, line style)
    "context_mean": ("context mean (uniform attention)", ":"),
    "nadaraya_watson": ("Nadaraya-Watson (softmax on raw inputs)", "-."),
    "least_squares": ("least squares on the prompt", (0, (5, 2, 1, 2))),
    "one_gd_step": ("one GD step at its best rate (new task per prompt)", (0, (3, 1, 1, 1, 1, 1))),
    "log_least_squares": ("least squares on log s", (0, (1, 1))),
}


def _by_task(results):
    """(task, value) pairs in the paper's task order, whichever order the keys came in (training
    inserts them in its own order, JSON read back sorts them): a redraw is the same picture."""
    order = list(section5.EXPERIMENTS)
    return sorted(results.items(), key=lambda item: (order.index(item[0]) if item[0] in order else len(order),
                                                     item[0]))


def _partner_curves(result, group, seed=None):
    """The normal model's curves at the learning rate of ``group`` (its lr-matched control)."""
    lr = next(m["lr"] for m in result["models"] if m["group"] == group)
    name = next(m["name"] for m in result["models"] if m["group"] == "normal" and m["lr"] == lr)
    return section5.curves(result, "normal", seed)[name]


def _test_panel(axis, result, named_curves, normal, *, legend=True, compact=None):
    """Normalised test loss (test MSE / label variance) at the checkpoints: median over seeds and
    interquartile band of each variant, the normal model dashed, the baselines as horizontal lines
    (median over seeds), the decay of the learning rate shaded; 1 is predicting the mean."""
    epochs = result["checkpoint_epochs"]
    medians = [median_band(axis, epochs, normal, color="black", linestyle="--", linewidth=1.4,
                            label="normal (same lr)")]
    # each variant its own dash and marker as well as colour: two that end together stay apart
    dashes = ("-", (0, (6, 2)), (0, (2, 1)), (0, (6, 2, 2, 2)))
    markers = ("o", "s", "^", "v", "D", "P")
    for index, (name, losses) in enumerate(named_curves.items()):
        medians.append(median_band(axis, epochs, losses, label=name, linestyle=dashes[index % len(dashes)],
                                   marker=markers[index % len(markers)], markersize=3,
                                   markevery=max(1, len(epochs) // 6)))
    axis.axhline(1.0, color="grey", linewidth=1.0, label="predict the mean")
    config = result["config"]
    if config.get("schedule") == "decay":
        axis.axvspan(config["epochs"] * (1 - config["decay_fraction"]), config["epochs"], color="grey", alpha=0.12,
                     linewidth=0, label="learning rate decays")
    finite = torch.cat([m[torch.isfinite(m)] for m in medians])
    # the axis reaches the lowest lower quartile too: the seeds that learn are part of the picture
    quartiles = [torch.quantile(c.nan_to_num(nan=math.inf), 0.25, dim=0) for c in [normal, *named_curves.values()]
                 if c.shape[0] > 2]
    lowest = torch.cat([finite, *[q[torch.isfinite(q)] for q in quartiles]])
    low = max(FLOOR, 0.5 * float(lowest.min())) if lowest.numel() else FLOOR
    bottom = low * 0.8
    found = section5.normalised_baselines(result)
    for key in [key for key in BASELINES if key in found]:   # a fixed legend order, not the record's key order
        label, style = BASELINES[key]
        values = found[key]
        value = float(values.median())
        # a baseline far below every curve (the exact log least squares) sits on the bottom edge
        axis.axhline(max(value, bottom), color="grey", linestyle=style, linewidth=1.0,
                     label=label + (f" ({value:.0e}: below the axis)" if value < bottom else ""))
    axis.set_ylim(bottom, max(2.0, 1.5 * float(finite.max())) if finite.numel() else 2.0)
    unit = (f"{config['steps_per_epoch']} steps of {config['batch']} prompts" if "batch" in config
            else f"{config['tokens_per_epoch']} tokens")
    axis.set(yscale="log", xlabel=f"epoch ({unit})", ylabel="test MSE / label variance")
    integer_ticks(axis, most=None if compact is None else compact)
    axis.grid(True, which="both", alpha=0.3)
    if legend:
        # below the panel: the curves it would hide are the point of the figure
        axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)


def _entries(axis, names, *, named=True):
    """(handles, labels) of the lines of ``axis`` whose label is in ``names`` (with ``named``
    False: whose label is not)."""
    return tuple(zip(*[(h, label) for h, label in zip(*axis.get_legend_handles_labels())
                       if (label in names) == named]))


def _shared_legend(figure, axis, names):
    """Under the figure, once: the lines every test panel has (the normal model, predicting the
    mean, the decay, the baselines), read off ``axis``, whose own variants are ``names``."""
    figure.legend(*_entries(axis, names, named=False), loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=2,
                  fontsize=8, frameon=False)


def _seed_legend(figure, axes, columns):
    """One legend under the figure, in at most ``columns`` columns, from the panel with the most
    lines: a seed has its colour in every panel, since the seeds are drawn in the same order."""
    fullest = max(axes, key=lambda axis: len(axis.get_lines()))
    handles, labels = fullest.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(columns, len(labels)), fontsize=8, frameon=False)


@styled
def experiment_figure(result, groups, *, title, seed=None, equivalence=True):
    """The equivalence curve (Fig. 3, left), then one test-loss panel per group (normal model dashed
    in each, baselines as horizontal lines), two a row; ``seed=None`` pools the seeds. Each panel's
    legend below it names its variants; the lines every panel shares are named once, at the
    bottom."""
    count = len(groups) + int(equivalence)
    rows = math.ceil(count / 2)
    most = max(len(section5.curves(result, group, seed)) for group in groups)
    legend_rows = math.ceil(most / 2)
    height = rows * (3.6 + 0.2 * legend_rows + 0.6) + 1.2
    figure, axes = plt.subplots(rows, 2, figsize=(COLUMN, height), squeeze=False,
                                gridspec_kw={"hspace": (0.2 * legend_rows + 0.9) / 3.6})
    axes = list(axes.ravel())
    for unused in axes[count:]:
        unused.set_visible(False)
    if equivalence:
        seeds = result["config"]["seeds"] if seed is None else [seed]   # the config's order, not the record's
        shown = {section5.seed_key(s): result["equivalence"][section5.seed_key(s)] for s in seeds}
        sgd_error_panel(axes.pop(0), {f"seed {s}": curve["squared_error"] for s, curve in shown.items()},
                        title="equivalence (Theorem 3.1)", ylabel="$\\|f(x) - h'\\|^2$", fontsize=8)
    for position, (axis, group) in enumerate(zip(axes, groups), start=int(equivalence)):
        named = section5.curves(result, group, seed)
        _test_panel(axis, result, named, _partner_curves(result, group, seed), legend=False, compact=5)
        axis.set_title(group)
        if position % 2:   # the right column shares the left one's label, which it would run into
            axis.set_ylabel("")
        axis.legend(*_entries(axis, named), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                    frameon=False)
    _shared_legend(figure, axes[0], section5.curves(result, groups[0], seed))
    figure.suptitle(title)
    figure.subplots_adjust(left=0.1, right=0.97, top=1 - 0.8 / height, bottom=1.2 / height + 0.05)
    return figure


@styled
def seeds_figure(result, groups, seeds, *, title):
    """Fig. 10: one row per seed, one test-loss panel per group. Under the figure, each column's
    variants (their colours are the same on every row), then the lines every panel shares."""
    names = {group: list(section5.curves(result, group, seeds[0])) for group in groups}
    shared_rows = 4                                   # normal, the mean, decay, baselines (2 columns)
    legend_height = 0.19 * (max(len(n) for n in names.values()) + shared_rows) + 0.5
    height = 2.4 * len(seeds) + 0.6 + legend_height
    figure, axes = plt.subplots(len(seeds), len(groups), figsize=(COLUMN, height), squeeze=False)
    for row, seed in zip(axes, seeds):
        for axis, group in zip(row, groups):
            _test_panel(axis, result, section5.curves(result, group, seed), _partner_curves(result, group, seed),
                        legend=False, compact=4)
            axis.set_title(f"{group}, seed {seed}")
            if seed != seeds[-1]:
                axis.set_xlabel("")
            if group != groups[0]:
                axis.set_ylabel("")
    figure.suptitle(title)
    figure.tight_layout(rect=(0, legend_height / height, 1, 1 - 0.25 / height))
    for axis, group in zip(axes[0], groups):
        box = axes[-1][list(groups).index(group)].get_position()
        figure.legend(*_entries(axis, names[group]), loc="upper center",
                      bbox_to_anchor=(box.x0 + box.width / 2, box.y0 - 0.45 / height), fontsize=8, frameon=False)
    _shared_legend(figure, axes[0][0], names[groups[0]])
    return figure


@styled
def combinations_figure(results, *, title="R&L Fig. 13: combinations of modifications"):
    """One test-loss panel per task: the combinations against the normal model and the baselines."""
    figure, axes = plt.subplots(len(results), 1, figsize=(COLUMN, 4.6 * len(results)), squeeze=False)
    for axis, (task, result) in zip(axes[:, 0], _by_task(results)):
        _test_panel(axis, result, section5.curves(result, "combination"), _partner_curves(result, "combination"),
                    compact=8)
        axis.set_title(task)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (4.6 * len(results))))   # room for the title
    return figure


@styled
def variants_figure(result, group, names, *, title):
    """Test curves of the chosen variants of one group against the normal model (an explorer frame)."""
    figure, axis = plt.subplots(figsize=(6.4, 5.0))
    chosen = {name: losses for name, losses in section5.curves(result, group).items() if name in names}
    _test_panel(axis, result, chosen, _partner_curves(result, group))
    axis.set_title(title)
    figure.tight_layout()
    return figure


OFF_SCALE = 3.0   # log ratios beyond this (20 times worse, or diverged) are drawn at the edge with an arrow


@styled
def paired_figure(results, *, title):
    """Per task, every variant's paired differences to the normal model (the log ratio of the two
    normalised test losses at the end, log(variant / normal)): one dot per voting seed, the median,
    and the 95% sign-test interval where the seeds allow one (from 6); each row's no-effect band
    (+-log 1.1) is shaded. Green: every seed better by more than the band; red: every seed worse.
    ``results`` maps a task to rows of :func:`icl_lens.studies.section5_measures.variant_rows`."""
    heights = [max(2.5, 0.24 * len(rows) + 1.0) for _, rows in _by_task(results)]
    figure, axes = plt.subplots(len(results), 1, figsize=(COLUMN, sum(heights)), squeeze=False,
                                gridspec_kw={"height_ratios": heights})
    for axis, (task, rows) in zip(axes[:, 0], _by_task(results)):
        for position, row in enumerate(rows):
            median, (low, high), band = row["median_difference"], row["interval"], row["no_effect"] or 0.0
            axis.fill_betweenx([position - 0.4, position + 0.4], -band, band, color="grey", alpha=0.25, linewidth=0)
            if median is None:
                axis.text(OFF_SCALE, position, "diverged", fontsize=8, va="center", ha="right", color="red")
                continue
            color = ("tab:green" if row["better"] == row["seeds"] else
                     "tab:red" if row["worse"] == row["seeds"] else "tab:grey")
            seeds = [min(d, OFF_SCALE) for d in row["difference"] if d is not None]
            axis.plot(seeds, [position] * len(seeds), "|", color=color, alpha=0.6, markersize=7)
            if low is not None and high is not None:
                axis.plot([max(low, -OFF_SCALE * 4), min(high, OFF_SCALE)], [position, position], color=color,
                          linewidth=1.2)
            axis.plot(min(median, OFF_SCALE), position, "o", color=color, markersize=4)
            if max(seeds, default=0) >= OFF_SCALE:
                axis.annotate("", (OFF_SCALE * 1.2, position), (OFF_SCALE, position),
                              arrowprops={"arrowstyle": "->", "color": color})
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=8)
        axis.invert_yaxis()
        # a log ratio is already on a log scale: a linear axis, diverging runs drawn at its right edge
        lows = [d for r in rows for d in r["difference"] if d is not None]
        axis.set_xlim(min([-1.0, *(1.1 * x for x in lows)]), OFF_SCALE * 1.25)
        axis.set(xlabel="log(variant / normal) of the test MSE at the end", title=task)
        axis.grid(True, axis="x", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.35 / sum(heights)))   # room for the title
    return figure


@styled
def convergence_figure(studies):
    """Per task, each seed's normal model: normalised test loss against the epochs of a long run
    (line; its last fifth decays) and at the end of each shorter run copied off it (dots, where the
    step size has decayed to 0), the saved run's epoch count marked."""
    figure, axes = plt.subplots(len(studies), 1, figsize=(COLUMN, 3.0 * len(studies)), squeeze=False)
    kinds = [kind for kind in section5.EXPERIMENTS if kind in studies]   # JSON sorts its keys
    # one legend serves every panel: past LEGEND_CURVES seeds in any, all fold to one colour and
    # each title gives its own count
    most = max(len(studies[kind]["record"]["config"]["seeds"]) for kind in kinds)
    folded = most > LEGEND_CURVES
    for axis, (kind, study) in zip(axes[:, 0], ((k, studies[k]) for k in kinds)):
        record = study["record"]
        curves = section5.curves(record, "normal")["normal"]
        normal = [m for m in record["models"] if m["group"] == "normal"]
        seeds = record["config"]["seeds"]
        for index, (seed, losses, model) in enumerate(zip(seeds, curves, normal)):
            style = {"alpha": 0.7, **seed_line(index, most, f"seed {seed}", folded_label="one seed")}
            line, = axis.plot(record["checkpoint_epochs"], losses.clamp(min=FLOOR), linewidth=1.0, **style)
            ends = [section5.normalised_loss(record, model, length / len(record["epochs"]))
                    for length in record["run_lengths"]]
            axis.plot(record["run_lengths"], [max(x, FLOOR) for x in ends], "o", color=line.get_color(),
                      markersize=5)
        axis.axvline(study["saved_run_epochs"], color="black", linestyle=":", label="saved run ends")
        axis.axhline(1.0, color="grey", linewidth=1.0)
        axis.set(yscale="log", xlabel="epoch (16384 tokens)", ylabel="test MSE / label variance",
                 title=f"{kind}: normal model, long run" + (f" ({len(seeds)} seeds)" if folded else ""))
        integer_ticks(axis)
        axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout(rect=(0, 0.7 / (3.0 * len(studies)), 1, 1))
    _seed_legend(figure, axes[:, 0], columns=5)
    return figure


CONTEXT_LOSSES = (("intact", "prompt\nas drawn"), ("other_task_labels", "another task's\nlabels"),
                  ("shuffled_labels", "labels\nshuffled"), ("query_alone", "query\nalone"))


@styled
def context_use_figure(record):
    """Does the trained layer read its context? For each task's normal model (one line a seed) and
    for the layers trained with a new task per prompt: the normalised test loss with the prompt as
    drawn, with the demonstrations' labels from another task, shuffled, and with the query alone."""
    panels = [(f"{kind}: one task per seed, normal model", {seed: measures for seed, measures in
                                                             record["tasks"][kind]["normal"].items()})
              for kind in section5.EXPERIMENTS if kind in record["tasks"]]
    panels += [(f"across tasks: {setting}", record["across_tasks"][setting]) for setting in sorted(record["across_tasks"])]
    columns = 3
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(COLUMN, 2.9 * rows), squeeze=False, sharey=True)
    positions = range(len(CONTEXT_LOSSES))
    # one legend serves every panel: past LEGEND_CURVES seeds in any panel, all panels draw their
    # seeds in one pale colour under their median, and each title gives its count
    most = max(len(seeds) for _, seeds in panels)
    folded = most > LEGEND_CURVES
    for axis, (title, seeds) in zip(axes.flat, panels):
        for index, seed in enumerate(sorted(seeds, key=int)):   # by number, whatever the record's key order
            measures = seeds[seed]
            values = [measures[key] if measures[key] is not None else math.nan for key, _ in CONTEXT_LOSSES]
            style = {"alpha": 0.8, **seed_line(index, most, f"seed {seed}", folded_label="one seed")}
            axis.plot(positions, [max(v, FLOOR) for v in values], "o-", linewidth=1.0, markersize=4, **style)
        if folded:
            found = context_use.medians(seeds)
            median = [math.nan if found[key] is None else max(found[key], FLOOR) for key, _ in CONTEXT_LOSSES]
            axis.plot(positions, median, "o-", color="black", linewidth=1.6, markersize=4, label="median")
            title = f"{title}\n({len(seeds)} seeds)"   # a line of its own: the panels are narrow
        axis.axhline(1.0, color="grey", linewidth=1.0, linestyle="--")
        axis.set_xticks(list(positions), [label for _, label in CONTEXT_LOSSES], fontsize=7)
        axis.set(yscale="log", title=title.replace(": ", ":\n", 1))
        axis.grid(True, which="both", alpha=0.3)
    for axis in axes.flat[len(panels):]:
        axis.set_visible(False)
    for axis in axes[:, 0]:
        axis.set_ylabel("test MSE / label variance")
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    _seed_legend(figure, list(axes.flat[:len(panels)]), columns=8)
    return figure


@styled
def pilot_figure(records, *, title):
    """The pilots of the new-task protocol, one panel a task: the normal model (and, on the linear
    task, g2) per seed against the training-free baselines of a new task per prompt."""
    shown = _by_task(records)
    figure, axes = plt.subplots(1, len(shown), figsize=(COLUMN, 4.4), squeeze=False)
    for axis, (kind, record) in zip(axes[0], shown):
        named = {name: curve for group in ("augmented",) for name, curve in section5.curves(record, group).items()}
        _test_panel(axis, record, named, section5.curves(record, "normal")["normal"], legend=False, compact=4)
        axis.set_title(kind)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    figure.suptitle(title)
    figure.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.36, wspace=0.35)
    return figure
