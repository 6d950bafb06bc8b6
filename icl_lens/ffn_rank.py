"""Rank of the frozen FFN W_F = W_2 I_M W_1 of Theorem B.1 (Fig. 14, right).

Rank(W_F) <= min(Rank(W_2), Rank(I_M), Rank(W_1)) = min(d, #active ReLU units) when W_1, W_2 have full
rank d < d_h. The paper plots the mean of this upper bound over 1024 test prompts and 5 repeats for
d = 12 as d_h grows. Its layers are trained; ours are freshly initialised (PyTorch's default uniform
initialisation of a linear layer), which the book states where it shows the figure.
"""

import math
from dataclasses import dataclass

import torch

from icl_lens import tasks
from icl_lens.attention import kernel_attention
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.validation import check_positive_int


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
