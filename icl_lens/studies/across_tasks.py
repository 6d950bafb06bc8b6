"""The across-tasks study: one attention layer trained with a fresh task weight for every prompt.

Chapters: across_tasks.

This is the benchmark of Garg et al. (2022) and von Oswald et al. (2023): a prompt holds N
demonstrations (x_i, y_i = w . x_i) and a query x_q, w ~ N(0, I) is drawn anew for each prompt,
and the trained layer (:class:`icl_lens.training.prompt_layer.PromptAttentionLayer`) is placed among
the training-free predictors of :mod:`icl_lens.baselines`. Ren & Liu train on one fixed w (Sec. 5);
here the same layers meet the across-task setting.

The dual reading (Theorem 3.1): the query's output is one gradient step of a dual model trained on
inputs W_K h_i with labels W_V h_i. One GD step on the task itself trains f(x) = w . x on inputs
x_i with labels y_i. :func:`dual_alignment` measures how close the trained layer's dual training
set comes to that one: the correlation of the dual labels with y_i, and how far W_Q^T W_K restricted
to the inputs is from a multiple of the identity.
"""

import re
from dataclasses import asdict, dataclass, replace
from typing import TypedDict

import torch

from icl_lens import baselines, context_use, verdicts
from icl_lens.attention import kernel_attention
from icl_lens.device import generator, pick
from icl_lens.dual import dual_model
from icl_lens.kernels import PositiveRandomFeatures
from icl_lens.training.loop import run_jobs
from icl_lens.training.prompt_layer import (ATTENTIONS, PromptLayerConfig, converged, predict, prompt_tokens,
                                            test_and_tuning_prompts, train_layer)
from icl_lens.training.prompt_layer import summary as prompt_layer_summary
from icl_lens.validation import check_positive_int, check_seeds

@dataclass(frozen=True)
class PromptDistribution:
    """x ~ U(input_low, input_high)^input_dim, w ~ N(0, I), y = w . x, N = num_demos."""

    input_dim: int = 10
    num_demos: int = 10
    input_low: float = -0.5
    input_high: float = 0.5

    def __post_init__(self):
        check_positive_int(self.input_dim, "input_dim")
        check_positive_int(self.num_demos, "num_demos")
        if not self.input_low < self.input_high:
            raise ValueError(f"input_low ({self.input_low}) must be below input_high ({self.input_high})")

    @classmethod
    def von_oswald(cls):
        """von Oswald et al. (2023), Sec. 4: d = 10, N = 10, x ~ U(-0.5, 0.5)."""
        return cls(10, 10, -0.5, 0.5)

    @classmethod
    def paper_linear(cls):
        """Ren & Liu's linear task (Sec. 5), with w drawn for every prompt: d = 11, N = 15, U(-1, 1)."""
        return cls(11, 15, -1.0, 1.0)

    @property
    def label_variance(self):
        """E[y^2] = d E[x^2] for w ~ N(0, I) and x uniform: the loss of predicting 0 (= the mean)."""
        low, high = self.input_low, self.input_high
        return self.input_dim * (low * low + low * high + high * high) / 3

    @property
    def token_dim(self):
        return self.input_dim + 1

    def sample(self, num_prompts, *, generator=None, num_demos=None, dtype=torch.float32, device="cpu"):
        return sample_prompts(self, num_prompts, generator=generator, num_demos=num_demos, dtype=dtype,
                              device=device)

    def one_step(self, x_context, y_context, x_query, lr):
        """The comparator: one GD step from w = 0 on the context, at learning rate ``lr``."""
        return baselines.one_step_gd(x_context, y_context, x_query, lr)

    def best_lr(self, prompts):
        """GD*'s learning rate on ``prompts``, in closed form (:func:`baselines.optimal_one_step_lr`)."""
        return baselines.optimal_one_step_lr(*prompts)


