"""Softmax regression and weight shifting (Li, Song, Xia, Yu, Zhou, arXiv 2304.13276).

Chapters: softmax_regression, lipschitz_lemmas, weight_shifting, closeness_experiment.

    alpha(x) = <exp(Ax), 1_n>,   f(x) = alpha(x)^-1 exp(Ax),   c(x) = f(x) - b,   L_exp(x) = 1/2 |c(x)|^2

with A (n, d) the "document" (n tokens), x (d,) the weights and b (n,) the target. Everything accepts
leading batch dimensions: A (..., n, d), x (..., d), b (..., n). Norms of matrices are spectral, as in
the paper. Each bound function checks the assumptions it needs and raises ValueError naming the one
that fails; the inequality itself is left to the caller to compare (the book searches for violations).
"""

import math

import torch

from icl_lens.validation import as_tensor, check_positive_float

# --- definitions (Sec. 4.1) -----------------------------------------------------------------------


def check_problem(A, x, b=None):
    as_tensor(A, "A")
    as_tensor(x, "x")
    if A.dim() < 2:
        raise ValueError(f"A must be (..., n, d), got shape {tuple(A.shape)}")
    if x.shape[-1] != A.shape[-1]:
        raise ValueError(f"x has length {x.shape[-1]} but A has {A.shape[-1]} columns")
    if b is not None:
        as_tensor(b, "b")
        if b.shape[-1] != A.shape[-2]:
            raise ValueError(f"b has length {b.shape[-1]} but A has {A.shape[-2]} rows")


def linear_regression_loss(A, x, b):
    """Def. 1.1, linear regression: (1/2) ||A x - b||_2^2 (minimising it minimises ||A x - b||_2)."""
    check_problem(A, x, b)
    return 0.5 * ((logits(A, x) - b) ** 2).sum(-1)


def linear_regression_grad(A, x, b):
    """Its gradient in x: A^T (A x - b)."""
    return ((logits(A, x) - b).unsqueeze(-1) * A).sum(-2)


def exponential_regression_loss(A, x, b):
    """Def. 1.2, exponential regression: (1/2) ||exp(A x) - b||_2^2."""
    check_problem(A, x, b)
    return 0.5 * ((torch.exp(logits(A, x)) - b) ** 2).sum(-1)


def exponential_regression_grad(A, x, b):
    """Its gradient in x: A^T (exp(A x) o (exp(A x) - b))."""
    u = torch.exp(logits(A, x))
    return ((u * (u - b)).unsqueeze(-1) * A).sum(-2)


def logits(A, x):
    """Ax, shape (..., n)."""
    return (A @ x.unsqueeze(-1)).squeeze(-1)


def alpha(A, x):
    """alpha(x) = <exp(Ax), 1_n> (Definition, Sec. 4.1)."""
    check_problem(A, x)
    return torch.exp(logits(A, x)).sum(-1)


def f(A, x):
    """f(x) = alpha(x)^-1 exp(Ax): the softmax of Ax, computed stably (max subtracted)."""
    check_problem(A, x)
    return torch.softmax(logits(A, x), dim=-1)


def c(A, x, b):
    """c(x) = f(x) - b."""
    check_problem(A, x, b)
    return f(A, x) - b


def loss(A, x, b):
    """L_exp(x) = 1/2 |f(x) - b|_2^2 (Definition 1.3 with the 1/2 of Sec. 4.1)."""
    return 0.5 * (c(A, x, b) ** 2).sum(-1)


def softmax_jacobian_times(probabilities, vector):
    """(diag(f) - f f^T) v without forming the matrix."""
    return probabilities * vector - probabilities * (probabilities * vector).sum(-1, keepdim=True)


def grad_x(A, x, b):
    """dL/dx = A^T (diag(f) - f f^T) c, DLS23 Lemma 5.6 in vector form.

    Coordinate i is -<f, A_{*,i}> <c, f> + <c, f o A_{*,i}>, the last part of the lemma.
    """
    probabilities = f(A, x)
    weighted = softmax_jacobian_times(probabilities, probabilities - b)
    return (A.transpose(-1, -2) @ weighted.unsqueeze(-1)).squeeze(-1)


def grad_A(A, x, b):
    """dL/dA = (diag(f) - f f^T) c x^T: the gradient for the attention-update view (Sec. 6-7)."""
    probabilities = f(A, x)
    weighted = softmax_jacobian_times(probabilities, probabilities - b)
    return weighted.unsqueeze(-1) * x.unsqueeze(-2)


