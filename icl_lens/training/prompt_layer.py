"""One attention layer read at the query and trained on prompts, each with a task of its own: the
layer of the across-tasks study and of Li et al.'s experiment, its training loop, and von
Oswald et al.'s three measures against one gradient step.

Chapters: across_tasks, closeness_experiment.

Tokens are rows h_i = [x_i ; y_i] and the query row is [x_q ; 0]. Every token attends to all N + 1
tokens (the paper's self-attention reading) and the prediction is the label coordinate of the query's
attention output, summed over heads (the residual adds the query's label, which is 0):

    linear     y_hat = sum_j (W_V h_j)_y (W_K h_j . W_Q h_q) / N             (von Oswald's LSA)
    softmax    y_hat = sum_j softmax_j(W_K h_j . W_Q h_q / sqrt(D)) (W_V h_j)_y         (Eq. (1))
    random-features  the softmax kernel replaced by positive random features       (Eqs. (6)-(7))

With a :class:`~icl_lens.training.ensemble.Modification` (``modification=``) the layer is the
paper's modified layer, read at the query, through the same functions as the Section 5 ensemble
(:mod:`icl_lens.training.ensemble`: ``regularized_weights``, ``augment``, ``lowest_scoring``,
``negative_samples``), so a modification is written once for both protocols: regularized alpha
(Eq. (12)), g1 on the values and g2 on the keys (Eq. (14)), negative samples (Eq. (15)).

A task is any object with ``token_dim``, ``sample``, ``one_step`` (the comparator: one gradient step
on the prompt's context) and ``best_lr`` (that step's best learning rate), such as
:class:`icl_lens.studies.across_tasks.PromptDistribution` or
:class:`icl_lens.studies.li_et_al.SoftmaxRegressionTask`.
"""

import math
from dataclasses import dataclass
from typing import TypedDict

import torch
from tqdm.auto import tqdm

from icl_lens import baselines, verdicts
from icl_lens.attention import kernel_attention_weights, kernel_scores
from icl_lens.device import generator, pick
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.training.ensemble import MAP_KINDS, Modification, augment, lowest_scoring, negative_samples, regularized_weights
from icl_lens.training.loop import decay_factor, decay_schedule, fork, fork_point
from icl_lens.validation import check_positive_float, check_positive_int

ATTENTIONS = ("linear", "softmax", "random-features")


class PromptRun(TypedDict, total=False):
    """What :func:`train_layer` returns as its record, and what the studies add to it. The lists
    hold one value per checkpoint (``steps``); None where a run diverged."""

    steps: list
    train_loss: list                # mean training loss since the previous checkpoint
    loss: list                      # test MSE
    gd_loss: list                   # test MSE of one GD step at lr_star
    preds_diff: list                # von Oswald et al.'s three measures against that step
    model_diff: list
    model_cos: list
    half: dict                      # "decay" only: the same measures at the end of the run of half the steps
    lr_star: float
    schedule: str
    # added by the studies
    baselines: dict                 # {predictor: test MSE}
    convergence: dict               # converged(record, label_variance)
    config: dict                    # asdict(PromptLayerConfig)
OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "decay")


def prompt_tokens(x_context, y_context, x_query):
    """Rows [x_i ; y_i] for the demonstrations and [x_q ; 0] for the query: (P, N + 1, d + 1)."""
    return stack_tokens(*baselines.check_prompts(x_context, y_context, x_query))


def stack_tokens(x_context, y_context, x_query):
    """:func:`prompt_tokens` without its input checks, for prompts this module drew itself (at
    n = 200 the finiteness checks cost as much as the training step)."""
    demos = torch.cat([x_context, y_context.unsqueeze(-1)], dim=-1)
    query = torch.cat([x_query, torch.zeros_like(x_query[..., :1])], dim=-1)
    return torch.cat([demos, query.unsqueeze(-2)], dim=-2)


