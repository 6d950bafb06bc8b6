"""How well positive random features approximate softmax attention (the study of Figs. 6-9).

Chapters: kernels, theorem_3_1, experiments.

Compare the exact attention matrix (Eq. (5)) and output (Eq. (1)) of a layer with their
random-feature estimates (Eqs. (6)-(7)) as the number of features d_r grows. The paper averages
over 50 repeats with its trained layers. :func:`approximation_error` measures random layers
(weights with entries N(0, 1/d)) by default, or the layers it is given: the Section 5 study passes
the trained layers of the linear task (:func:`icl_lens.studies.section5.approximation_study`).
"""

from dataclasses import dataclass

import torch

from icl_lens.attention import (
    kernel_attention_weights,
    softmax_attention_weights,
    values,
)
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.validation import check_positive_int


@dataclass(frozen=True)
class ApproximationConfig:
    """Settings of the study; the defaults follow the paper (16 tokens, d = 12, 50 repeats)."""

    num_tokens: int = 16
    dim: int = 12
    feature_counts: tuple = (10, 30, 100, 300, 1200, 3000, 10000)
    repeats: int = 50
    seed: int = 0
    orthogonal: bool = False

    def __post_init__(self):
        check_positive_int(self.num_tokens, "num_tokens")
        check_positive_int(self.dim, "dim")
        check_positive_int(self.repeats, "repeats")
        if not self.feature_counts:
            raise ValueError("feature_counts must name at least one number of features")
        for count in self.feature_counts:
            check_positive_int(count, "feature_counts")


@dataclass
class AttentionLayer:
    """Random tokens and weights of one self-attention layer (rows are tokens)."""

    tokens: torch.Tensor
    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor


def random_layer(num_tokens, dim, *, generator, dtype=torch.float64, device="cpu"):
    """Tokens ~ U(-1, 1) and weights with N(0, 1/dim) entries, the scale of a freshly initialised layer."""
    source = generator.device
    tokens = 2 * torch.rand(num_tokens, dim, generator=generator, dtype=dtype, device=source) - 1
    W_Q, W_K, W_V = (
        torch.randn(dim, dim, generator=generator, dtype=dtype, device=source) / dim**0.5 for _ in range(3)
    )
    target = pick(device)
    return AttentionLayer(tokens.to(target), W_Q.to(target), W_K.to(target), W_V.to(target))


def compare(layer, feature_map):
    """Exact and estimated attention matrices and outputs of ``layer``'s self-attention."""
    X = layer.tokens
    exact = softmax_attention_weights(X, X, layer.W_Q, layer.W_K)
    estimate = kernel_attention_weights(X, X, layer.W_Q, layer.W_K, feature_map=feature_map)
    v = values(X, layer.W_V)
    return {"attention": exact, "attention_estimate": estimate, "output": exact @ v, "output_estimate": estimate @ v}


def approximation_error(config, *, device="cpu", layers=None):
    """MSE and MAE of the attention matrix and of the output against d_r, mean and std over repeats.

    Each repeat draws a random layer, or, with ``layers`` (e.g. trained layers), takes the next of
    them in turn, with fresh features. Returns a dict of plain lists (JSON-ready), one entry per
    value of ``config.feature_counts``, plus the median and quartiles over repeats (errors are
    heavy-tailed, so the median is the better summary).
    """
    generator = make_generator(config.seed)
    errors = {key: [[] for _ in config.feature_counts] for key in ("attention_mse", "attention_mae", "output_mse", "output_mae")}
    for repeat in range(config.repeats):
        if layers is None:
            layer = random_layer(config.num_tokens, config.dim, generator=generator, device=device)
        else:
            given = layers[repeat % len(layers)]
            layer = AttentionLayer(*(x.to(pick(device)) for x in (given.tokens, given.W_Q, given.W_K, given.W_V)))
        for position, count in enumerate(config.feature_counts):
            omega = draw_omega(layer.W_K.shape[0], count, generator=generator, orthogonal=config.orthogonal, device=device)
            result = compare(layer, PositiveRandomFeatures(omega))
            for part in ("attention", "output"):
                difference = result[f"{part}_estimate"] - result[part]
                errors[f"{part}_mse"][position].append(float((difference**2).mean()))
                errors[f"{part}_mae"][position].append(float(difference.abs().mean()))
    summary = {"feature_counts": list(config.feature_counts)}
    for key, per_count in errors.items():
        stacked = torch.tensor(per_count, dtype=torch.float64)
        summary[key] = stacked.mean(dim=1).tolist()
        summary[f"{key}_std"] = stacked.std(dim=1).tolist()
        quartiles = torch.quantile(stacked, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=1)
        summary[f"{key}_median"], summary[f"{key}_quartiles"] = quartiles[1].tolist(), quartiles[[0, 2]].T.tolist()
    return summary


def log_log_slope(xs, ys):
    """Least-squares slope of log(ys) against log(xs): about -1 when an error falls like 1/d_r."""
    x = torch.log(torch.tensor(xs, dtype=torch.float64))
    y = torch.log(torch.tensor(ys, dtype=torch.float64))
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())
