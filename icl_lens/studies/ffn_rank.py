"""The Fig. 14 (right) study: the rank of the frozen FFN W_F = W_2 I_M W_1 of Theorem B.1.

Chapters: transformer_layer, experiments.

Rank(W_F) <= min(Rank(W_2), Rank(I_M), Rank(W_1)) = min(d, #active ReLU units) when W_1, W_2 have full
rank d < d_h. The paper plots the mean of this upper bound over 1024 test prompts and 5 repeats for
d = 12 as d_h grows, on trained layers. :func:`rank_bound` measures it on freshly initialised
layers (PyTorch's default uniform initialisation of a linear layer), :func:`trained_rank_bound` on
attention + FFN layers trained on the linear task with the loop of :mod:`icl_lens.training.loop`.
"""

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from icl_lens import tasks
from icl_lens.attention import kernel_attention
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.training.data import task_data, test_sets
from icl_lens.training.ensemble import AttentionEnsemble, LayerConfig, Modification, equivalence_curve, squared_errors
from icl_lens.training.loop import train
from icl_lens.validation import check_positive_float, check_positive_int, check_seeds


@dataclass(frozen=True)
class RankConfig:
    """Fig. 14 (right): d = 12 (linear task tokens), 1024 prompts, 5 repeats, d_h on a grid."""

    hidden_sizes: tuple = (4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 80, 96)
    num_prompts: int = 1024
    repeats: int = 5
    num_features: int = 1200
    seed: int = 0

    def __post_init__(self):
        for size in self.hidden_sizes:
            check_positive_int(size, "hidden_sizes")
        check_positive_int(self.num_prompts, "num_prompts")
        check_positive_int(self.repeats, "repeats")
        check_positive_int(self.num_features, "num_features")


def grows_within_noise(means, stds, repeats, spread=3.0):
    """True when a sequence of means over ``repeats`` draws never drops by more than ``spread``
    standard errors of the difference between neighbours (the Fig. 14 bound should grow with d_h)."""
    errors = [s / math.sqrt(repeats) for s in stds]
    return all(b >= a - spread * math.hypot(ea, eb)
               for (a, ea), (b, eb) in zip(zip(means, errors), zip(means[1:], errors[1:])))


def uniform_linear(d_out, d_in, generator, dtype=torch.float64):
    """Weight and bias of a freshly initialised linear layer: U(-1/sqrt(d_in), 1/sqrt(d_in))."""
    bound = 1.0 / math.sqrt(d_in)
    weight = (2 * torch.rand(d_out, d_in, generator=generator, dtype=dtype) - 1) * bound
    bias = (2 * torch.rand(d_out, generator=generator, dtype=dtype) - 1) * bound
    return weight, bias


def rank_bound(config, *, device="cpu"):
    """Mean and std (over repeats) of min(d, #active ReLUs) at the query's attention output, per d_h.

    Each repeat draws one task, its prompts and one attention layer; every d_h then gets its own FFN
    on the same attention outputs.
    """
    g = make_generator(config.seed)
    task = tasks.RegressionTask.linear()
    d = task.token_dim
    target = pick(device)
    bounds = torch.zeros(config.repeats, len(config.hidden_sizes), dtype=torch.float64)
    for repeat in range(config.repeats):
        weight = tasks.sample_task_weight(task, generator=g)
        tokens, _ = tasks.sample_sequences(task, config.num_prompts, weight, generator=g)
        W_Q, W_K, W_V = (uniform_linear(d, d, g)[0].to(target) for _ in range(3))
        phi = PositiveRandomFeatures(draw_omega(d, config.num_features, generator=g, device=target))
        tokens = tokens.to(target)
        h = kernel_attention(tokens[:, -1:], tokens, W_Q, W_K, W_V, feature_map=phi)[:, 0]
        for column, hidden in enumerate(config.hidden_sizes):
            W_1, b_1 = (t.to(target) for t in uniform_linear(hidden, d, g))
            active = (h @ W_1.T + b_1 >= 0).sum(-1)
            bounds[repeat, column] = float(active.clamp(max=d).double().mean())
    spread = bounds.std(dim=0) if config.repeats > 1 else torch.zeros(len(config.hidden_sizes))
    return {"hidden_sizes": list(config.hidden_sizes), "d": d,
            "mean_bound": bounds.mean(dim=0).tolist(), "std_bound": spread.tolist()}


@dataclass(frozen=True)
class TrainedRankConfig:
    """Fig. 14 (right) on trained layers: one attention + ReLU FFN layer (Theorem B.1's layer, no
    residual) per (d_h, seed), trained on the linear task as in Section 5 (one sequence per SGD
    step, lr 0.003), then the mean of min(d, #active ReLUs) over ``num_prompts`` test prompts."""

    hidden_sizes: tuple = (4, 8, 12, 16, 24, 33, 48, 64, 96)
    seeds: tuple = (0, 1, 2, 3, 4)
    epochs: int = 5
    tokens_per_epoch: int = 16384
    lr: float = 0.003
    num_prompts: int = 1024
    paper_saturation: int = 33     # "saturates at d = 12 for d_h >= 2.75 d"

    def __post_init__(self):
        for size in self.hidden_sizes:
            check_positive_int(size, "hidden_sizes")
        for name in ("epochs", "tokens_per_epoch", "num_prompts", "paper_saturation"):
            check_positive_int(getattr(self, name), name)
        if not self.hidden_sizes:
            raise ValueError("hidden_sizes must name at least one FFN width")
        check_seeds(self.seeds)
        check_positive_float(self.lr, "lr")

    def quick(self):
        return TrainedRankConfig(hidden_sizes=(4, 12, 33, 64), seeds=(0, 1), epochs=2, tokens_per_epoch=4096,
                                 num_prompts=128)


