"""Training-free in-context predictors: the baselines every trained layer is measured against.

Chapters: experiments, across_tasks.

All functions are batched over leading dimensions: ``x_context`` (..., N, d), ``y_context`` (..., N),
``x_query`` (..., d); predictions have shape (...). Closed forms (derived in the experiments chapter):

    zero             y_hat = 0
    context mean     y_hat = (1/N) sum_i y_i                                  (uniform attention)
    Nadaraya-Watson  y_hat = sum_i softmax_i(-|x_q - x_i|^2 / tau) y_i         (softmax attention on
                                                                             the raw inputs)
    one GD step      w_1 = (lr / N) sum_i y_i x_i,   y_hat = w_1 . x_q        (from w = 0, on
                                                                             (1/2N) sum_i (w.x_i - y_i)^2)
    best GD step     lr* = sum_p g_p y_p / sum_p g_p^2,  g_p = (1/N) sum_i y_i x_i . x_q  (prediction
                                                                             linear in lr: least squares)
    least squares    w = argmin |X w - y|^2 (+ ridge |w|^2), min-norm when N < d; y_hat = w . x_q
"""

import torch

from icl_lens.validation import as_tensor, check_finite_number, check_positive_float


def check_prompts(x_context, y_context, x_query):
    """Shapes (..., N, d), (..., N), (..., d) with matching leading dimensions; a ValueError names the
    argument that does not fit."""
    x_context, y_context, x_query = (as_tensor(v, n) for v, n in ((x_context, "x_context"),
                                                                   (y_context, "y_context"), (x_query, "x_query")))
    if x_context.dim() < 2:
        raise ValueError(f"x_context must be (..., N, d), got shape {tuple(x_context.shape)}")
    if tuple(y_context.shape) != tuple(x_context.shape[:-1]):
        raise ValueError(f"y_context must be (..., N) = {tuple(x_context.shape[:-1])}, got {tuple(y_context.shape)}")
    expected = (*x_context.shape[:-2], x_context.shape[-1])
    if tuple(x_query.shape) != expected:
        raise ValueError(f"x_query must be (..., d) = {expected}, got {tuple(x_query.shape)}")
    return x_context, y_context, x_query


def zero(x_context, y_context, x_query):
    """Predict 0 for every prompt."""
    x_context, y_context, x_query = check_prompts(x_context, y_context, x_query)
    return torch.zeros(x_query.shape[:-1], dtype=y_context.dtype, device=y_context.device)


def context_mean(x_context, y_context, x_query):
    """The mean of the prompt's labels: what attention with uniform weights predicts."""
    x_context, y_context, x_query = check_prompts(x_context, y_context, x_query)
    return y_context.mean(-1)


def nadaraya_watson(x_context, y_context, x_query, temperature):
    """Softmax attention on the raw inputs with a Gaussian kernel: weights
    softmax_i(-|x_q - x_i|^2 / temperature). Large temperatures give the context mean."""
    x_context, y_context, x_query = check_prompts(x_context, y_context, x_query)
    check_positive_float(temperature, "temperature")
    distances = ((x_context - x_query.unsqueeze(-2)) ** 2).sum(-1)
    return (torch.softmax(-distances / temperature, dim=-1) * y_context).sum(-1)


def best_temperature(x_context, y_context, x_query, y_query, temperatures):
    """The temperature of ``temperatures`` whose Nadaraya-Watson predictions have the lowest mean
    squared error over the given prompts (choose it on training prompts, not on the test set)."""
    errors = [float(((nadaraya_watson(x_context, y_context, x_query, t) - y_query) ** 2).mean()) for t in temperatures]
    return temperatures[min(range(len(errors)), key=errors.__getitem__)]


def one_step_gd(x_context, y_context, x_query, lr):
    """One gradient step from w = 0 on (1/2N) sum_i (w . x_i - y_i)^2, then predict w . x_q:
    w_1 = (lr / N) sum_i y_i x_i."""
    x_context, y_context, x_query = check_prompts(x_context, y_context, x_query)
    check_finite_number(lr, "lr")
    return lr * gradient_direction(x_context, y_context, x_query)


def gradient_direction(x_context, y_context, x_query):
    """g = (1/N) sum_i y_i x_i . x_q: the prediction of one GD step per unit learning rate."""
    weight = (y_context.unsqueeze(-1) * x_context).mean(-2)
    return (weight * x_query).sum(-1)


def optimal_one_step_lr(x_context, y_context, x_query, y_query):
    """The learning rate minimising sum_p (lr g_p - y_p)^2 over the given prompts: the one-step
    prediction is lr g_p, linear in lr, so lr* = sum g y / sum g^2 (a least-squares slope)."""
    x_context, y_context, x_query = check_prompts(x_context, y_context, x_query)
    y_query = as_tensor(y_query, "y_query")
    if tuple(y_query.shape) != tuple(x_query.shape[:-1]):
        raise ValueError(f"y_query must be (...) = {tuple(x_query.shape[:-1])}, got {tuple(y_query.shape)}")
    g = gradient_direction(x_context, y_context, x_query)
    return float((g * y_query).sum() / (g * g).sum())


def least_squares(x_context, y_context, x_query, ridge=0.0, *, intercept=False):
    """Least squares (ridge > 0: ridge regression) on the prompt, predicting w . x_q (+ b with
    ``intercept``). With ridge = 0 it is the minimum-norm solution, which fits the context exactly
    when N <= d; the intercept, when asked for, is a column of ones and is regularised too."""
    x_context, y_context, x_query = check_prompts(x_context, y_context, x_query)
    if check_finite_number(ridge, "ridge") < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    if intercept:
        x_context = torch.cat([x_context, torch.ones_like(x_context[..., :1])], dim=-1)
        x_query = torch.cat([x_query, torch.ones_like(x_query[..., :1])], dim=-1)
    if ridge == 0:
        weight = (torch.linalg.pinv(x_context) @ y_context.unsqueeze(-1)).squeeze(-1)
    else:
        gram = x_context.transpose(-1, -2) @ x_context
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        weight = torch.linalg.solve(gram + ridge * eye, (x_context.transpose(-1, -2) @ y_context.unsqueeze(-1))).squeeze(-1)
    return (weight * x_query).sum(-1)
