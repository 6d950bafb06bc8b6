"""Li et al.'s experiment (NeurIPS 2024 version of arXiv 2304.13276): a trained softmax
self-attention layer against softmax regression after one gradient step.

Chapters: closeness_experiment.

The paper reports losses over training, "Preds Diff", "Model Diff", "Model Cos" and loss against d
for documents of n = 25 and n = 200 tokens with d = 20; its protocol is not public. This module
rebuilds it after von Oswald et al. (2023), whose three measures the paper names. Choices made here
(each stated in the chapter):

* A task is a weight x* ~ N(0, s^2 I_d / d), s = ``logit_scale`` = 1/2, so that the logits a . x*
  have standard deviation about s. A prompt is a document A (n, d) with rows a_i ~ N(0, I_d),
  its target b = f(x*) = softmax(A x*) (Sec. 4.1), and one more row a_q, the query. Labels are
  y_i = n b_i - 1, which average to 0 for every n, and the query's label is what f would give a_q
  relative to the document, y_q = n exp(a_q . x*) / alpha(x*) - 1. (Were the query a row of the
  document, the normalisation would give its label away: y_q = -sum of the others. Uncentred labels
  n b_i leave a bias-free attention layer unable to add the constant 1 to a gradient-step term.)
* The comparator trains softmax regression on the document, L(x) = 1/2 sum_i (n f_i(x) - 1 - y_i)^2,
  by one GD step from x = 0 and predicts n exp(a_q . x_1) / alpha(x_1) - 1. At x = 0 every
  f_i = 1/n, so the step has the closed form x_1 = lr sum_i y_i (a_i - a_bar), a_bar the mean row.
* The layer is one softmax self-attention layer
  (:class:`icl_lens.training.prompt_layer.PromptAttentionLayer`) on the
  tokens [a_i ; y_i] and [a_n ; 0]; its prediction is the label coordinate of the query's output.
"""

import math
from dataclasses import asdict, dataclass, replace
from typing import TypedDict

import torch

from icl_lens import softmax_regression as sr
from icl_lens import statistics, verdicts
from icl_lens.device import pick
from icl_lens.training.loop import run_jobs
from icl_lens.training.prompt_layer import (PromptLayerConfig, converged, prompt_tokens, test_and_tuning_prompts,
                                            reported_value, train_layer)
from icl_lens.training.prompt_layer import summary as prompt_layer_summary
from icl_lens.validation import check_positive_float, check_positive_int, check_seeds

MATCH = 0.05          # |trained / GD* - 1| within this: the layer matches one GD step at lr*
ALIGNED = 0.95        # Model Cos at least this: the layer's sensitivities point where GD*'s do
COSINE_BAND = 0.01    # a change of Model Cos smaller than this is no change

LEARNING_RATES = tuple(10 ** (k / 8) for k in range(-24, 25))   # 1e-3 ... 1e3, for GD*'s grid