def gradient_lemma_parts(A, x, b):
    """Every part of DLS23 Lemma 5.6, column i of A in column i of each result.

    Returns a dict: d exp(Ax)/dx_i (n, d), d alpha/dx_i (d,), d alpha^-1/dx_i (d,), d f/dx_i (n, d),
    d <f, b>/dx_i (d,), d L/dx_i (d,). Unbatched.
    """
    check_problem(A, x, b)
    exp_Ax = torch.exp(logits(A, x))
    alpha_x = exp_Ax.sum()
    probabilities = exp_Ax / alpha_x
    f_dot_columns = probabilities @ A                      # <f, A_{*,i}> for every i
    residual = probabilities - b
    d_f = -probabilities.unsqueeze(-1) * f_dot_columns + probabilities.unsqueeze(-1) * A
    return {
        "exp": exp_Ax.unsqueeze(-1) * A,
        "alpha": exp_Ax @ A,
        "alpha_inverse": -f_dot_columns / alpha_x,
        "f": d_f,
        "f_dot_b": -f_dot_columns * (probabilities @ b) + (probabilities.unsqueeze(-1) * A * b.unsqueeze(-1)).sum(0),
        "loss": -f_dot_columns * (residual @ probabilities) + (residual.unsqueeze(-1) * probabilities.unsqueeze(-1) * A).sum(0),
    }


# --- updates and the induced shift of b ------------------------------------------------------------


def gd_step_x(A, x, b, lr):
    """One gradient step on the weights: x - lr dL/dx."""
    return x - check_positive_float(lr, "lr") * grad_x(A, x, b)


def attention_step_A(A, x, b, lr):
    """One update of the document A by gradient descent, A - lr dL/dA: the self-attention view."""
    return A - check_positive_float(lr, "lr") * grad_A(A, x, b)


def exp_difference(u, step):
    """exp(u) - exp(u + step), computed as -exp(u) expm1(step): no cancellation however small the
    step, so a tiny difference is not swamped by the round-off of two nearly equal exponentials."""
    return -torch.exp(u) * torch.expm1(step)


def alpha_difference(u, step):
    """alpha at u minus alpha at u + step (alpha = sum of exponentials), cancellation-free."""
    return exp_difference(u, step).sum(-1)


def softmax_difference(u, step):
    """softmax(u) - softmax(u + step) without cancellation: softmax_i(u + step) = softmax_i(u)
    exp(step_i - log(alpha(u + step) / alpha(u))), and that log is log1p of a cancellation-free ratio."""
    log_ratio = torch.log1p(-alpha_difference(u, step) / torch.exp(u).sum(-1))
    return -torch.softmax(u, dim=-1) * torch.expm1(step - log_ratio.unsqueeze(-1))


def shift_from_x(A, x_now, x_next):
    """delta_b = f(x_t) - f(x_{t+1}): moving x with b fixed equals keeping x_t and moving b by delta_b.

    (f(x_{t+1}) - b = f(x_t) - (b + delta_b).) The paper's sign may be the opposite; only the norm
    enters its bounds. Computed from A (x_{t+1} - x_t) without cancellation.
    """
    return softmax_difference(logits(A, x_now), logits(A, x_next - x_now))


def shift_from_A(A_now, A_next, x):
    """delta_b = f(A_t x) - f(A_{t+1} x), the shift induced by updating the document."""
    return softmax_difference(logits(A_now, x), logits(A_next - A_now, x))


def shift_parts_from_x(A, x_now, x_next):
    """delta_b = delta_b1 + delta_b2 (Sec. 5.2), with
    delta_b1 = (alpha(x_t)^-1 - alpha(x_{t+1})^-1) exp(A x_t),
    delta_b2 = alpha(x_{t+1})^-1 (exp(A x_t) - exp(A x_{t+1}))."""
    exp_now, exp_next = torch.exp(logits(A, x_now)), torch.exp(logits(A, x_next))
    alpha_now, alpha_next = exp_now.sum(-1, keepdim=True), exp_next.sum(-1, keepdim=True)
    return (1 / alpha_now - 1 / alpha_next) * exp_now, (exp_now - exp_next) / alpha_next


# --- assumptions ------------------------------------------------------------------------------------


def spectral_norm(A):
    return torch.linalg.matrix_norm(A, ord=2)