def sample_prompts(distribution, num_prompts, *, generator=None, num_demos=None, dtype=torch.float32,
                   device="cpu"):
    """``(x_context (P, N, d), y_context (P, N), x_query (P, d), y_query (P,))``, one task per prompt."""
    check_positive_int(num_prompts, "num_prompts")
    num_demos = distribution.num_demos if num_demos is None else check_positive_int(num_demos, "num_demos")
    device = pick(device)
    source = generator.device if generator is not None else torch.device("cpu")
    d = distribution.input_dim
    uniform = torch.rand(num_prompts, num_demos + 1, d, generator=generator, dtype=dtype, device=source)
    inputs = distribution.input_low + (distribution.input_high - distribution.input_low) * uniform
    weight = torch.randn(num_prompts, d, generator=generator, dtype=dtype, device=source)
    labels = (inputs * weight.unsqueeze(1)).sum(-1)
    inputs, labels = inputs.to(device), labels.to(device)
    return inputs[:, :-1], labels[:, :-1], inputs[:, -1], labels[:, -1]


def baseline_losses(prompts, train_prompts, *, demos_range=None):
    """Mean squared errors of the training-free predictors on ``prompts``; GD*'s learning rate is
    chosen on ``train_prompts`` (never on the test prompts). Returns ({name: loss}, lr_star)."""
    x_context, y_context, x_query, y_query = prompts
    lr_star = baselines.optimal_one_step_lr(*train_prompts)
    predictions = {"zero": baselines.zero(x_context, y_context, x_query),
                   "context mean": baselines.context_mean(x_context, y_context, x_query),
                   "one GD step (lr*)": baselines.one_step_gd(x_context, y_context, x_query, lr_star),
                   "least squares": baselines.least_squares(x_context.double(), y_context.double(),
                                                            x_query.double()).to(y_query.dtype)}
    return {name: float(((p - y_query) ** 2).mean()) for name, p in predictions.items()}, lr_star


def loss_against_demos(layer, distribution, demo_counts, *, seed, num_prompts=4096, device="cpu"):
    """Test loss of the trained layer and of the baselines when the prompt holds N demonstrations,
    for each N in ``demo_counts`` (the layer was trained at ``distribution.num_demos``). GD*'s
    learning rate is tuned afresh for each N on separate prompts."""
    curve = {}
    for n in demo_counts:
        test, tuning = test_and_tuning_prompts(distribution, num_prompts, seed, device, num_demos=n)
        losses, _ = baseline_losses(test, tuning)
        with torch.no_grad():
            losses["trained layer"] = float(((predict(layer, *test[:3]) - test[3]) ** 2).mean())
        curve[n] = losses
    return curve


def dual_alignment(layer, prompts):
    """How close the trained layer's dual training set is to the task's (per head, averaged over
    prompts): ``label_correlation`` is the correlation over the demonstrations of the dual labels
    (W_V h_i)_y with y_i; ``kernel_identity_cosine`` the cosine between the input block of
    W_Q^T W_K and the identity (1: the dual's inputs see x_i . x_q up to a scale, as one GD step does)."""
    x_context, y_context, x_query, _ = prompts
    demos = torch.cat([x_context, y_context.unsqueeze(-1)], dim=-1)
    d = x_context.shape[-1]
    found = []
    with torch.no_grad():
        for W_Q, W_K, W_V in zip(layer.W_Q, layer.W_K, layer.W_V):
            dual_labels = demos @ W_V[-1]
            a = dual_labels - dual_labels.mean(-1, keepdim=True)
            b = y_context - y_context.mean(-1, keepdim=True)
            correlation = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-30)
            kernel = (W_Q.T @ W_K)[:d, :d]
            identity = torch.eye(d, dtype=kernel.dtype, device=kernel.device)
            cosine = (kernel * identity).sum() / (kernel.norm() * identity.norm())
            found.append({"label_correlation": float(correlation.mean()), "kernel_identity_cosine": float(cosine)})
    return found


def random_feature_dual_check(layer, prompts, head=0, count=8):
    """Theorem 3.1 on a trained random-feature layer: the dual model built by :func:`icl_lens.dual.
    dual_model` from the layer's weights predicts, after its one step, exactly the layer's head
    output at the query. Returns the largest absolute gap over ``count`` prompts (float64)."""
    if layer.attention != "random-features":
        raise ValueError(f"layer must be a random-features layer, got {layer.attention!r}")
    tokens = prompt_tokens(*prompts[:3])[:count].double()
    W_Q, W_K, W_V = (w[head].detach().double() for w in (layer.W_Q, layer.W_K, layer.W_V))
    features = PositiveRandomFeatures(layer.omega.double())
    dual = dual_model(tokens[:, :-1], tokens[:, -1:], W_Q, W_K, W_V, features)
    with torch.no_grad():
        direct = kernel_attention(tokens[:, -1:], tokens, W_Q, W_K, W_V, feature_map=features).squeeze(-2)
    return float((dual.test_prediction() - direct).abs().max())