@dataclass(frozen=True)
class PromptLayerConfig:
    """One layer, one optimiser, one seed. Defaults: Adam at 1e-2 on batches of 256 prompts (von
    Oswald et al. use Adam and large batches; at 1e-3 their setting sat on its plateau for 3000
    steps); ``init_std`` is the std of every weight entry."""

    attention: str = "linear"
    heads: int = 1
    optimizer: str = "adam"
    lr: float = 1e-2
    batch: int = 256
    steps: int = 6000
    schedule: str = "constant"
    decay_fraction: float = 0.2
    init_std: float = 0.2
    num_features: int = 64
    test_prompts: int = 4096
    checkpoints: int = 24
    seed: int = 0

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("heads", "batch", "steps", "num_features", "test_prompts", "checkpoints"):
            check_positive_int(getattr(self, name), name)
        check_positive_float(self.lr, "lr")
        check_positive_float(self.init_std, "init_std")
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction!r}")


def check_modification(modification, config):
    """The layer's :class:`Modification` (None: the plain layer), refused where the prompt layer
    cannot carry it, before any weight is drawn."""
    if modification is None:
        return Modification()
    if not isinstance(modification, Modification):
        raise ValueError(f"modification must be a Modification, got {type(modification).__name__}")
    if modification.ridge:
        raise ValueError("modification: the ridge layer (Eq. (33)) is Section 5's only (AttentionEnsemble), not the "
                         "prompt layer's")
    if modification.alpha and modification.renormalise and config.attention == "linear":
        raise ValueError("modification: regularized alpha renormalises the attention weights, and linear attention's "
                         "scores do not sum to one (they can sum to 0); use renormalise=False")
    return modification