def require(condition, message):
    if not bool(torch.as_tensor(condition).all()):
        raise ValueError(message)


def check_radius(R, minimum=0.0):
    R = check_positive_float(R, "R")
    if R < minimum:
        raise ValueError(f"R must be at least {minimum} for this result, got {R}")
    return R


def check_x_assumptions(A, x, y, R, closeness=0.01):
    """||A|| <= R, ||x||_2 <= R, ||y||_2 <= R and ||A(y - x)||_inf < closeness (Sec. 5.3-5.5)."""
    check_problem(A, x)
    check_problem(A, y)
    R = check_radius(R)
    slack = 1 + 1e-12  # a norm computed exactly at the radius may round above it
    require(spectral_norm(A) <= R * slack, f"assumption ||A|| <= R = {R} fails")
    require(x.norm(dim=-1) <= R * slack, f"assumption ||x||_2 <= R = {R} fails")
    require(y.norm(dim=-1) <= R * slack, f"assumption ||y||_2 <= R = {R} fails")
    require(logits(A, y - x).abs().amax(-1) < closeness, f"assumption ||A(y - x)||_inf < {closeness} fails")
    return R


def check_A_assumptions(A, B, x, R, closeness=0.01):
    """||A||, ||B|| <= R, ||x||_2 <= R and ||(A - B) x||_inf < closeness (Sec. 6-7)."""
    check_problem(A, x)
    check_problem(B, x)
    R = check_radius(R)
    slack = 1 + 1e-12
    require(spectral_norm(A) <= R * slack, f"assumption ||A|| <= R = {R} fails")
    require(spectral_norm(B) <= R * slack, f"assumption ||B|| <= R = {R} fails")
    require(x.norm(dim=-1) <= R * slack, f"assumption ||x||_2 <= R = {R} fails")
    require(logits(A - B, x).abs().amax(-1) < closeness, f"assumption ||(A - B) x||_inf < {closeness} fails")
    return R


def check_beta(beta, *alphas):
    """beta (a number, or a tensor with one value per setting) is a lower bound on every alpha."""
    if isinstance(beta, torch.Tensor):
        require(torch.isfinite(beta) & (beta > 0), "beta must be positive and finite")
    else:
        beta = check_positive_float(beta, "beta")
    for value in alphas:
        require(value >= beta * (1 - 1e-12), f"assumption alpha >= beta = {beta} fails")
    return beta


# --- the lemmas: each returns (lhs, rhs) -----------------------------------------------------------


def basic_fact(u, v, closeness=0.01, *, step=None):
    """Sec. 3.2: ||exp(u) - exp(v)||_2 <= 2 ||exp(u)||_2 ||u - v||_inf when ||u - v||_inf <= 0.01.

    ``step`` = v - u, when known exactly (e.g. A (y - x)), avoids the cancellation of u - v."""
    as_tensor(u, "u")
    as_tensor(v, "v")
    step = v - u if step is None else step
    require(torch.as_tensor(step.abs().amax(-1) <= closeness), f"assumption ||u - v||_inf <= {closeness} fails")
    lhs = exp_difference(u, step).norm(dim=-1)
    return lhs, 2 * torch.exp(u).norm(dim=-1) * step.abs().amax(-1)


def lipschitz_exp_x(A, x, y, R):
    """||exp(Ax) - exp(Ay)||_2 <= 2 sqrt(n) R exp(R^2) ||x - y||_2."""
    R = check_x_assumptions(A, x, y, R)
    n = A.shape[-2]
    lhs = exp_difference(logits(A, x), logits(A, y - x)).norm(dim=-1)
    return lhs, 2 * math.sqrt(n) * R * math.exp(R**2) * (x - y).norm(dim=-1)


def lipschitz_alpha_x(A, x, y, R):
    """|alpha(x) - alpha(y)| <= 2 n R exp(R^2) ||x - y||_2."""
    R = check_x_assumptions(A, x, y, R)
    n = A.shape[-2]
    lhs = alpha_difference(logits(A, x), logits(A, y - x)).abs()
    return lhs, 2 * n * R * math.exp(R**2) * (x - y).norm(dim=-1)