@dataclass(frozen=True)
class StudyConfig:
    """The whole across-tasks study; ``quick()`` is the CI size. The Adam runs use the "decay"
    schedule, so that the final weights are not one draw of Adam's noise and convergence can be
    checked against the same run at half the steps; the paper's SGD keeps its constant rate."""

    seeds: tuple = (0, 1, 2, 3, 4)
    steps: int = 4000
    schedule: str = "decay"
    batch: int = 256
    demo_counts: tuple = (1, 2, 4, 6, 8, 10, 11, 12, 15, 20, 25, 30)
    paper_steps: int = 40960   # the paper's linear task: 40 epochs of 1024 one-prompt steps
    test_prompts: int = 4096

    def __post_init__(self):
        check_seeds(self.seeds)
        for name in ("steps", "batch", "paper_steps", "test_prompts"):
            check_positive_int(getattr(self, name), name)
        if self.schedule not in ("decay", "constant"):
            raise ValueError(f"schedule must be 'decay' or 'constant', got {self.schedule!r}")
        if not self.demo_counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.demo_counts):
            raise ValueError(f"demo_counts must be a non-empty tuple of positive integers, got {self.demo_counts!r}")

    def quick(self):
        return replace(self, seeds=(0, 1), steps=60, batch=64, demo_counts=(2, 15, 30), paper_steps=60,
                       test_prompts=512)


def study_settings(study):
    """{name: (prompt distribution, PromptLayerConfig options)} of the three parts of the study."""
    settings = {"von Oswald (linear attention)": (PromptDistribution.von_oswald(), {"attention": "linear"})}
    for attention in ATTENTIONS:
        settings[f"paper task ({attention})"] = (PromptDistribution.paper_linear(), {"attention": attention})
    settings["paper task (linear, 2 heads)"] = (PromptDistribution.paper_linear(), {"attention": "linear", "heads": 2})
    settings["paper task (paper's SGD)"] = (PromptDistribution.paper_linear(),
                                            {"attention": "random-features", "optimizer": "sgd", "lr": 0.003,
                                             "batch": 1, "steps": study.paper_steps, "schedule": "constant"})
    return settings


def layer_config(study, options, seed):
    """The :class:`PromptLayerConfig` of one layer of the study: its setting's ``options`` and seed."""
    return PromptLayerConfig(**{"steps": study.steps, "batch": study.batch, "test_prompts": study.test_prompts,
                                "schedule": study.schedule, **options, "seed": seed})


def run_one(study, distribution, options, seed, progress=False, *, device="cpu"):
    """Train and measure one layer of the study (a job of :func:`icl_lens.training.loop.run_jobs`)."""
    config = layer_config(study, options, seed)
    layer, run = train_layer(distribution, config, device=device, progress=progress)
    test, tuning = test_and_tuning_prompts(distribution, config.test_prompts, seed, device)
    run["baselines"], _ = baseline_losses(test, tuning)
    run["convergence"] = converged(run, distribution.label_variance)
    run["dual"] = dual_alignment(layer, test)
    if config.attention == "random-features":
        run["dual_check"] = random_feature_dual_check(layer, test)
    if config.heads == 1 and config.optimizer == "adam" and distribution == PromptDistribution.paper_linear():
        run["demos_curve"] = {str(n): v for n, v in loss_against_demos(
            layer, distribution, study.demo_counts, seed=seed, num_prompts=study.test_prompts,
            device=device).items()}
    run["config"] = asdict(config)
    return run


# the layers whose context use is the contrast to Section 5's single-task layers: the paper's
# linear task drawn anew for every prompt, with Section 5's random-feature layer and with softmax
CONTEXT_SETTINGS = ("paper task (random-features)", "paper task (softmax)")
OTHER_TASK, SHUFFLE = 4_000_000, 5_000_000    # generator offsets of the context-use draws


