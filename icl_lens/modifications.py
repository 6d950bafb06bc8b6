"""Attention modifications read from the dual model's loss (Section 4 and Appendix D).

Chapters: modifications.

Each modification changes the dual model's loss; one gradient step on the modified loss equals a
modified attention layer, exactly, for kernel attention with the same feature map:

    regularized (Eqs. (11)-(12), D.1): + alpha/(2 lr) ||W||_F^2   ->  query-side values scaled by (1 - alpha)
    augmented (Eqs. (13)-(14), D.2):   labels g1(W_V x), inputs g2(W_K x)  ->  values g1(W_V X), keys g2(W_K X)
    negative samples (Eq. (15), D.3):  labels W_V x~_i, x~_i = x_i - beta mean_{j in N(i)} x_j
    ridge / mesa (Eq. (33)):           squared loss + lambda/2 ||W||^2, solved exactly (kernel ridge regression)

Rows are tokens, one query token at a time (unbatched), the temperature split as in
:mod:`icl_lens.attention` (sqrt(scale) on queries and keys). The forms are the derived ones of the math
specification, Section 8.
"""

import math
from dataclasses import dataclass, replace
from functools import cached_property

import torch

from icl_lens.validation import (as_tensor, check_finite_number, check_last_dim, check_matrix, check_positive_float,
                                 check_same_device_and_dtype)


@dataclass
class KernelPrompt:
    """Everything both sides need for one query: keys, values and features of the two token groups."""

    demo_keys: torch.Tensor      # (N, d_o), sqrt(scale) W_K x_i (or g2 of it)
    demo_values: torch.Tensor    # (N, d_v), W_V x_i (or g1 of it, or W_V x~_i)
    query_keys: torch.Tensor     # (T, d_o)
    query_values: torch.Tensor   # (T, d_v)
    query: torch.Tensor          # (d_o,), sqrt(scale) W_Q x'
    feature_map: object

    # features are computed once per prompt; dataclasses.replace builds a new prompt with fresh ones
    @cached_property
    def demo_features(self):
        return self.feature_map(self.demo_keys)

    @cached_property
    def query_side_features(self):
        return self.feature_map(self.query_keys)

    @cached_property
    def query_features(self):
        return self.feature_map(self.query)

    def scores(self):
        """phi(k_j) . phi(q) for the demonstrations and the query side."""
        return self.demo_features @ self.query_features, self.query_side_features @ self.query_features

    def normaliser(self):
        demo, query_side = self.scores()
        return demo.sum() + query_side.sum()

    def initial_weight(self):
        """W0 = 1/D sum over the query side of v_j phi(k_j)^T."""
        return self.query_values.T @ self.query_side_features / self.normaliser()

    def demo_update(self):
        """Delta W = 1/D sum_i v_i phi(k_i)^T: minus lr times the gradient of the (unregularized) loss."""
        return self.demo_values.T @ self.demo_features / self.normaliser()

    def predict(self, W):
        return W @ self.query_features