def lipschitz_alpha_inverse_x(A, x, y, R, beta):
    """|alpha(x)^-1 - alpha(y)^-1| <= 2 beta^-2 n R exp(R^2) ||x - y||_2, given alpha >= beta."""
    R = check_x_assumptions(A, x, y, R)
    alpha_x, alpha_y = alpha(A, x), alpha(A, y)
    beta = check_beta(beta, alpha_x, alpha_y)
    n = A.shape[-2]
    lhs = alpha_difference(logits(A, x), logits(A, y - x)).abs() / (alpha_x * alpha_y)
    return lhs, 2 * n * R * math.exp(R**2) / beta**2 * (x - y).norm(dim=-1)


def shift_bound_x(A, x_now, x_next, R, beta):
    """||delta_b||_2 <= 4 beta^-2 n^1.5 R exp(2 R^2) ||x_{t+1} - x_t||_2 (Sec. 5.2); also the
    Lipschitz bound of f in x."""
    R = check_x_assumptions(A, x_now, x_next, R)
    beta = check_beta(beta, alpha(A, x_now), alpha(A, x_next))
    n = A.shape[-2]
    lhs = shift_from_x(A, x_now, x_next).norm(dim=-1)
    return lhs, 4 * n**1.5 * R * math.exp(2 * R**2) / beta**2 * (x_next - x_now).norm(dim=-1)


def lipschitz_alpha_A(A, B, x, R):
    """|alpha(A) - alpha(B)| <= 2 n R exp(R^2) ||A - B|| (alpha(A) = <exp(A x), 1>, x fixed)."""
    R = check_A_assumptions(A, B, x, R)
    n = A.shape[-2]
    lhs = alpha_difference(logits(A, x), logits(B - A, x)).abs()
    return lhs, 2 * n * R * math.exp(R**2) * spectral_norm(A - B)


def lipschitz_alpha_inverse_A(A, B, x, R, beta):
    """|alpha(A)^-1 - alpha(B)^-1| <= 2 beta^-2 n R exp(R^2) ||A - B||, given alpha >= beta."""
    R = check_A_assumptions(A, B, x, R)
    alpha_A, alpha_B = alpha(A, x), alpha(B, x)
    beta = check_beta(beta, alpha_A, alpha_B)
    n = A.shape[-2]
    lhs = alpha_difference(logits(A, x), logits(B - A, x)).abs() / (alpha_A * alpha_B)
    return lhs, 2 * n * R * math.exp(R**2) / beta**2 * spectral_norm(A - B)


def lipschitz_exp_A(A, B, x, R):
    """||exp(Ax) - exp(Bx)||_2 <= 2 sqrt(n) R exp(R^2) ||A - B||."""
    R = check_A_assumptions(A, B, x, R)
    n = A.shape[-2]
    lhs = exp_difference(logits(A, x), logits(B - A, x)).norm(dim=-1)
    return lhs, 2 * math.sqrt(n) * R * math.exp(R**2) * spectral_norm(A - B)


def shift_bound_A(A_now, A_next, x, R, beta):
    """||delta_b||_2 <= (2 beta^-2 n^1.5 + 2 beta^-1 n^0.5) R exp(2 R^2) ||A_{t+1} - A_t|| (Sec. 7.1)."""
    R = check_A_assumptions(A_now, A_next, x, R)
    beta = check_beta(beta, alpha(A_now, x), alpha(A_next, x))
    n = A_now.shape[-2]
    lhs = shift_from_A(A_now, A_next, x).norm(dim=-1)
    constant = (2 * n**1.5 / beta**2 + 2 * n**0.5 / beta) * R * math.exp(2 * R**2)
    return lhs, constant * spectral_norm(A_next - A_now)


# --- the best constants: what each lemma's left side can reach (mean value theorem) ------------------
# For a and b in R, |e^a - e^b| <= e^max(a, b) |a - b|, with equality in the limit b -> a; and the
# softmax Jacobian diag(f) - f f^T has spectral norm at most 1/2. Each function returns (lhs, rhs)
# with the tightest rhs these facts give; the ratio can approach 1 and never exceed it.


def largest_exponent(u, step):
    """max_i max(u_i, u_i + step_i): the largest exponent on the segment from u to u + step."""
    return torch.maximum(u, u + step).amax(-1)


def tight_basic_fact(u, step, closeness=0.01):
    """||exp(u) - exp(u + step)||_2 <= e^closeness ||exp(u)||_2 ||step||_inf (the 2 of Sec. 3.2 is
    e^0.01 ~ 1.005 at best)."""
    require(torch.as_tensor(step.abs().amax(-1) <= closeness), f"assumption ||u - v||_inf <= {closeness} fails")
    return exp_difference(u, step).norm(dim=-1), math.exp(closeness) * torch.exp(u).norm(dim=-1) * step.abs().amax(-1)