def context_use_of_layer(layer, distribution, prompts, seed):
    """The measurements of :mod:`icl_lens.context_use` for a layer trained across tasks, on test
    ``prompts``: the other task's labels come from a fresh w for every prompt, and the label row's
    cosine is taken with each prompt's own w (recovered exactly by least squares: N >= d and no
    noise), averaged over the prompts."""
    x_context, y_context, x_query, y_query = prompts
    num_prompts, num_demos, d = x_context.shape
    other = torch.randn(num_prompts, d, generator=generator(seed + OTHER_TASK), dtype=torch.float64)
    other_labels = (x_context.double() * other.unsqueeze(1)).sum(-1, keepdim=True)
    order = context_use.random_orders(num_prompts, num_demos, generator(seed + SHUFFLE))
    found = context_use.measure(lambda tokens: layer(tokens).unsqueeze(-1), layer.query_weight,
                                prompt_tokens(x_context, y_context, x_query), y_query.unsqueeze(-1),
                                other_labels=other_labels.to(y_query.dtype).to(y_query.device),
                                order=order.to(y_query.device), label_variance=distribution.label_variance)
    w = torch.linalg.lstsq(x_context.double(), y_context.double().unsqueeze(-1)).solution.squeeze(-1)
    row = layer.W_V.detach().sum(0)[-1, :d].double().to(w.device)
    found["label_row_cosine"] = torch.nn.functional.cosine_similarity(row.expand_as(w), w, dim=-1).mean()
    return {name: float(value) for name, value in found.items()}


def run_context_use(study, setting, seed, *, device="cpu"):
    """One layer of ``setting`` trained as :func:`run_one` trains it (the same seed, prompts and
    steps: the same layer), and its context use (a job of :func:`icl_lens.training.loop.run_jobs`)."""
    distribution, options = study_settings(study)[setting]
    config = layer_config(study, options, seed)
    layer, _ = train_layer(distribution, config, device=device)
    test, _ = test_and_tuning_prompts(distribution, config.test_prompts, seed, device)
    return context_use_of_layer(layer, distribution, test, seed)


def context_use_study(study=StudyConfig(), *, device="cpu", workers=1, scheduler=None):
    """{setting: {seed: context use}} for :data:`CONTEXT_SETTINGS` over the study's seeds."""
    jobs = [(study, setting, seed) for setting in CONTEXT_SETTINGS for seed in study.seeds]
    found = run_jobs(run_context_use, jobs, device=device, workers=workers, scheduler=scheduler)
    return {setting: {str(seed): found[i * len(study.seeds) + j] for j, seed in enumerate(study.seeds)}
            for i, setting in enumerate(CONTEXT_SETTINGS)}


class StudyRecord(TypedDict):
    """What :func:`run_study` returns and ``multitask.json`` holds."""

    study: dict                     # asdict(StudyConfig)
    # setting name -> {"distribution", "label_variance", "runs": a PromptRun per seed, with the
    # study's "baselines", "convergence", "dual", "dual_check", "demos_curve", "config"}
    settings: dict


def run_study(study=StudyConfig(), *, device="cpu", progress=False, workers=1, scheduler=None):
    """(a) von Oswald's setting, linear attention; (b) the paper's linear task drawn per prompt, the
    three layers (one head and, for linear attention, two); (c) the paper's own optimiser (SGD at
    0.003, one prompt a step) on (b)'s prompts with the paper's random-feature layer.

    ``workers > 1`` (CPU only) trains the layers in that many spawned processes that share the
    CPU's threads; the numbers are the same as with one worker (every draw is seeded)."""
    settings = study_settings(study)
    names = [(name, seed) for name in settings for seed in study.seeds]
    shown = progress and workers == 1
    runs = run_jobs(run_one, [(study, *settings[name], seed, f"{name} seed {seed}, run {i} of {len(names)}" if shown
                               else False) for i, (name, seed) in enumerate(names, 1)],
                    device=device, workers=workers, scheduler=scheduler)
    record = {"study": asdict(study), "settings": {}}
    for (name, _), run in zip(names, runs):
        distribution = settings[name][0]
        entry = record["settings"].setdefault(name, {"distribution": asdict(distribution),
                                                     "label_variance": distribution.label_variance, "runs": []})
        entry["runs"].append(run)
    return record