@dataclass(frozen=True)
class SoftmaxRegressionTask:
    """Documents of ``n`` tokens in dimension ``d``; see the module text for the distribution."""

    n: int = 25
    d: int = 20
    logit_scale: float = 0.5

    def __post_init__(self):
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 2:
            raise ValueError(f"n must be an integer >= 2 (context rows and the query), got {self.n!r}")
        check_positive_int(self.d, "d")
        check_positive_float(self.logit_scale, "logit_scale")

    @property
    def token_dim(self):
        return self.d + 1

    def sample(self, num_prompts, *, generator=None, num_demos=None, dtype=torch.float32, device="cpu"):
        """``(x_context (P, n, d), y_context (P, n), x_query (P, d), y_query (P,))``: the document's
        rows, labels y = n softmax(A x*) - 1, the query row and its label. ``num_demos`` must be
        None (n is fixed by the task)."""
        if num_demos is not None:
            raise ValueError("num_demos is fixed by the task's n for softmax regression; leave it None")
        check_positive_int(num_prompts, "num_prompts")
        source = generator.device if generator is not None else torch.device("cpu")
        rows = torch.randn(num_prompts, self.n + 1, self.d, generator=generator, dtype=dtype, device=source)
        weight = torch.randn(num_prompts, self.d, generator=generator, dtype=dtype, device=source)
        labels = self.relative_weight(rows, self.logit_scale * weight / math.sqrt(self.d)) - 1
        rows, labels = rows.to(pick(device)), labels.to(pick(device))
        return rows[:, :-1], labels[:, :-1], rows[:, -1], labels[:, -1]

    def relative_weight(self, rows, x):
        """n exp(a . x) / alpha(x) for every row of ``rows`` (P, n + 1, d), alpha(x) = <exp(A x), 1_n>
        over the first n rows (the document): n f(x) on the document, extended to the query row."""
        logits = sr.logits(rows, x)
        return self.n * torch.exp(logits - torch.logsumexp(logits[..., :-1], dim=-1, keepdim=True))

    def gd_step(self, x_context, y_context, x_query, lr):
        """x_1 = lr sum_{i < n} y_i (a_i - a_bar): one GD step from x = 0, (P, d)."""
        centred = x_context - x_context.mean(-2, keepdim=True)
        return lr * (y_context.unsqueeze(-1) * centred).sum(-2)

    def one_step(self, x_context, y_context, x_query, lr):
        """The comparator's prediction n exp(a_q . x_1) / alpha(x_1) - 1 for the query row."""
        rows = torch.cat([x_context, x_query.unsqueeze(-2)], dim=-2)
        return self.relative_weight(rows, self.gd_step(x_context, y_context, x_query, lr))[..., -1] - 1

    def best_lr(self, prompts):
        """GD*'s learning rate: the best of :data:`LEARNING_RATES` on ``prompts`` (the prediction is
        not linear in lr here, so a grid replaces the closed form of the linear task)."""
        x_context, y_context, x_query, y_query = prompts
        errors = [float(((self.one_step(x_context, y_context, x_query, lr) - y_query) ** 2).mean())
                  for lr in LEARNING_RATES]
        return LEARNING_RATES[min(range(len(errors)), key=errors.__getitem__)]


    def linearised_direction(self, x_context, y_context, x_query):
        """g = sum_i y_i (a_i - a_bar) . (a_q - a_bar): the comparator's prediction to first order
        in lr is lr g (n exp(u_q) / alpha - 1 = u_q - mean u + O(u^2) for the logits u = A x_1)."""
        centred = x_context - x_context.mean(-2, keepdim=True)
        query = x_query - x_context.mean(-2)
        return (y_context * (centred @ query.unsqueeze(-1)).squeeze(-1)).sum(-1)


def baseline_losses(task, test, tuning, *, lr_star=None):
    """Mean squared errors on ``test`` of predicting 0 (the mean label), of GD* (the comparator at
    its best grid learning rate, tuned on ``tuning``) and of linearised GD* (lr g with the
    least-squares lr, in closed form as for the linear task: what a linear attention layer can
    represent); ``lr_star``, when given, is GD*'s rate already tuned on ``tuning``.
    Returns ({name: loss}, {name: learning rate})."""
    lr_star = task.best_lr(tuning) if lr_star is None else lr_star
    g = task.linearised_direction(*tuning[:3])
    lr_linear = float((g * tuning[3]).sum() / (g * g).sum())
    x_context, y_context, x_query, y_query = test
    predictions = {"zero": torch.zeros_like(y_query),
                   "one GD step (lr*)": task.one_step(x_context, y_context, x_query, lr_star),
                   "linearised GD step": lr_linear * task.linearised_direction(x_context, y_context, x_query)}
    losses = {name: float(((p - y_query) ** 2).mean()) for name, p in predictions.items()}
    return losses, {"one GD step (lr*)": lr_star, "linearised GD step": lr_linear}


