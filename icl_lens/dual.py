"""Theorem 3.1: one kernel-attention layer's output for a query is one gradient step of a dual model.

Dual model, Eq. (8):  f(x) = W phi(x),  W of shape (d_v, d_r).
Training set:         inputs  z_i = sqrt(scale) W_K x_i  (features phi(z_i)),  labels  y_i = W_V x_i,
                      for the N demonstrations x_i.
Loss, Eq. (9):        L(W) = -1/(lr D) sum_i y_i . W phi(z_i)
Normaliser:           D = sum over every key token j (demonstrations and query side) of phi(k_j) . phi(q)
Initial weight:       W0 = 1/D sum over query-side tokens j of (W_V x_j) phi(k_j)^T
Test input:           z_test = sqrt(scale) W_Q x'  for the query token x'.

One step W1 = W0 - lr grad L(W0) = W0 + 1/D sum_i y_i phi(z_i)^T (Eq. (17)), and
W1 phi(z_test) is exactly the kernel-attention output for x' (Eqs. (18)-(19)).

The sqrt(scale) on keys and queries is the paper's 1/sqrt(d_o) temperature, absorbed symmetrically
(math spec, Section 0). D and W0 belong to one query token: every query has its own dual model.
"""

from dataclasses import dataclass
from typing import Callable

import torch

from icl_lens.attention import queries_and_keys, values
from icl_lens.validation import as_tensor, check_positive_float, check_rank_at_least


@dataclass
class DualModel:
    """The dual model of one query token (Theorem 3.1). Leading batch dimensions are allowed.

    Shapes: ``train_inputs`` (..., N, d_o) are the key vectors z_i (before ``feature_map``);
    ``train_features`` (..., N, d_r) are phi(z_i); ``train_labels`` (..., N, d_v) are W_V x_i;
    ``test_input`` (..., d_o); ``D`` (...); ``W0`` (..., d_v, d_r).
    """

    feature_map: Callable
    train_inputs: torch.Tensor
    train_features: torch.Tensor
    train_labels: torch.Tensor
    test_input: torch.Tensor
    D: torch.Tensor
    W0: torch.Tensor
    lr: float

    def _scale(self):
        # 1 / (lr D), broadcast against (..., d_v, d_r)
        return (1.0 / (self.lr * self.D))[..., None, None]

    def loss(self, W):
        """Eq. (9): L(W) = -1/(lr D) sum_i y_i . W phi(z_i); shape (...)."""
        predictions = self.train_features @ W.transpose(-1, -2)
        return -(self.train_labels * predictions).sum(dim=(-2, -1)) / (self.lr * self.D)

    def grad(self, W=None):
        """Eq. (16): dL/dW = -1/(lr D) sum_i y_i phi(z_i)^T. L is linear, so this does not depend on W."""
        return -self._scale() * (self.train_labels.transpose(-1, -2) @ self.train_features)

    def step(self, W=None):
        """One full-batch gradient step from ``W`` (default ``W0``), Eq. (17): returns W1."""
        start = self.W0 if W is None else W
        return start - self.lr * self.grad(start)

    def sgd_trajectory(self):
        """Weights after each per-demonstration SGD step, shape (N + 1, ..., d_v, d_r).

        Step i minimises L_i(W) = -1/(lr D) y_i . W phi(z_i), adding y_i phi(z_i)^T / D. Entry 0 is W0,
        entry N equals :meth:`step` (Fig. 3, left: the error reaches round-off at step N).
        """
        per_demo = self.train_labels.unsqueeze(-1) * self.train_features.unsqueeze(-2) / self.D[..., None, None, None]
        cumulative = torch.cumsum(per_demo, dim=-3)
        steps = torch.cat([self.W0.unsqueeze(-3), self.W0.unsqueeze(-3) + cumulative], dim=-3)
        return steps.movedim(-3, 0)

    def predict(self, W, z):
        """f(z) = W phi(z) for inputs ``z`` (..., d_o) before the feature map: (..., d_v)."""
        return (W @ self.feature_map(z).unsqueeze(-1)).squeeze(-1)

    def test_prediction(self, W=None):
        """The prediction at the test input after one step from W0, or with the given ``W``."""
        return self.predict(self.step() if W is None else W, self.test_input)


def dual_model(demos, queries, W_Q, W_K, W_V, feature_map, *, query_index=-1, lr=1.0, scale=None):
    """Build the dual model of Theorem 3.1 for the query token ``queries[..., query_index, :]``.

    ``demos`` (..., N, d_i) are the demonstrations X_D; ``queries`` (..., T, d_i) the query-side tokens
    X_T, including the query itself, which attends to all demos and all queries (the paper's
    self-attention reading, math spec Part V.1). ``scale`` is the default of
    :func:`icl_lens.attention.kernel_attention`, so the dual prediction equals
    ``kernel_attention(queries[..., [query_index], :], cat(demos, queries), ...)``.
    """
    as_tensor(demos, "demos")
    as_tensor(queries, "queries")
    check_rank_at_least(demos, "demos", 2)
    check_rank_at_least(queries, "queries", 2)
    if demos.shape[-2] < 1:
        raise ValueError("demos must hold at least one demonstration (N >= 1)")
    if not -queries.shape[-2] <= query_index < queries.shape[-2]:
        raise ValueError(f"query_index={query_index} is out of range for {queries.shape[-2]} query tokens")
    lr = check_positive_float(lr, "lr")
    query = queries.narrow(-2, query_index % queries.shape[-2], 1)
    test_input, demo_keys = queries_and_keys(query, demos, W_Q, W_K, scale)
    _, query_keys = queries_and_keys(query, queries, W_Q, W_K, scale)
    test_input = test_input.squeeze(-2)

    demo_features = feature_map(demo_keys)
    query_side_features = feature_map(query_keys)
    test_features = feature_map(test_input)
    D = (demo_features @ test_features.unsqueeze(-1)).sum(dim=(-2, -1)) + (
        query_side_features @ test_features.unsqueeze(-1)
    ).sum(dim=(-2, -1))
    if not (torch.isfinite(D).all() and (D > 0).all()):
        raise ValueError("the normaliser D is not a positive finite number; feature_map under- or overflowed")
    W0 = values(queries, W_V).transpose(-1, -2) @ query_side_features / D[..., None, None]
    return DualModel(
        feature_map=feature_map,
        train_inputs=demo_keys,
        train_features=demo_features,
        train_labels=values(demos, W_V),
        test_input=test_input,
        D=D,
        W0=W0,
        lr=lr,
    )