def setting_converged(entry, tolerance=0.01):
    """A setting has converged when the median over seeds of the size of each run's move from
    doubling its training (:func:`converged`, normalised; two-sided) is below ``tolerance``."""
    criterion = verdicts.converged([r["convergence"]["improvement"] for r in entry["runs"]], tolerance,
                                   two_sided=True)
    return {"median_improvement": criterion["median_improvement"], "tolerance": tolerance,
            "converged": criterion["converged"]}


def summary(record, setting):
    """The medians over seeds of one setting (:func:`icl_lens.training.prompt_layer.summary`)."""
    entry = record["settings"][setting]
    return prompt_layer_summary(entry["runs"], [entry["label_variance"]] * len(entry["runs"]))


MATCH = 0.05          # |trained / GD* - 1| within this: the layer matches one GD step at lr*
ALIGNED = 0.95        # Model Cos at least this: the layer's sensitivities point where GD*'s do
NO_LEARNING = 0.9     # normalised loss at least this: no better than predicting the mean, in effect


def place(loss, gd_loss):
    """Where a normalised loss sits among the baselines (predict-the-mean is 1)."""
    if loss >= NO_LEARNING:
        return "no better than predicting the mean"
    if verdicts.matches(loss / gd_loss, MATCH):
        return "at one GD step (lr*)"
    return "better than one GD step (lr*)" if loss < gd_loss else "between one GD step (lr*) and the mean"


def slug(name):
    """A setting's name as part of a claim id: "paper task (linear, 2 heads)" -> "linear-2-heads"."""
    inner = name[name.index("(") + 1:name.rindex(")")] if "(" in name else name
    return "-".join(re.findall(r"[a-z0-9*]+", inner.lower()))


def claims(record):
    """The chapter's readings, computed from a saved study (rules: :data:`MATCH`, :data:`ALIGNED`,
    :data:`NO_LEARNING`). Each entry: claim, where it is made, setting, measured, verdict."""
    found = []
    vo = summary(record, "von Oswald (linear attention)")
    ratio = vo["trained layer"] / vo["one GD step (lr*)"]
    matches = verdicts.matches(ratio, MATCH) and vo["model_cos"] >= ALIGNED
    found.append({"id": "across-von-oswald",
                  "claim": "a trained linear self-attention layer reaches the loss of one GD step at the best "
                           "learning rate, and its sensitivities align with GD*'s",
                  "where": "von Oswald et al. (2023), Sec. 4", "setting": "von Oswald (linear attention)",
                  "measured": f"loss / GD* loss {ratio:.3f}, Model Cos {vo['model_cos']:.3f}",
                  "verdict": "agrees" if matches else "disagrees"})
    for name in record["settings"]:
        if name.startswith("paper task (") and "SGD" not in name:
            s = summary(record, name)
            found.append({"id": f"across-place-{slug(name)}",
                          "claim": "where the trained layer sits among the baselines (no claim in the papers)",
                          "where": "this chapter", "setting": name,
                          "measured": f"normalised loss {s['trained layer']:.3f} (GD* {s['one GD step (lr*)']:.3f}), "
                                      f"Model Cos {s['model_cos']:.3f}",
                          "verdict": place(s["trained layer"], s["one GD step (lr*)"])})
    sgd = summary(record, "paper task (paper's SGD)")
    adam = summary(record, "paper task (random-features)")
    stuck = sgd["trained layer"] >= NO_LEARNING
    found.append({"id": "across-disordered",
                  "claim": "training with a new task weight for every prompt gives disordered predictions",
                  "where": "Ren & Liu, App. E.1 (remark on multi-task training)",
                  "setting": "paper task (paper's SGD) against paper task (random-features)",
                  "measured": f"normalised loss {sgd['trained layer']:.3f} with SGD at 0.003, one prompt a step; "
                              f"{adam['trained layer']:.3f} with Adam at 1e-2, 256 prompts a step",
                  "verdict": ("agrees for the paper's optimiser, not for the layer: " if stuck else "disagrees: ")
                             + ("the same layer trains with Adam" if adam["trained layer"] < NO_LEARNING
                                else "the layer does not train with Adam either")})
    return found