def kernel_prompt(demos, queries, W_Q, W_K, W_V, feature_map, *, query_index=-1, scale=None,
                  key_map=None, value_map=None):
    """Build a :class:`KernelPrompt`; ``key_map`` (g2) and ``value_map`` (g1) act on W_K x and W_V x."""
    for name, tensor in (("demos", demos), ("queries", queries)):
        as_tensor(tensor, name)
        if tensor.dim() != 2:
            raise ValueError(f"{name} must be (tokens, d), got shape {tuple(tensor.shape)}")
    d = demos.shape[-1]
    if demos.shape[0] < 1:
        raise ValueError("demos must hold at least one demonstration")
    check_last_dim(queries, "queries", d, "the token dimension of demos")
    check_matrix(W_K, "W_K", (None, d))
    check_matrix(W_Q, "W_Q", (W_K.shape[0], d))
    check_matrix(W_V, "W_V", (None, d))
    check_same_device_and_dtype([("demos", demos), ("queries", queries), ("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V)])
    if isinstance(query_index, bool) or not isinstance(query_index, int) or \
            not -queries.shape[0] <= query_index < queries.shape[0]:
        raise ValueError(f"query_index={query_index!r} is out of range for {queries.shape[0]} query tokens")
    if scale is None:
        scale = 1.0 / math.sqrt(W_K.shape[0])
    root = math.sqrt(check_positive_float(scale, "scale"))
    key_map = key_map or (lambda k: k)
    value_map = value_map or (lambda v: v)
    return KernelPrompt(
        demo_keys=root * key_map(demos @ W_K.T),
        demo_values=value_map(demos @ W_V.T),
        query_keys=root * key_map(queries @ W_K.T),
        query_values=value_map(queries @ W_V.T),
        query=root * queries[query_index] @ W_Q.T,
        feature_map=feature_map,
    )


def modified_attention(prompt, *, query_side_factor=1.0):
    """Kernel attention of the prompt's query, query-side values multiplied by ``query_side_factor``.

    With factor 1 this is ordinary kernel attention (Eq. (7)); with 1 - alpha it is Eq. (12).
    """
    demo, query_side = prompt.scores()
    total = demo @ prompt.demo_values + query_side_factor * (query_side @ prompt.query_values)
    return total / (demo.sum() + query_side.sum())


# --- regularized: Eqs. (11)-(12) --------------------------------------------------------------------


def regularized_loss(prompt, W, alpha, lr):
    """Eq. (11): -1/(lr D) sum_i v_i . W phi(k_i) + alpha/(2 lr) ||W||_F^2."""
    lr = check_positive_float(lr, "lr")
    check_finite_number(alpha, "alpha")
    check_weight(prompt, W)
    linear = -(prompt.demo_values * (prompt.demo_features @ W.T)).sum() / (lr * prompt.normaliser())
    return linear + alpha / (2 * lr) * (W**2).sum()


def regularized_steps(prompt, alpha, steps):
    """W_t after ``steps`` gradient steps on Eq. (11) from W0: W_{t+1} = (1 - alpha) W_t + Delta W."""
    check_finite_number(alpha, "alpha")
    check_steps(steps)
    W = prompt.initial_weight()
    update = prompt.demo_update()
    for _ in range(steps):
        W = (1 - alpha) * W + update
    return W


def exponential_smoothing(prompt, alpha, steps):
    """The closed form W_t = (1 - alpha)^t W0 + (1 - (1 - alpha)^t) / alpha Delta W (alpha != 0)."""
    check_finite_number(alpha, "alpha")
    if alpha == 0:
        raise ValueError("alpha must be nonzero here (at alpha = 0 the steps add up: use regularized_steps)")
    check_steps(steps)
    decay = (1 - alpha) ** steps
    return decay * prompt.initial_weight() + (1 - decay) / alpha * prompt.demo_update()


# --- negative samples: Eq. (15) -----------------------------------------------------------------------


def check_weight(prompt, W):
    """W maps the prompt's features to its values: (d_v, d_phi), on their device and dtype."""
    check_matrix(W, "W", (prompt.demo_values.shape[-1], prompt.demo_features.shape[-1]))
    check_same_device_and_dtype([("the prompt's features", prompt.demo_features), ("W", W)])


def check_steps(steps):
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")


def lowest_attention_neighbours(scores, k):
    """N(i): for each row i of a score matrix, the k columns with the lowest scores, i itself excluded."""
    if not 1 <= k < scores.shape[-1]:
        raise ValueError(f"k must be between 1 and {scores.shape[-1] - 1}, got {k}")
    masked = scores.clone()
    masked.fill_diagonal_(float("inf"))
    return torch.topk(masked, k, dim=-1, largest=False).indices


def negative_tokens(demos, neighbours, beta):
    """x~_i = x_i - beta / |N(i)| sum_{j in N(i)} x_j for every demonstration."""
    return demos - beta * demos[neighbours].mean(dim=-2)


# --- ridge / mesa: Eq. (33) ---------------------------------------------------------------------------


def ridge_weight(prompt, ridge):
    """W* = V_D^T Phi (Phi^T Phi + lambda I)^-1 (rows: Phi is (N, d_r)), the minimiser of
    1/2 sum_i |v_i - W phi_i|^2 + lambda/2 ||W||_F^2."""
    ridge = check_positive_float(ridge, "ridge")
    features_ = prompt.demo_features
    gram = features_.T @ features_ + ridge * torch.eye(features_.shape[1], dtype=features_.dtype, device=features_.device)
    return torch.linalg.solve(gram, features_.T @ prompt.demo_values).T


def ridge_attention(prompt, ridge):
    """Eq. (33) in kernel form: V_D^T (K_S + lambda I_N)^-1 Phi phi(q), K_S = Phi Phi^T (push-through)."""
    ridge = check_positive_float(ridge, "ridge")
    features_ = prompt.demo_features
    K_S = features_ @ features_.T
    weights = torch.linalg.solve(K_S + ridge * torch.eye(K_S.shape[0], dtype=K_S.dtype, device=K_S.device),
                                 features_ @ prompt.query_features)
    return prompt.demo_values.T @ weights


def ridge_loss(prompt, W, ridge):
    ridge = check_positive_float(ridge, "ridge")
    check_weight(prompt, W)
    return 0.5 * ((prompt.demo_values - prompt.demo_features @ W.T) ** 2).sum() + 0.5 * ridge * (W**2).sum()


# --- Lemma D.1 -----------------------------------------------------------------------------------------


def bad_alphas(A):
    """The alphas where A + alpha I is singular: the roots of det(alpha I + A), i.e. -eigenvalues of A."""
    as_tensor(A, "A")
    if A.dim() != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be square, got shape {tuple(A.shape)}")
    return -torch.linalg.eigvals(A)


def safe_radius(A, tolerance=1e-12):
    """delta of Lemma D.1: the smallest |alpha_k| over the non-zero roots (inf if every root is 0)."""
    roots = bad_alphas(A).abs()
    nonzero = roots[roots > tolerance * max(1.0, float(roots.max()))]
    return float(nonzero.min()) if len(nonzero) else math.inf


def with_negative_samples(prompt, demos, W_V, neighbours, beta):
    """The prompt with demonstration labels W_V x~_i (Eq. (15)); keys and scores are unchanged."""
    return replace(prompt, demo_values=negative_tokens(demos, neighbours, beta) @ W_V.T)