def document_update(layer, prompts):
    """What the trained layer does to the document: every token attends to all tokens, and the
    input coordinates of the document rows' outputs give A_next = A + Delta A. Returns
    (A, A_next), each (P, n, d)."""
    tokens = prompt_tokens(*prompts[:3])
    with torch.no_grad():
        update = layer.attend(tokens, tokens).sum(0)
    document = tokens[..., :-1, :-1]
    return document, document + update[..., :-1, :-1]


def theorem_on_steps(task, layer, prompts, lr):
    """The main theorem measured on real updates of the test prompts, in float64.

    x side: the comparator's GD step x_0 = 0 -> x_1; the shift of b, ||f(A, x_0) - f(A, x_1)||,
    against the tight constant 1/2 ||A (x_1 - x_0)|| and against M ||x_1 - x_0||, M = n^1.5 exp(10 R^2)
    with R = max(4, ||A||, ||A_next||, ||x_1||). A side: the trained layer's update A -> A_next at
    x = x_1 (the weights after the step), ||f(A, x_1) - f(A_next, x_1)|| against
    1/2 ||(A_next - A) x_1|| and M ||A_next - A||. Also the share of prompts inside the theorem's
    smallness condition (0.01). log10 M is reported, since M itself overflows float64 for n = 200."""
    x_context, y_context, x_query, _ = (p.double() for p in prompts)
    document, moved = (p.double() for p in document_update(layer, prompts))
    x_1 = task.gd_step(x_context, y_context, x_query, lr)
    x_0 = torch.zeros_like(x_1)
    radius = torch.maximum(torch.maximum(sr.spectral_norm(document), sr.spectral_norm(moved)), x_1.norm(dim=-1))
    radius = radius.clamp_min(4.0)
    log_M = 1.5 * math.log(task.n) + 10 * radius ** 2    # natural log of M, per prompt

    def side(shift, step_logits, change):
        log_ratio_M = torch.log(shift) - log_M - torch.log(change)
        return {"shift": float(shift.median()), "step_inf": float(step_logits.abs().amax(-1).median()),
                "ratio_tight": float((shift / (0.5 * step_logits.norm(dim=-1))).max()),
                "log10_ratio_M": float(log_ratio_M.max() / math.log(10)),
                "small": float((step_logits.abs().amax(-1) < 0.01).double().mean())}

    return {"x": side(sr.shift_from_x(document, x_0, x_1).norm(dim=-1), sr.logits(document, x_1 - x_0),
                      (x_1 - x_0).norm(dim=-1)),
            "A": side(sr.shift_from_A(document, moved, x_1).norm(dim=-1),
                      sr.logits(moved, x_1) - sr.logits(document, x_1), sr.spectral_norm(moved - document)),
            "log10_M_median": float((log_M / math.log(10)).median())}


LAYERS = ("softmax", "linear")   # Li et al.'s layer, and linear attention as a reference
# what a run of the loss-against-d sweep keeps (no curves of the measures, no theorem)
SWEEP_KEYS = ("loss", "gd_loss", "label_variance", "baselines", "convergence", "lr_star", "schedule", "half")