class FeedForward(torch.nn.Module):
    """Per-model ReLU FFN x_hat = W_2 ReLU(W_1 h + b_1) + b_2 (Eq. (2)), hidden width ``widths[m]``
    inside a common padded width: units beyond a model's width are masked to zero."""

    def __init__(self, dim, widths, seeds, dtype=torch.float32):
        super().__init__()
        width = max(widths)
        parts = {"W_1": [], "b_1": [], "W_2": [], "b_2": []}
        for hidden, seed in zip(widths, seeds):
            g = make_generator(20_000 + seed)
            W_1, b_1 = uniform_linear(hidden, dim, g)
            W_2, b_2 = uniform_linear(dim, hidden, g)
            parts["W_1"].append(torch.nn.functional.pad(W_1, (0, 0, 0, width - hidden)))
            parts["b_1"].append(torch.nn.functional.pad(b_1, (0, width - hidden)))
            parts["W_2"].append(torch.nn.functional.pad(W_2, (0, width - hidden)))
            parts["b_2"].append(b_2)
        for name, values in parts.items():
            setattr(self, name, torch.nn.Parameter(torch.stack(values).to(dtype)))
        self.register_buffer("mask", (torch.arange(width) < torch.tensor(widths)[:, None]).to(dtype))

    def pre_activation(self, h):
        """W_1 h + b_1 for h (M, B, d): (M, B, width), masked units at -1 (never active)."""
        u = h @ self.W_1.transpose(-1, -2) + self.b_1[:, None, :]
        return torch.where(self.mask[:, None, :] > 0, u, -torch.ones_like(u))

    def forward(self, h):
        hidden = torch.relu(self.pre_activation(h)) * self.mask[:, None, :]
        return hidden @ self.W_2.transpose(-1, -2) + self.b_2[:, None, :]


class AttentionWithFeedForward(torch.nn.Module):
    """Theorem B.1's layer for each model: the FFN of :class:`FeedForward` on the attention output
    of an :class:`AttentionEnsemble` (no residual), (M, B, n, d) tokens to (M, B, d)."""

    def __init__(self, attention, ffn):
        super().__init__()
        self.attention, self.ffn, self.seeds = attention, ffn, attention.seeds

    def forward(self, tokens):
        return self.ffn(self.attention(tokens))


def trained_rank_bound(config, *, device="cpu", progress=False):
    """Train every (d_h, seed) layer of ``config`` as one batch and measure the rank bound.

    Returns per d_h the mean and std over seeds of min(d, #active ReLUs) at the query, each
    model's training loss per epoch and final test loss (predicting the query's label), and each
    model's Fig. 14 (left) curve, ``equivalence`` (see :func:`icl_lens.training.ensemble.equivalence_curve`)."""
    device = pick(device)
    task = tasks.RegressionTask.linear()
    d = task.token_dim
    models = [(hidden, seed) for hidden in config.hidden_sizes for seed in config.seeds]
    attention = AttentionEnsemble(LayerConfig(token_dim=d), [Modification()] * len(models), [s for _, s in models],
                                  device=device)
    ffn = FeedForward(d, [h for h, _ in models], [s for _, s in models]).to(device)
    layer = AttentionWithFeedForward(attention, ffn)
    data = task_data(task, config.seeds)
    steps = config.tokens_per_epoch // task.num_tokens
    with tqdm(total=config.epochs * steps, desc="fig14 (trained layers)", disable=not progress) as bar:
        history = train(layer, data, steps=steps, epochs=config.epochs, lr=config.lr, step_errors=squared_errors,
                        progress=bar, sum_dtype=torch.float64)
    tests = test_sets(task, data.weights, config.num_prompts)
    tokens = torch.stack([tests[s][0] for _, s in models]).float().to(device)
    targets = torch.stack([tests[s][1] for _, s in models]).float().to(device)
    with torch.no_grad():
        h = attention(tokens)
        active = (ffn.pre_activation(h) >= 0).sum(-1)
        test = ((ffn(h)[..., -1] - targets[..., 0]) ** 2).mean(-1)
    bound = active.clamp(max=d).double().mean(-1).reshape(len(config.hidden_sizes), len(config.seeds))
    # Fig. 14 (left) on each trained layer: its Theorem B.1 dual model, trained one demonstration
    # a step, against the layer's output (the FFN trimmed to the model's own width)
    equivalence = {f"d_h={hidden} seed={seed}": equivalence_curve(
        attention, m, data, seed, (ffn.W_1[m, :hidden], ffn.b_1[m, :hidden], ffn.W_2[m, :, :hidden], ffn.b_2[m]))
        for m, (hidden, seed) in enumerate(models)}
    return {"hidden_sizes": list(config.hidden_sizes), "d": d, "seeds": list(config.seeds),
            "mean_bound": bound.mean(1).tolist(),
            "std_bound": (bound.std(1) if len(config.seeds) > 1 else torch.zeros(len(bound))).tolist(),
            "bound_per_seed": bound.tolist(), "train_loss": history.T.tolist(),
            "test_loss": test.tolist(), "label_variance": [float(tests[s][1].var(unbiased=False)) for _, s in models],
            "paper_saturation": config.paper_saturation, "epochs": config.epochs, "lr": config.lr,
            "equivalence": equivalence}
