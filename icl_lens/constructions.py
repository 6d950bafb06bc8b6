"""Linear attention as the dual of a linear layer (Eqs. (3)-(4)) and the construction of
von Oswald et al. (2023) read through the dual model (Appendix F). Rows are examples.

Chapters: appendix_f.
"""

import torch

from icl_lens.validation import as_tensor, check_finite_number, check_float_dtype, check_last_dim, check_positive_float, \
    check_positive_int


def check_regression_data(x_context, y_context, x_query):
    as_tensor(x_context, "x_context")
    as_tensor(y_context, "y_context")
    as_tensor(x_query, "x_query")
    if x_context.dim() != 2 or x_context.shape[0] < 1:
        raise ValueError(f"x_context must be (N, d) with N >= 1, got shape {tuple(x_context.shape)}")
    if y_context.shape != (x_context.shape[0],):
        raise ValueError(f"y_context must have shape ({x_context.shape[0]},), got {tuple(y_context.shape)}")
    check_last_dim(x_query, "x_query", x_context.shape[1], "the columns of x_context")


def linear_attention(values, keys, query):
    """LA(V, K, q) = sum_i v_i (k_i . q), with v_i, k_i the rows of ``values`` and ``keys``."""
    return (keys @ query.unsqueeze(-1)).transpose(-1, -2) @ values


def linear_layer_gd_step(W0, inputs, targets, lr):
    """One gradient step of f(x) = W x on 1/2 sum_i |W x_i - y_i|^2 (Eq. (3)).

    Returns ``(W_hat, errors)`` with errors e_i = -lr (W0 x_i - y_i) as rows, the back-propagated
    signals of Eq. (3), so that W_hat = W0 + sum_i e_i x_i^T.
    """
    as_tensor(W0, "W0")
    as_tensor(inputs, "inputs")
    as_tensor(targets, "targets")
    lr = check_positive_float(lr, "lr")
    errors = -lr * (inputs @ W0.T - targets)
    return W0 + errors.T @ inputs, errors


def gd_one_step_prediction(x_context, y_context, x_query, lr, w0=None):
    """Prediction at ``x_query`` of w after one GD step on 1/(2N) sum_j (w . x_j - y_j)^2 from ``w0``."""
    check_regression_data(x_context, y_context, x_query)
    lr = check_positive_float(lr, "lr")
    w0 = torch.zeros_like(x_context[0]) if w0 is None else as_tensor(w0, "w0")
    residuals = x_context @ w0 - y_context
    w1 = w0 - lr * (residuals @ x_context) / x_context.shape[0]
    return x_query @ w1


def linear_self_attention(tokens, query_token, W_K, W_Q, W_V, P):
    """One linear self-attention update of the query token, with a residual connection:
    h + P sum_j W_V h_j (W_K h_j . W_Q h)   (von Oswald et al., 2023, Eq. (5) there)."""
    scores = (tokens @ W_K.T) @ (W_Q @ query_token)
    return query_token + P @ (scores @ (tokens @ W_V.T))


def von_oswald_weights(dim, lr, num_context, w0=None, dtype=torch.float64):
    """The construction's W_K = W_Q = [[I, 0], [0, 0]], W_V = [[0, 0], [w0^T, -1]], P = lr / N I."""
    check_positive_int(dim, "dim")
    check_positive_int(num_context, "num_context")
    check_finite_number(lr, "lr")
    check_float_dtype(dtype, "dtype")
    if w0 is not None and tuple(as_tensor(w0, "w0").shape) != (dim,):
        raise ValueError(f"w0 must have shape ({dim},), got {tuple(w0.shape)}")
    size = dim + 1
    W_K = torch.zeros(size, size, dtype=dtype)
    W_K[:dim, :dim] = torch.eye(dim, dtype=dtype)
    W_V = torch.zeros(size, size, dtype=dtype)
    if w0 is not None:
        W_V[dim, :dim] = w0
    W_V[dim, dim] = -1.0
    P = lr / num_context * torch.eye(size, dtype=dtype)
    return W_K, W_K.clone(), W_V, P


def von_oswald_lsa_prediction(x_context, y_context, x_query, lr):
    """The GD prediction read off a linear self-attention layer with von Oswald's weights.

    Tokens are (x_j, y_j) and the query (x_query, 0); the layer writes -(one-step prediction) into the
    label coordinate of the query, so the prediction is minus that coordinate.
    """
    check_regression_data(x_context, y_context, x_query)
    lr = check_positive_float(lr, "lr")
    if x_query.dim() != 1:
        raise ValueError(f"x_query must be one example (d,), got shape {tuple(x_query.shape)}")
    dim = x_context.shape[1]
    W_K, W_Q, W_V, P = von_oswald_weights(dim, lr, x_context.shape[0], dtype=x_context.dtype)
    tokens = torch.cat([x_context, y_context.unsqueeze(-1)], dim=-1)
    query_token = torch.cat([x_query, x_query.new_zeros(1)])
    updated = linear_self_attention(tokens, query_token, W_K.to(x_context), W_Q.to(x_context), W_V.to(x_context), P.to(x_context))
    return -updated[dim]


def dual_optimum(x_context, y_context, radius):
    """Appendix F: the maximiser of (1/N) sum_i [0; y_i]^T W [x_i; 0] over ||W||_F <= radius.

    A linear objective <M, W> is maximised on the ball at W* = radius M / ||M||_F with
    M = (1/N) sum_i [0; y_i][x_i; 0]^T, whose only non-zero row is (1/N) sum_i y_i x_i^T. For
    y_i = w . x_i that row is proportional to (sum_i x_i x_i^T) w: the direction of w only when the
    empirical covariance is isotropic.
    """
    check_regression_data(x_context, y_context, x_context[0])
    radius = check_positive_float(radius, "radius")
    dim = x_context.shape[1]
    M = torch.zeros(dim + 1, dim + 1, dtype=x_context.dtype, device=x_context.device)
    M[dim, :dim] = y_context @ x_context / x_context.shape[0]
    return radius * M / M.norm()