@dataclass(frozen=True)
class StudyConfig:
    """Li et al.'s two document lengths at d = 20 (``steps`` for each), and loss against d at the
    first length with its number of steps (Li et al.'s softmax layer only; d = ``d`` is the run of
    the lengths part). Adam with the "decay" schedule (constant, then linear to 0 over the last
    fifth), so that the final weights are not one draw of Adam's noise and each run can be compared
    with the same run at half its steps (the convergence criterion). The linear reference layer
    trains for ``reference_steps``, half the softmax layer's: the chapter shows what doubling
    them changes."""

    seeds: tuple = (0, 1, 2, 3, 4)
    lengths: tuple = (25, 200)
    steps: tuple = (16000, 16000)
    reference_steps: tuple = (8000, 8000)
    d: int = 20
    dims: tuple = (5, 10, 20, 40)
    batch: int = 128
    lr: float = 1e-2
    test_prompts: int = 1024

    def __post_init__(self):
        check_seeds(self.seeds)
        for name in ("d", "batch", "test_prompts"):
            check_positive_int(getattr(self, name), name)
        check_positive_float(self.lr, "lr")
        for name in ("lengths", "steps", "reference_steps", "dims"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty tuple of positive integers, got {values!r}")
        for name in ("steps", "reference_steps"):
            if len(getattr(self, name)) != len(self.lengths):
                raise ValueError(f"{name} must give one number per length {self.lengths}, got {getattr(self, name)}")

    def quick(self):
        return replace(self, seeds=(0, 1), lengths=(25,), steps=(40,), reference_steps=(20,), dims=(5, 20), batch=32,
                       test_prompts=128)


def run_one(study, n, d, attention, seed, steps, full, progress=False, *, device="cpu"):
    """Train one layer on one task; ``full`` adds the theorem on real updates and the training
    curves (the loss-against-d runs keep only their final numbers). A job of
    :func:`icl_lens.training.loop.run_jobs`."""
    task = SoftmaxRegressionTask(n, d)
    config = PromptLayerConfig(attention=attention, lr=study.lr, batch=study.batch, steps=steps,
                                       test_prompts=study.test_prompts, seed=seed, schedule="decay")
    layer, run = train_layer(task, config, device=device, progress=progress)
    test, tuning = test_and_tuning_prompts(task, study.test_prompts, seed, device)
    run["baselines"], run["baseline_lr"] = baseline_losses(task, test, tuning, lr_star=run["lr_star"])
    run["label_variance"] = run["baselines"]["zero"]
    run["convergence"] = converged(run, run["label_variance"])
    if full:
        run["theorem"] = theorem_on_steps(task, layer, test, run["lr_star"])
        return run
    return {k: run[k] for k in SWEEP_KEYS}


class StudyRecord(TypedDict):
    """What :func:`run_study` returns and ``closeness.json`` holds: PromptRun records (with their
    "baselines", "baseline_lr", "label_variance", "convergence", and "theorem" in the lengths part),
    one per seed."""

    study: dict                     # asdict(StudyConfig)
    lengths: dict                   # str(n) -> {layer: [run per seed]}
    dims: dict                      # str(d) -> {"softmax": [run per seed]} (SWEEP_KEYS only)


def run_study(study=StudyConfig(), *, device="cpu", progress=False, workers=1, scheduler=None):
    """Both layers for every document length (at d), and the softmax layer for every d (at the
    first length), over the seeds: training curves of the measures, baselines, the convergence
    criterion, the theorem. The longest documents train first, so that workers finish together."""
    order = sorted(zip(study.lengths, study.steps, study.reference_steps), key=lambda item: -item[0])
    jobs = [("lengths", str(n), (study, n, study.d, a, seed, steps if a == "softmax" else reference, True))
            for n, steps, reference in order for a in LAYERS for seed in study.seeds]
    jobs += [("dims", str(d), (study, study.lengths[0], d, "softmax", seed, study.steps[0], False))
             for d in study.dims if d != study.d for seed in study.seeds]
    runs = run_jobs(run_one, [(*job, progress and workers == 1) for *_, job in jobs], device=device,
                    workers=workers, scheduler=scheduler)
    record = {"study": asdict(study), "lengths": {}, "dims": {}}
    for (part, key, job), run in zip(jobs, runs):
        record[part].setdefault(key, {}).setdefault(job[3], []).append(run)
    record["lengths"] = {str(n): record["lengths"][str(n)] for n in study.lengths}
    if study.d in study.dims:   # the d = study.d point is the first length's softmax runs
        first = record["lengths"][str(study.lengths[0])]["softmax"]
        record["dims"][str(study.d)] = {"softmax": [{k: r[k] for k in SWEEP_KEYS} for r in first]}
    record["dims"] = {str(d): record["dims"][str(d)] for d in study.dims}
    return record


def in_numeric_order(part):
    """A record's ``lengths`` or ``dims`` with its keys in numeric order: a saved record's keys come
    back from JSON in string order ("200" before "25")."""
    return {key: part[key] for key in sorted(part, key=int)}


def summary(runs):
    """The medians over seeds of :func:`icl_lens.training.prompt_layer.summary`, each run
    normalised by its own label variance."""
    return prompt_layer_summary(runs, [r["label_variance"] for r in runs])


def log_loss_ratios(runs):
    """Per seed, log(trained layer's loss / GD*'s loss) on the seed's test prompts."""
    return [math.log(reported_value(r, "loss") / r["baselines"]["one GD step (lr*)"]) for r in runs]


def loss_match(runs):
    """Does the trained layer's loss match GD*'s to within :data:`MATCH`, read from the seeds: the
    "comparable" decision of :func:`icl_lens.statistics.decide` on :func:`log_loss_ratios` with the
    band log(1 + MATCH) (two one-sided sign tests at 0.05), its bounds and the verdict."""
    band = math.log(1 + MATCH)
    decision = statistics.decide("comparable", log_loss_ratios(runs), band, direction="higher")
    return {"interval": [decision["lower"], decision["upper"]], "band": band, "verdict": decision["verdict"],
            "decision": decision}


def alignment(runs):
    """Is the layer aligned with GD* (Model Cos at least :data:`ALIGNED`), read from the seeds: the
    "slightly" decision (one-sided sign tests at 0.05) on Model Cos - ALIGNED."""
    return statistics.decide("slightly", [reported_value(r, "model_cos") - ALIGNED for r in runs], COSINE_BAND,
                             direction="higher")


def closeness_verdict(summary_of_layer, runs):
    """Li et al.'s reading, as a rule: the trained layer is *close* to one GD step when its loss is
    within :data:`MATCH` of GD*'s (:func:`loss_match`) and Model Cos is at least :data:`ALIGNED`
    (:func:`alignment`). The claims table judges the two conditions as two rows; this line reads
    them together for the chapter."""
    ratio = summary_of_layer["trained layer"] / summary_of_layer["one GD step (lr*)"]
    near = {"agrees": True, "disagrees": False}.get(loss_match(runs)["verdict"])
    aligned = {"agrees": True, "disagrees": False}.get(alignment(runs)["verdict"])
    if near is None or aligned is None:
        unsettled = [name for name, flag in (("the loss ratio", near), ("Model Cos", aligned)) if flag is None]
        return f"inconclusive: the seeds do not settle {' or '.join(unsettled)}"
    if near and aligned:
        return "agrees"
    if not near and not aligned:
        return "disagrees"
    return "partly: " + ("as accurate, not aligned" if near else f"aligned, but {ratio:.2f} x GD*'s loss")


def model_cos_rise(runs):
    """Per seed, Model Cos at the last checkpoint minus at the first; the "directional" decision
    (higher, band :data:`COSINE_BAND`) and the seeds up / down by more than the band."""
    rises = [r["model_cos"][-1] - r["model_cos"][0] for r in runs]
    decision = statistics.decide("directional", rises, COSINE_BAND, direction="higher")
    return {"rises": rises, "median": decision["effect"], "interval": [decision["lower"], decision["upper"]],
            "better": sum(x > COSINE_BAND for x in rises), "worse": sum(x < -COSINE_BAND for x in rises),
            "decision": decision}


VERSION = "Li et al., NeurIPS 2024 version (experiments; the arXiv v1 text has none)"


def decided(decision, values):
    """What a claim keeps of a decision, with the per-seed values it read."""
    return {**{key: decision[key] for key in ("verdict", "effect", "lower", "upper", "coverage", "n", "p", "p_agree",
                                              "p_disagree", "smallest_agree", "smallest_disagree",
                                              "cannot_decide")}, "values": list(values)}


def claims(record):
    """Li et al.'s claims against the saved study: one entry per document length (the softmax
    layer), loss against d, and the theorem's assumptions on real updates."""
    found = []
    for n, layers in in_numeric_order(record["lengths"]).items():
        s = summary(layers["softmax"])
        setting = f"n = {n}, d = {record['study']['d']}"
        match, aligned = loss_match(layers["softmax"]), alignment(layers["softmax"])
        found.append({"id": f"li-closeness-loss-n{n}",
                      "claim": f"a trained softmax self-attention layer's loss is within {MATCH:.0%} of one GD "
                               "step's (GD*)", "where": VERSION, "setting": setting, "kind": "comparable",
                      "measured": f"loss {s['trained layer']:.3f} vs GD* {s['one GD step (lr*)']:.3f} (medians)",
                      "decision": decided(match["decision"], log_loss_ratios(layers["softmax"])), "verdict": match["verdict"]})
        found.append({"id": f"li-closeness-cos-n{n}",
                      "claim": f"a trained softmax self-attention layer's sensitivities align with one GD step's "
                               f"(Model Cos above {ALIGNED})", "where": VERSION, "setting": setting, "kind": "slightly",
                      "measured": f"Model Cos {s['model_cos']:.3f}; Preds Diff {s['preds_diff']:.3f} (medians)",
                      "decision": decided(aligned, [reported_value(r, "model_cos") - ALIGNED for r in layers["softmax"]]), "verdict": aligned["verdict"]})
    for n, layers in in_numeric_order(record["lengths"]).items():
        rise = model_cos_rise(layers["softmax"])
        found.append({"id": f"li-model-cos-rises-n{n}",
                      "claim": "the trained layer's Model Cos with one GD step rises over training",
                      "where": VERSION + ", the figure of Model Cos over training steps",
                      "setting": f"n = {n}, d = {record['study']['d']}", "kind": "directional",
                      "measured": f"Model Cos at the last checkpoint minus at the first: median "
                                  f"{rise['median']:.3f}, {rise['better']} of {len(layers['softmax'])} seeds up by "
                                  f"more than {COSINE_BAND}",
                      "decision": decided(rise["decision"], rise["rises"]), "verdict": rise["decision"]["verdict"]})
    ratios = {d: summary(layers["softmax"]) for d, layers in in_numeric_order(record["dims"]).items()}
    near = all(verdicts.matches(r["trained layer"] / r["one GD step (lr*)"], MATCH) for r in ratios.values())
    unconverged = [d for d, r in ratios.items() if not r["converged"]]
    note = f" (not converged at d = {', '.join(map(str, unconverged))})" if unconverged else ""
    found.append({"id": "li-loss-against-d", "claim": "the trained layer's loss follows one GD step's as d grows",
                  "where": VERSION + ", loss against d",
                  "setting": f"n = {record['study']['lengths'][0]}, d in {[int(d) for d in ratios]}",
                  "measured": ", ".join(f"d = {d}: {r['trained layer']:.2f} vs {r['one GD step (lr*)']:.2f}"
                                        for d, r in ratios.items()) + note,
                  "verdict": "agrees" if near else "disagrees"})
    small = max(r["theorem"][side]["small"] for layers in record["lengths"].values()
                for r in layers["softmax"] for side in ("x", "A"))
    found.append({"id": "li-smallness", "claim": "the main theorem's smallness assumption (a step moves every logit by less than "
                           "0.01) holds for the updates of this experiment",
                  "where": "Li et al., arXiv v1, Thm 1.4", "setting": "GD* steps and the trained softmax layers' updates",
                  "measured": f"largest share of test prompts inside the condition: {small:.2f}",
                  "verdict": "holds" if small >= 0.5 else "does not hold"})
    return found