def tight_exp(u, step):
    """||exp(u) - exp(u + step)||_2 <= e^max ||step||_2 (with step = A(y - x) or (B - A) x)."""
    return exp_difference(u, step).norm(dim=-1), torch.exp(largest_exponent(u, step)) * step.norm(dim=-1)


def tight_alpha(u, step):
    """|alpha(u) - alpha(u + step)| <= e^max ||step||_1."""
    return alpha_difference(u, step).abs(), torch.exp(largest_exponent(u, step)) * step.abs().sum(-1)


def tight_alpha_inverse(u, step):
    """|1/alpha(u) - 1/alpha(u + step)| = |alpha(u) - alpha(u + step)| / (alpha(u) alpha(u + step))
    <= e^max ||step||_1 / (alpha(u) alpha(u + step))."""
    lhs, rhs = tight_alpha(u, step)
    product = torch.exp(u).sum(-1) * torch.exp(u + step).sum(-1)
    return lhs / product, rhs / product


def tight_softmax(u, step):
    """||softmax(u) - softmax(u + step)||_2 <= ||step||_2 / 2 (Jacobian norm at most 1/2); with
    step = A(y - x) this gives ||f(x) - f(y)|| <= ||A|| ||x - y|| / 2."""
    return softmax_difference(u, step).norm(dim=-1), 0.5 * step.norm(dim=-1)


def M(n, R):
    """M = n^1.5 exp(10 R^2), the constant of the main theorem (Thm 1.4 / Sec. 8)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    R = check_radius(R)
    return n**1.5 * math.exp(10 * R**2)


def main_theorem_x(A, x_now, x_next, R):
    """Part 1: ||delta_b||_2 <= M ||x_{t+1} - x_t||_2, for R >= 4, ||A||, ||x_t||, ||x_{t+1}|| <= R,
    ||A(x_{t+1} - x_t)||_inf < 0.01."""
    R = check_radius(R, minimum=4.0)
    check_x_assumptions(A, x_now, x_next, R)
    return shift_from_x(A, x_now, x_next).norm(dim=-1), M(A.shape[-2], R) * (x_next - x_now).norm(dim=-1)


def main_theorem_A(A_now, A_next, x, R):
    """Part 2: ||delta_b||_2 <= M ||A_{t+1} - A_t|| under the A-side assumptions and R >= 4."""
    R = check_radius(R, minimum=4.0)
    check_A_assumptions(A_now, A_next, x, R)
    return shift_from_A(A_now, A_next, x).norm(dim=-1), M(A_now.shape[-2], R) * spectral_norm(A_next - A_now)


# --- the closeness experiment -----------------------------------------------------------------------


def weight_shift_experiment(A, x, b, *, lr_x, lr_A, steps):
    """Train by GD on x (A fixed) and, separately, by GD on A (x fixed, the attention view).

    Returns per-step lists: both losses, the predictions' distance ||f(A, x_t) - f(A_t, x)||, the
    norms of the cumulative induced shifts of b, and the cosine between the two cumulative shifts
    (f(x_0) - f(x_t) against f(A_0) - f(A_t)).
    """
    check_problem(A, x, b)
    if A.dim() != 2:
        raise ValueError("weight_shift_experiment takes one problem: A must be (n, d)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    x_t, A_t = x.clone(), A.clone()
    start = f(A, x)
    history = {key: [] for key in ("loss_x", "loss_A", "prediction_distance", "shift_x", "shift_A", "shift_cosine")}
    for _ in range(steps + 1):
        shift_x_total, shift_A_total = start - f(A, x_t), start - f(A_t, x)
        history["loss_x"].append(float(loss(A, x_t, b)))
        history["loss_A"].append(float(loss(A_t, x, b)))
        history["prediction_distance"].append(float((f(A, x_t) - f(A_t, x)).norm()))
        history["shift_x"].append(float(shift_x_total.norm()))
        history["shift_A"].append(float(shift_A_total.norm()))
        denominator = float(shift_x_total.norm() * shift_A_total.norm())
        history["shift_cosine"].append(float(shift_x_total @ shift_A_total) / denominator if denominator > 0 else 1.0)
        x_t = gd_step_x(A, x_t, b, lr_x)
        A_t = attention_step_A(A_t, x, b, lr_A)
    return history
