"""In-context regression tasks of Section 5 and Appendix E.

Chapters: theorem_3_1, transformer_layer, stacked_layers, experiments.

A sequence holds ``num_tokens`` tokens x_i = [t_i ; s_i] with s_i = g(W t_i); the last token is the
query, its label masked to 0, and its true label is the target. The paper trains on a single task (one
fixed W), so the task weight is drawn once and passed to :func:`sample_sequences`.

    linear:         s = W t,         t ~ U(-1, 1)^11,  N + 1 = 16
    trigonometric:  s = cos(W t),    t ~ U(0, pi)^7,   N + 1 = 128
    exponential:    s = exp(W t),    t ~ U(-1, 1)^6,   N + 1 = 512
with W_ij ~ N(0, 1) and one output dimension (d_s = 1).
"""

import math
from dataclasses import dataclass

import torch

from icl_lens.device import pick
from icl_lens.validation import check_matrix, check_positive_int

LINKS = {"linear": lambda u: u, "trigonometric": torch.cos, "exponential": torch.exp}


@dataclass(frozen=True)
class RegressionTask:
    """One in-context regression task family; the defaults are the paper's linear task."""

    kind: str = "linear"
    input_dim: int = 11
    output_dim: int = 1
    num_tokens: int = 16
    input_low: float = -1.0
    input_high: float = 1.0

    def __post_init__(self):
        if self.kind not in LINKS:
            raise ValueError(f"kind must be one of {sorted(LINKS)}, got {self.kind!r}")
        check_positive_int(self.input_dim, "input_dim")
        check_positive_int(self.output_dim, "output_dim")
        if self.num_tokens < 2:
            raise ValueError(f"num_tokens must be at least 2 (one demonstration and the query), got {self.num_tokens}")
        if not self.input_low < self.input_high:
            raise ValueError(f"input_low ({self.input_low}) must be below input_high ({self.input_high})")

    @property
    def token_dim(self):
        return self.input_dim + self.output_dim

    @classmethod
    def linear(cls):
        return cls("linear", 11, 1, 16, -1.0, 1.0)

    @classmethod
    def trigonometric(cls):
        return cls("trigonometric", 7, 1, 128, 0.0, math.pi)

    @classmethod
    def exponential(cls):
        return cls("exponential", 6, 1, 512, -1.0, 1.0)


def sample_task_weight(task, *, generator=None, dtype=torch.float64, device="cpu"):
    """W of shape (output_dim, input_dim), entries N(0, 1)."""
    source = generator.device if generator is not None else torch.device("cpu")
    weight = torch.randn(task.output_dim, task.input_dim, generator=generator, dtype=dtype, device=source)
    return weight.to(pick(device))


def sample_sequences(task, num_sequences, weight, *, generator=None):
    """Draw ``num_sequences`` sequences of the task with task weight ``weight``.

    Returns ``(tokens, targets)``: tokens (num_sequences, num_tokens, input_dim + output_dim) with the
    last token's label set to 0, and targets (num_sequences, output_dim), that masked label.
    """
    check_positive_int(num_sequences, "num_sequences")
    check_matrix(weight, "weight", (task.output_dim, task.input_dim))
    source = generator.device if generator is not None else torch.device("cpu")
    uniform = torch.rand(
        num_sequences, task.num_tokens, task.input_dim, generator=generator, dtype=weight.dtype, device=source
    ).to(weight.device)
    inputs = task.input_low + (task.input_high - task.input_low) * uniform
    labels = task_labels(task, inputs, weight)
    targets = labels[:, -1, :].clone()
    labels[:, -1, :] = 0.0
    return torch.cat([inputs, labels], dim=-1), targets


def task_labels(task, inputs, weight):
    """s = g(W t) for inputs t (..., input_dim): the labels task weight ``weight`` gives."""
    return LINKS[task.kind](inputs @ weight.T)

