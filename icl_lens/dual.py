"""Theorem 3.1: one kernel-attention layer's output for a query is one gradient step of a dual model.

Chapters: theorem_3_1, generalization_bound, transformer_layer, stacked_layers, across_tasks.

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

from icl_lens.attention import kernel_attention, queries_and_keys, values
from icl_lens.validation import (as_tensor, check_batch_shapes, check_last_dim, check_matrix, check_positive_float,
                                 check_rank_at_least)


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
    check_last_dim(queries, "queries", demos.shape[-1], "the token dimension of demos")
    check_batch_shapes([("demos", demos), ("queries", queries)])
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


# --- Theorem B.1: one Transformer layer (attention followed by a ReLU FFN) --------------------------


def feed_forward(h, W_1, b_1, W_2, b_2):
    """Eq. (2): W_2 ReLU(W_1 h + b_1) + b_2, for rows ``h`` (..., d_o); no residual, no LayerNorm."""
    return torch.relu(h @ W_1.T + b_1) @ W_2.T + b_2


@dataclass
class TransformerLayerDual(DualModel):
    """The dual model f+(x) = W phi(x) + b of Theorem B.1 (Eq. (20)); only W is trained.

    ``relu_mask`` (..., d_h) holds the diagonal of I_M, the ReLU units active at the query's attention
    output; ``W_F`` = W_2 I_M W_1 and ``bias`` = b_F = W_2 I_M b_1 + b_2 freeze the FFN into an affine
    map. Labels are W_F W_V x_i and W0 is W_F times the attention dual's W0.
    """

    bias: torch.Tensor = None
    W_F: torch.Tensor = None
    relu_mask: torch.Tensor = None

    def loss(self, W):
        """Eq. (21): -1/(lr D) sum_i (W_F W_V x_i) . (W phi(z_i) + b)."""
        predictions = self.train_features @ W.transpose(-1, -2) + self.bias.unsqueeze(-2)
        return -(self.train_labels * predictions).sum(dim=(-2, -1)) / (self.lr * self.D)

    def predict(self, W, z):
        return super().predict(W, z) + self.bias


def check_feed_forward(W_1, b_1, W_2, b_2, d_o):
    check_matrix(W_1, "W_1", (None, d_o))
    check_matrix(W_2, "W_2", (d_o, W_1.shape[0]))
    for name, bias, size in (("b_1", b_1, W_1.shape[0]), ("b_2", b_2, d_o)):
        as_tensor(bias, name)
        if bias.shape != (size,):
            raise ValueError(f"{name} must have shape ({size},), got {tuple(bias.shape)}")


def transformer_layer_dual(
    demos, queries, W_Q, W_K, W_V, W_1, b_1, W_2, b_2, feature_map, *, query_index=-1, lr=1.0, scale=None
):
    """Theorem B.1: the dual model whose one-step prediction equals attention followed by the FFN.

    The attention part is :func:`dual_model`; the ReLU pattern at the query's attention output h'
    turns the FFN into h -> W_F h + b_F, which is pushed into the labels and the bias.
    """
    attention_dual = dual_model(demos, queries, W_Q, W_K, W_V, feature_map, query_index=query_index, lr=lr, scale=scale)
    check_feed_forward(W_1, b_1, W_2, b_2, W_V.shape[0])
    attention_output = attention_dual.test_prediction()
    relu_mask = (attention_output @ W_1.T + b_1 >= 0).to(W_1.dtype)
    W_F = (W_2 * relu_mask.unsqueeze(-2)) @ W_1
    bias = (relu_mask * b_1) @ W_2.T + b_2
    return TransformerLayerDual(
        feature_map=feature_map,
        train_inputs=attention_dual.train_inputs,
        train_features=attention_dual.train_features,
        train_labels=attention_dual.train_labels @ W_F.transpose(-1, -2),
        test_input=attention_dual.test_input,
        D=attention_dual.D,
        W0=W_F @ attention_dual.W0,
        lr=attention_dual.lr,
        bias=bias,
        W_F=W_F,
        relu_mask=relu_mask,
    )


# --- Theorem B.2: stacked kernel-attention layers under PrefixLM masking ---------------------------


def prefix_lm_forward(tokens, layers, feature_maps, *, scale=None):
    """L kernel-attention layers under PrefixLM masking, computed directly.

    ``tokens`` (..., N + 1, d): N demonstrations then the query. Demonstrations attend to the
    demonstrations only; the query attends to all N + 1 tokens. ``layers`` is a list of
    (W_Q, W_K, W_V), each d x d; ``feature_maps`` one feature map per layer. Returns the hidden
    states [H^(0), H^(1), ..., H^(L)], each (..., N + 1, d).
    """
    check_stack(tokens, layers, feature_maps)
    hidden = [tokens]
    for (W_Q, W_K, W_V), feature_map in zip(layers, feature_maps):
        H = hidden[-1]
        demos = H[..., :-1, :]
        demo_outputs = kernel_attention(demos, demos, W_Q, W_K, W_V, feature_map=feature_map, scale=scale)
        query_output = kernel_attention(H[..., -1:, :], H, W_Q, W_K, W_V, feature_map=feature_map, scale=scale)
        hidden.append(torch.cat([demo_outputs, query_output], dim=-2))
    return hidden


def check_stack(tokens, layers, feature_maps):
    as_tensor(tokens, "tokens")
    if tokens.dim() < 2 or tokens.shape[-2] < 2:
        raise ValueError(f"tokens must be (..., N + 1, d) with N >= 1, got shape {tuple(tokens.shape)}")
    if len(layers) < 1:
        raise ValueError("layers must hold at least one (W_Q, W_K, W_V)")
    if len(feature_maps) != len(layers):
        raise ValueError(f"feature_maps has {len(feature_maps)} entries but layers has {len(layers)}")
    d = tokens.shape[-1]
    for index, weights in enumerate(layers):
        if len(weights) != 3:
            raise ValueError(f"layers[{index}] must be (W_Q, W_K, W_V)")
        for name, weight in zip(("W_Q", "W_K", "W_V"), weights):
            if not isinstance(weight, torch.Tensor) or weight.shape != (d, d):
                shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
                raise ValueError(f"layers[{index}] {name} must be a ({d}, {d}) tensor, got {shape}")


@dataclass
class StackedLayer:
    """Layer l of Theorem B.2: its dual model and the hidden states it produces."""

    dual: DualModel
    demo_normalisers: torch.Tensor  # D_i^(l), (..., N)
    demo_outputs: torch.Tensor      # h_i^(l) from Eq. (25), (..., N, d)
    query_output: torch.Tensor      # h_{N+1}^(l) = trained dual model at W_Q h_{N+1}^(l-1), (..., d)

    @property
    def hidden(self):
        return torch.cat([self.demo_outputs, self.query_output.unsqueeze(-2)], dim=-2)


def stacked_duals(tokens, layers, feature_maps, *, lr=1.0, scale=None):
    """Theorem B.2: the sequence of dual models of L stacked layers under PrefixLM masking.

    Layer l's dual model is trained on the previous layer's hidden states: inputs
    sqrt(scale) W_K^(l) h_i^(l-1), labels W_V^(l) h_i^(l-1), test input sqrt(scale) W_Q^(l) h_{N+1}^(l-1)
    (Eq. (24)). Its one-step prediction is the query's next hidden state; the demonstrations' next
    states come from the same dual model by Eq. (25):
        h_i^(l) = D^(l) / D_i^(l) [f_hat(q_i) - f_init(q_i)],  D_i^(l) = sum_j over demos phi(k_j) . phi(q_i).
    Returns one :class:`StackedLayer` per layer; the last ``query_output`` equals the L-layer forward pass.
    """
    check_stack(tokens, layers, feature_maps)
    H = tokens
    stack = []
    for (W_Q, W_K, W_V), feature_map in zip(layers, feature_maps):
        demos = H[..., :-1, :]
        model = dual_model(demos, H[..., -1:, :], W_Q, W_K, W_V, feature_map, lr=lr, scale=scale)
        query_output = model.test_prediction()
        demo_queries, _ = queries_and_keys(demos, demos, W_Q, W_K, scale)
        demo_query_features = feature_map(demo_queries)
        demo_normalisers = demo_query_features @ model.train_features.sum(dim=-2).unsqueeze(-1)
        demo_normalisers = demo_normalisers.squeeze(-1)
        trained_minus_initial = model.step() - model.W0
        demo_outputs = (
            model.D[..., None, None]
            / demo_normalisers.unsqueeze(-1)
            * (demo_query_features @ trained_minus_initial.transpose(-1, -2))
        )
        layer = StackedLayer(model, demo_normalisers, demo_outputs, query_output)
        stack.append(layer)
        H = layer.hidden
    return stack


def token_spread(H):
    """How distinct the demonstrations' states are: the mean distance of the rows H[:-1] (the query,
    last, is left out) to their mean, over their mean norm. 0 means every token collapsed to one."""
    demos = H[..., :-1, :]
    return float((demos - demos.mean(-2, keepdim=True)).norm(dim=-1).mean() / demos.norm(dim=-1).mean())
