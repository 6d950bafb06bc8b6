"""One attention layer, exact (Eq. (1), (5)) and with the softmax kernel replaced by features (Eqs. (6)-(7)).

Chapters: kernels, theorem_3_1, transformer_layer.

Rows are tokens. For query tokens ``queries_in`` (..., T, d_i) and context tokens ``context``
(..., n, d_i), with weights of shape (d_out, d_i) acting as ``x @ W.T``:

    q = queries_in @ W_Q.T,   k = context @ W_K.T,   v = context @ W_V.T
    softmax attention:  out_t = sum_j softmax_j(scale * q_t . k_j) v_j                    (Eq. (1))
    kernel attention:   out_t = sum_j phi(q_t') . phi(k_j') v_j / sum_l phi(q_t') . phi(k_l')

with q' = sqrt(scale) q and k' = sqrt(scale) k, so that exp(q' . k') = exp(scale q . k) and the kernel
form estimates the softmax form (Eq. (7)). ``scale`` defaults to 1 / sqrt(d_o), the paper's temperature.
"""

import math

import torch

from icl_lens.validation import (
    as_tensor,
    check_last_dim,
    check_matrix,
    check_positive_float,
    check_batch_shapes,
    check_rank_at_least,
    check_same_device_and_dtype,
)


def queries_and_keys(queries_in, context, W_Q, W_K, scale=None):
    """q = sqrt(scale) queries_in @ W_Q.T and k = sqrt(scale) context @ W_K.T: (..., T, d_o), (..., n, d_o)."""
    for name, tensor in (("queries_in", queries_in), ("context", context)):
        as_tensor(tensor, name)
        check_rank_at_least(tensor, name, 2)
    d_in = context.shape[-1]
    if context.shape[-2] < 1:
        raise ValueError(f"context must hold at least one token, got shape {tuple(context.shape)}")
    check_batch_shapes([("queries_in", queries_in), ("context", context)])
    check_last_dim(queries_in, "queries_in", d_in, "the token dimension of context")
    check_matrix(W_K, "W_K", (None, d_in))
    check_matrix(W_Q, "W_Q", (W_K.shape[0], d_in))
    check_same_device_and_dtype([("context", context), ("queries_in", queries_in), ("W_Q", W_Q), ("W_K", W_K)])
    if scale is None:
        scale = 1.0 / math.sqrt(W_K.shape[0])
    root = math.sqrt(check_positive_float(scale, "scale"))
    return root * (queries_in @ W_Q.T), root * (context @ W_K.T)


def values(context, W_V):
    """v = context @ W_V.T: (..., n, d_v)."""
    check_matrix(W_V, "W_V", (None, context.shape[-1]))
    check_same_device_and_dtype([("context", context), ("W_V", W_V)])
    return context @ W_V.T


def softmax_attention_weights(queries_in, context, W_Q, W_K, *, scale=None):
    """The attention matrix of Eq. (5), one row per query token: shape (..., T, n), rows sum to 1."""
    q, k = queries_and_keys(queries_in, context, W_Q, W_K, scale)
    # torch.softmax subtracts the row maximum, so large logits do not overflow
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


def softmax_attention(queries_in, context, W_Q, W_K, W_V, *, scale=None):
    """Exact softmax attention of each query token over the context tokens, Eq. (1): (..., T, d_v)."""
    weights = softmax_attention_weights(queries_in, context, W_Q, W_K, scale=scale)
    return weights @ values(context, W_V)


def kernel_scores(q, k, feature_map):
    """Unnormalised scores phi(q_t) . phi(k_j), (..., T, n), up to a positive factor per query row.

    A feature map with a ``log`` method (positive random features) is evaluated in log space: the
    largest log-feature of each query and the largest over all keys are subtracted before ``exp``.
    Both shifts multiply a whole query row by one constant, which the normalisation of attention
    removes exactly, so nothing overflows and the normalised output is unchanged.
    """
    if hasattr(feature_map, "log"):
        log_q = feature_map.log(q)
        log_k = feature_map.log(k)
        log_q = log_q - log_q.amax(dim=-1, keepdim=True)
        log_k = log_k - log_k.amax(dim=(-2, -1), keepdim=True)
        return torch.exp(log_q) @ torch.exp(log_k).transpose(-1, -2)
    return feature_map(q) @ feature_map(k).transpose(-1, -2)


def kernel_attention_weights(queries_in, context, W_Q, W_K, *, feature_map, scale=None):
    """The attention matrix with exp(q . k) replaced by phi(q) . phi(k) (Eqs. (6)-(7)): (..., T, n)."""
    q, k = queries_and_keys(queries_in, context, W_Q, W_K, scale)
    scores = kernel_scores(q, k, feature_map)
    normaliser = scores.sum(dim=-1, keepdim=True)
    if not (torch.isfinite(normaliser).all() and (normaliser != 0).all()):
        raise ValueError(
            "kernel attention normaliser is zero or not finite: the inputs are too large for feature_map "
            "(scale the weights down or use float64)"
        )
    return scores / normaliser


def kernel_attention(queries_in, context, W_Q, W_K, W_V, *, feature_map, scale=None):
    """Kernel (Performer-form) attention, Eqs. (6)-(7): (..., T, d_v).

    ``scale`` multiplies the logits as in :func:`softmax_attention`: sqrt(scale) goes on each side
    before ``feature_map``.
    """
    weights = kernel_attention_weights(queries_in, context, W_Q, W_K, feature_map=feature_map, scale=scale)
    return weights @ values(context, W_V)