class PromptAttentionLayer(torch.nn.Module):
    """``heads`` attention heads over the prompt tokens; ``forward`` gives the query predictions (P,)."""

    def __init__(self, token_dim, config, *, modification=None, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.modification = check_modification(modification, config)
        make = generator(config.seed)
        shape = (config.heads, token_dim, token_dim)
        weights = [config.init_std * torch.randn(shape, generator=make, dtype=torch.float64) for _ in range(3)]
        self.W_Q, self.W_K, self.W_V = (torch.nn.Parameter(w.to(dtype=dtype, device=device)) for w in weights)
        self.attention = config.attention
        omega = None
        if config.attention == "random-features":
            omega = draw_omega(token_dim, config.num_features, generator=generator(config.seed + 10_000))
            omega = omega.to(dtype=dtype, device=device)
        self.register_buffer("omega", omega)
        # the maps' weights exist only where a map is used, so a plain layer's parameters (and the
        # optimiser's state) are those it had before modifications were added; drawn apart from W
        # and omega, with torch.nn.Linear's default U(-1/sqrt(D), 1/sqrt(D)) as in the ensemble
        maps = generator(config.seed + 20_000)
        bound = 1 / math.sqrt(token_dim)
        for prefix in ("value", "key"):
            if getattr(self.modification, f"{prefix}_map") != "none":
                for name, size in (("W1", shape), ("b1", shape[:2]), ("W2", shape), ("b2", shape[:2])):
                    drawn = (2 * torch.rand(size, generator=maps, dtype=torch.float64) - 1) * bound
                    setattr(self, f"{prefix}_{name}", torch.nn.Parameter(drawn.to(dtype=dtype, device=device)))

    def attend(self, queries, tokens):
        """Each head's output for the rows ``queries`` (P, T, D) over ``tokens``: (heads, P, T, D).

        The same numbers as :func:`icl_lens.attention.softmax_attention` (and the kernel and linear
        forms) in another order: the query is moved through W_Q^T W_K and the weights are applied
        to the tokens before W_V, so no token is projected. A step then costs O(N D) per prompt
        instead of O(N D^2) when only the query attends, which is what makes n = 200 trainable.
        A modified layer (read at the query only) projects its tokens: :meth:`modified`."""
        if self.is_modified:
            weights, values = self.modified_attention(queries, tokens)
            return weights @ values
        return torch.stack([(weights @ tokens) @ W_V.T for weights, W_V in zip(self.weights(queries, tokens), self.W_V)])

    def weights(self, queries, tokens):
        """Each head's attention weights of the rows ``queries`` over ``tokens``: a list of (P, T, n)."""
        if self.is_modified:
            return list(self.modified_attention(queries, tokens)[0])
        found = []
        for W_Q, W_K in zip(self.W_Q, self.W_K):
            if self.attention == "random-features":
                features = PositiveRandomFeatures(self.omega)
                found.append(kernel_attention_weights(queries, tokens, W_Q, W_K, feature_map=features))
            else:
                scores = (queries @ W_Q.T @ W_K) @ tokens.transpose(-1, -2)
                if self.attention == "linear":
                    found.append(scores / (tokens.shape[-2] - 1))
                else:   # softmax with the paper's temperature 1 / sqrt(d_o)
                    found.append(torch.softmax(scores / math.sqrt(W_K.shape[0]), dim=-1))
        return found

    @property
    def is_modified(self):
        return self.modification != Modification()

    def modified_attention(self, queries, tokens):
        """The modified layer's attention of the query (``queries`` is its row, (P, 1, D)) over
        ``tokens`` (P, n, D), every head at once: weights (heads, P, 1, n) and values
        (heads, P, n, D), through the ensemble's functions of each modification. Keys and values
        are projected per token here (the modifications act on them), so a step costs O(N D^2)."""
        if queries.shape[-2] != 1:
            raise ValueError(f"a modified layer ({self.modification.name}) is read at the query only: queries must "
                             f"be one row per prompt, got {queries.shape[-2]}")
        m, heads = self.modification, self.W_Q.shape[0]
        per_head = tokens.unsqueeze(0).expand(heads, *tokens.shape)
        keys = per_head @ self.W_K.transpose(-1, -2).unsqueeze(1)
        if m.key_map != "none":
            keys = augment(keys, self.key_W1, self.key_b1, self.key_W2, self.key_b2, self.map_kind(m.key_map))
        query = queries.unsqueeze(0) @ self.W_Q.transpose(-1, -2).unsqueeze(1)
        if self.attention == "random-features":   # Eqs. (6)-(7), with the temperature on each side
            root = self.W_K.shape[-2] ** -0.25
            scores = kernel_scores(root * query, root * keys, PositiveRandomFeatures(self.omega))
            weights = scores / scores.sum(dim=-1, keepdim=True)
        else:
            logits = query @ keys.transpose(-1, -2)
            weights = (logits / (tokens.shape[-2] - 1) if self.attention == "linear"
                       else torch.softmax(logits / math.sqrt(self.W_K.shape[-2]), dim=-1))
        if m.alpha:
            flag = torch.tensor(m.alpha_form == "constant", device=weights.device)
            weights = regularized_weights(weights, m.alpha, flag, torch.tensor(m.renormalise, device=weights.device))
        value_tokens = per_head
        if m.negative_k and m.beta:
            n = tokens.shape[-2]
            if m.negative_k >= n:
                raise ValueError(f"negative_k={m.negative_k} needs more than {m.negative_k} tokens per prompt, got {n}")
            with torch.no_grad():
                index = lowest_scoring((per_head @ self.W_Q.transpose(-1, -2).unsqueeze(1)) @ keys.transpose(-1, -2),
                                       m.negative_k)
            per_model = torch.full((heads,), m.negative_k, device=tokens.device)
            value_tokens = negative_samples(per_head, index, torch.full((heads,), m.beta, dtype=tokens.dtype,
                                                                        device=tokens.device), per_model)
        values = value_tokens @ self.W_V.transpose(-1, -2).unsqueeze(1)
        if m.value_map != "none":
            values = augment(values, self.value_W1, self.value_b1, self.value_W2, self.value_b2,
                             self.map_kind(m.value_map))
        return weights, values

    def map_kind(self, kind):
        """``augment``'s code of a map kind, one per head."""
        return torch.full((self.W_Q.shape[0],), MAP_KINDS.index(kind), dtype=torch.long, device=self.W_Q.device)

    def query_weight(self, tokens):
        """The query's attention weight on its own token, mean over heads, (P,)."""
        return torch.stack([w[..., 0, -1] for w in self.weights(tokens[..., -1:, :], tokens)]).mean(0)

    def head_outputs(self, tokens):
        """Each head's output at the query token (the last row), (heads, P, D)."""
        return self.attend(tokens[..., -1:, :], tokens).squeeze(-2)

    def forward(self, tokens):
        return self.head_outputs(tokens)[..., -1].sum(0)


def predict(layer, x_context, y_context, x_query):
    return layer(prompt_tokens(x_context, y_context, x_query))


def sensitivity(predictor, x_context, y_context, x_query):
    """d y_hat / d x_q for every prompt, (P, d): each prediction depends on its own query only, so
    the gradient of their sum gives all of them at once."""
    x_query = x_query.detach().clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(predictor(x_context, y_context, x_query).sum(), x_query)
    return gradient


def gd_comparison(layer_predictor, prompts, lr_star, task):
    """von Oswald et al.'s three measures of a predictor against one GD step at ``lr_star``, plus
    both losses. ``prompts`` = (x_context, y_context, x_query, y_query). Preds Diff is the root mean
    square of the prediction difference; Model Diff the mean l2 distance of the sensitivities
    d y_hat / d x_q; Model Cos their mean cosine."""
    x_context, y_context, x_query, y_query = prompts

    def gd(xc, yc, xq):
        return task.one_step(xc, yc, xq, lr_star)

    layer_prediction = layer_predictor(x_context, y_context, x_query).detach()
    gd_prediction = gd(x_context, y_context, x_query)
    layer_slope = sensitivity(layer_predictor, x_context, y_context, x_query)
    gd_slope = sensitivity(gd, x_context, y_context, x_query)
    cosine = torch.nn.functional.cosine_similarity(layer_slope, gd_slope, dim=-1)
    return {"loss": float(((layer_prediction - y_query) ** 2).mean()),
            "gd_loss": float(((gd_prediction - y_query) ** 2).mean()),
            "preds_diff": float(((layer_prediction - gd_prediction) ** 2).mean().sqrt()),
            "model_diff": float((layer_slope - gd_slope).norm(dim=-1).mean()),
            "model_cos": float(cosine.mean())}


def _optimiser(layer, config, steps):
    """The optimiser of ``config`` and its schedule over ``steps`` (a run, or its half-length branch)."""
    optimizer = (torch.optim.Adam if config.optimizer == "adam" else torch.optim.SGD)(layer.parameters(), lr=config.lr)
    if config.schedule == "constant":
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(
        optimizer, decay_schedule(steps, config.decay_fraction))


def _train_step(layer, optimizer, schedule, task, config, stream, device):
    x_context, y_context, x_query, y_query = task.sample(config.batch, generator=stream, device=device)
    loss = ((layer(stack_tokens(x_context, y_context, x_query)) - y_query) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    return loss.item()


def train_layer(task, config, *, modification=None, device="cpu", progress=False):
    """Train one layer on fresh prompts of ``task`` (a new task weight each), recording the test loss
    and the three measures against the task's one-step comparator at its best learning rate (tuned
    on separate prompts) at ``config.checkpoints`` evenly spaced steps. Returns (layer, record), the
    record a :class:`PromptRun`.

    With ``config.schedule == "decay"`` the record also holds ``record["half"]``: the measures of
    the same run trained for half the steps. Both schedules share their constant phase, so the
    half-length run branches off at the start of its own decay (a copy of layer, optimiser and data
    stream) and costs ``decay_fraction / 2`` of a run; it is exactly the run a separate call with
    ``steps // 2`` would give.

    ``task`` is a :class:`PromptDistribution` or any object with its ``token_dim``, ``sample``,
    ``one_step`` and ``best_lr`` (the softmax-regression tasks of :mod:`icl_lens.studies.li_et_al`).
    ``modification`` trains the paper's modified layer (:class:`PromptAttentionLayer`)."""
    device = pick(device)
    layer = PromptAttentionLayer(task.token_dim, config, modification=modification, device=device)
    optimizer, schedule = _optimiser(layer, config, config.steps)
    stream = generator(config.seed + 1, device)
    test, tuning = test_and_tuning_prompts(task, config.test_prompts, config.seed, device)
    lr_star = task.best_lr(tuning)

    def measures(trained):
        found = gd_comparison(lambda xc, yc, xq: predict(trained, xc, yc, xq), test, lr_star, task)
        return {key: value if math.isfinite(value) else None for key, value in found.items()}

    marks = sorted({max(1, config.steps * j // config.checkpoints) for j in range(1, config.checkpoints + 1)})
    record = {"steps": marks, "train_loss": [], **{k: [] for k in ("loss", "gd_loss", "preds_diff",
                                                                     "model_diff", "model_cos")}}
    half = config.steps // 2
    branch_at = fork_point(half, config.decay_fraction) if config.schedule == "decay" else None
    running, count = 0.0, 0
    steps = range(1, config.steps + 1)
    if progress:
        # a study's job names itself in ``progress``, else the layer and seed
        steps = tqdm(steps, desc=progress if isinstance(progress, str) else f"{config.attention} seed {config.seed}",
                     leave=False)
    for step in steps:
        if step - 1 == branch_at:   # the half-length run: same weights, optimiser state and data so far
            short, short_stream, state = fork(layer, stream, optimizer)
            short_optimizer, short_schedule = _optimiser(short, config, half)
            short_optimizer.load_state_dict(state)
            short_schedule.last_epoch = schedule.last_epoch
            for group in short_optimizer.param_groups:
                group["lr"] = config.lr * decay_factor(schedule.last_epoch, half, config.decay_fraction)
            for _ in range(step, half + 1):
                _train_step(short, short_optimizer, short_schedule, task, config, short_stream, device)
            record["half"] = {"steps": half, **measures(short)}
        running += _train_step(layer, optimizer, schedule, task, config, stream, device)
        count += 1
        if step in marks:
            record["train_loss"].append(running / count)
            running, count = 0.0, 0
            for key, value in measures(layer).items():
                record[key].append(value)
    record["lr_star"] = lr_star
    record["schedule"] = config.schedule
    return layer, record


def test_and_tuning_prompts(task, num_prompts, seed, device, num_demos=None):
    """The fixed test prompts of a seed and, apart from them, the prompts that tune GD*'s step."""
    return tuple(task.sample(num_prompts, num_demos=num_demos, generator=generator(seed + offset, device),
                             device=device) for offset in (2, 3))


def window_mean(values, end=None):
    """The mean over the last quarter of the checkpoints up to ``end`` (default: all): a final value
    that Adam's step-to-step noise does not decide. None (a diverged run) counts as infinite."""
    values = [math.inf if x is None else x for x in values[:end]]
    quarter = max(1, len(values) // 4)
    return sum(values[-quarter:]) / quarter


def reported_value(record, key):
    """The reported value of a measure: at the end of a "decay" run (the step size is 0 there),
    else its window mean over the last quarter of training."""
    if record.get("schedule") == "decay":
        value = record[key][-1]
        return math.inf if value is None else value
    return window_mean(record[key])


def doubling_improvement(record, label_variance):
    """What training twice as long gains on the test loss divided by the label variance. For a
    "decay" run: the end of the same run at half the steps (``record["half"]``) minus the end of
    the run; for a constant step size, where single checkpoints are noisy, the mean over the quarter
    of the checkpoints that ends half-way minus the mean over the last quarter."""
    if record.get("schedule") == "decay":
        half = record["half"]["loss"]
        return (math.inf if half is None else half / label_variance) - reported_value(record, "loss") / label_variance
    losses = [math.inf if x is None else x / label_variance for x in record["loss"]]
    middle = window_mean(losses, len(losses) // 2) if len(losses) > 1 else math.inf
    return middle - window_mean(losses)


def converged(record, label_variance, tolerance=0.01):
    """One run by the convergence criterion of :func:`icl_lens.verdicts.converged`, two-sided:
    training twice as long moves its normalised test loss by less than ``tolerance`` either way
    (a run that got worse has not converged either)."""
    improvement = doubling_improvement(record, label_variance)
    return {"improvement": improvement, "tolerance": tolerance,
            "converged": verdicts.converged([improvement], tolerance, two_sided=True)["converged"]}


def summary(runs, label_variances):
    """Median over seeds (the runs) of the reported normalised test loss, of each baseline's
    normalised loss and of von Oswald's measures (see :func:`reported_value`), with the
    convergence criterion of :func:`icl_lens.verdicts.converged` over the runs' improvements."""
    median = verdicts.lower_median
    found = {"trained layer": median([reported_value(r, "loss") / v for r, v in zip(runs, label_variances)])}
    for name in runs[0]["baselines"]:
        found[name] = median([r["baselines"][name] / v for r, v in zip(runs, label_variances)])
    for key in ("preds_diff", "model_diff", "model_cos"):
        if key in runs[0]:
            found[key] = median([reported_value(r, key) for r in runs])
    improvements = [r["convergence"]["improvement"] for r in runs]
    criterion = verdicts.converged(improvements, runs[0]["convergence"]["tolerance"], two_sided=True)
    found["converged seeds"] = criterion["seeds_converged"]
    found["converged"] = criterion["converged"]
    found["seeds"] = len(runs)
    return found

