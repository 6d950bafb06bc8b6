"""Searches for counterexamples to inequalities: random sampling, then gradient ascent on lhs / rhs.

Chapters: lipschitz_lemmas, weight_shifting.

An inequality lhs <= rhs is given as a function of a setting (a dict of tensors) that returns
(lhs, rhs). A sampler draws settings that satisfy the inequality's assumptions; ``search`` reports the
largest ratio found. A ratio above 1 is a counterexample. ``rhs_scale`` shrinks the right-hand side,
so a test can show that the search does find violations when a constant is made too small.
"""

from dataclasses import dataclass

import torch

from icl_lens import softmax_regression as sr


@dataclass
class SearchResult:
    max_ratio: float
    trials: int
    worst: dict   # the setting with the largest ratio (tensors on the cpu)

    def __repr__(self):
        return f"SearchResult(max_ratio={self.max_ratio:.4g}, trials={self.trials})"


def _random_matrix_with_norm_at_most(batch, n, d, R, generator):
    A = torch.randn(batch, n, d, generator=generator, dtype=torch.float64)
    target = R * torch.rand(batch, 1, 1, generator=generator, dtype=torch.float64).clamp(min=0.05)
    return A * target / sr.spectral_norm(A)[:, None, None]


def _random_vector_with_norm_at_most(batch, d, R, generator, upper=1.0):
    x = torch.randn(batch, d, generator=generator, dtype=torch.float64)
    target = R * upper * torch.rand(batch, 1, generator=generator, dtype=torch.float64)
    return x * target / x.norm(dim=-1, keepdim=True)


def sample_x_setting(batch, n, d, R, generator, closeness=0.01):
    """A with ||A|| <= R; x, y with ||x||, ||y|| <= R and ||A(y - x)||_inf < closeness."""
    A = _random_matrix_with_norm_at_most(batch, n, d, R, generator)
    x = _random_vector_with_norm_at_most(batch, d, R, generator, upper=0.999)
    direction = torch.randn(batch, d, generator=generator, dtype=torch.float64)
    reach = sr.logits(A, direction).abs().amax(-1, keepdim=True)
    # log-uniform step size, from tiny to the edge of the closeness assumption
    fraction = 10 ** (-4 * torch.rand(batch, 1, generator=generator, dtype=torch.float64))
    y = x + 0.999 * closeness * fraction * direction / reach
    y = y * (R / y.norm(dim=-1, keepdim=True)).clamp(max=1.0)
    keep = sr.logits(A, y - x).abs().amax(-1) < closeness
    return {"A": A[keep], "x": x[keep], "y": y[keep], "R": R}


def sample_A_setting(batch, n, d, R, generator, closeness=0.01):
    """A, B with ||A||, ||B|| <= R; x with ||x|| <= R; ||(A - B) x||_inf < closeness."""
    A = _random_matrix_with_norm_at_most(batch, n, d, R * 0.999, generator)
    x = _random_vector_with_norm_at_most(batch, d, R, generator)
    E = torch.randn(batch, n, d, generator=generator, dtype=torch.float64)
    reach = sr.logits(E, x).abs().amax(-1)[:, None, None].clamp(min=1e-300)
    fraction = 10 ** (-4 * torch.rand(batch, 1, 1, generator=generator, dtype=torch.float64))
    B = A + 0.999 * closeness * fraction * E / reach
    B = B * (R / sr.spectral_norm(B))[:, None, None].clamp(max=1.0)
    keep = (sr.logits(A - B, x).abs().amax(-1) < closeness) & (sr.spectral_norm(A - B) > 0)
    return {"A": A[keep], "B": B[keep], "x": x[keep], "R": R}


def _ratios(inequality, setting, rhs_scale):
    lhs, rhs = inequality(setting)
    return lhs / (rhs_scale * rhs)


def _select(setting, index):
    return {key: (value[index].detach().clone() if isinstance(value, torch.Tensor) else value) for key, value in setting.items()}


def random_search(inequality, sampler, *, sizes, radii, batch, generator, rhs_scale=1.0):
    """Largest lhs / rhs over ``batch`` draws for every (n, d) in ``sizes`` and R in ``radii``."""
    best, best_setting, trials = -1.0, None, 0
    for n, d in sizes:
        for R in radii:
            setting = sampler(batch, n, d, R, generator)
            if len(setting["x"]) == 0:
                continue
            ratios = _ratios(inequality, setting, rhs_scale)
            trials += len(ratios)
            top = int(torch.argmax(ratios))
            if float(ratios[top]) > best:
                best, best_setting = float(ratios[top]), _select(setting, top)
    return SearchResult(best, trials, best_setting)


def adversarial_search(inequality, start, *, steps=200, lr=0.02, rhs_scale=1.0, free=("x", "y")):
    """Gradient ascent on log(lhs / rhs) from the setting ``start``, keeping the assumptions.

    After each step the free tensors are pulled back into the assumption set (norms clipped to R, a
    step that breaks closeness is undone), so every ratio reported is for a valid setting.
    """
    setting = {key: (value.unsqueeze(0).clone() if isinstance(value, torch.Tensor) else value) for key, value in start.items()}
    best = float(_ratios(inequality, setting, rhs_scale)[0])
    best_setting = _select(setting, 0)
    for _ in range(steps):
        for key in free:
            setting[key].requires_grad_(True)
        ratio = _ratios(inequality, setting, rhs_scale)
        torch.log(ratio).sum().backward()
        with torch.no_grad():
            candidate = dict(setting)
            for key in free:
                gradient = setting[key].grad
                step = lr * gradient / gradient.norm().clamp(min=1e-300) * setting[key].norm().clamp(min=1e-3)
                candidate[key] = project(key, setting[key] + step, setting)
            try:
                value = float(_ratios(inequality, candidate, rhs_scale)[0])
            except ValueError:      # the step left the assumption set: halve the step size
                lr /= 2
                setting = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in setting.items()}
                continue
            setting = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in candidate.items()}
            if value > best:
                best, best_setting = value, _select(setting, 0)
    return SearchResult(best, steps, best_setting)


def project(key, value, setting):
    """Pull a tensor back to norm <= R (spectral for matrices, Euclidean for vectors)."""
    R = setting["R"]
    if value.dim() == 3:
        return value * (R / sr.spectral_norm(value))[:, None, None].clamp(max=1.0)
    return value * (R / value.norm(dim=-1, keepdim=True)).clamp(max=1.0)


def search(inequality, sampler, *, sizes, radii, batch, generator, rhs_scale=1.0, adversarial_starts=3,
           steps=150, free=("x", "y")):
    """Random search, then gradient ascent from the best random settings; the largest ratio of both."""
    found = random_search(inequality, sampler, sizes=sizes, radii=radii, batch=batch, generator=generator, rhs_scale=rhs_scale)
    results = [found]
    starts = [found.worst]
    # more starts: the best of a few further random draws at other sizes
    for n, d in sizes[: adversarial_starts - 1]:
        extra = random_search(inequality, sampler, sizes=[(n, d)], radii=radii, batch=batch, generator=generator, rhs_scale=rhs_scale)
        starts.append(extra.worst)
    for start in starts:
        if start is not None:
            results.append(adversarial_search(inequality, start, steps=steps, rhs_scale=rhs_scale, free=free))
    best = max(results, key=lambda result: result.max_ratio)
    return SearchResult(best.max_ratio, sum(result.trials for result in results), best.worst)


# --- the paper's inequalities as functions of a setting --------------------------------------------

def basic_fact_inequality(closeness=0.01):
    def inequality(setting):
        A, x, y = setting["A"], setting["x"], setting["y"]
        return sr.basic_fact(sr.logits(A, x), sr.logits(A, y), closeness, step=sr.logits(A, y - x))
    return inequality


def tight(form, side="x", **options):
    """The inequality of a best constant (``sr.tight_*``) on an x-side setting (u = A x, step =
    A (y - x)) or an A-side one (u = A x, step = (B - A) x)."""
    def inequality(setting):
        A, x = setting["A"], setting["x"]
        step = sr.logits(A, setting["y"] - x) if side == "x" else sr.logits(setting["B"] - A, x)
        return form(sr.logits(A, x), step, **options)
    return inequality


def exp_x(setting):
    return sr.lipschitz_exp_x(setting["A"], setting["x"], setting["y"], setting["R"])


def alpha_x(setting):
    return sr.lipschitz_alpha_x(setting["A"], setting["x"], setting["y"], setting["R"])


def smallest_alpha(A, *vectors):
    """beta = min over the given points of alpha: the tightest value the lemmas allow."""
    return torch.stack([sr.alpha(A, v) for v in vectors]).amin(0)


def alpha_inverse_x(setting):
    A, x, y = setting["A"], setting["x"], setting["y"]
    return sr.lipschitz_alpha_inverse_x(A, x, y, setting["R"], smallest_alpha(A, x, y))


def shift_x(setting):
    A, x, y = setting["A"], setting["x"], setting["y"]
    return sr.shift_bound_x(A, x, y, setting["R"], smallest_alpha(A, x, y))


def shift_x_versus_M(setting):
    A, x, y, R = setting["A"], setting["x"], setting["y"], setting["R"]
    sr.check_x_assumptions(A, x, y, R)
    return sr.shift_from_x(A, x, y).norm(dim=-1), sr.M(A.shape[-2], R) * (y - x).norm(dim=-1)


def exp_A(setting):
    return sr.lipschitz_exp_A(setting["A"], setting["B"], setting["x"], setting["R"])


def alpha_A(setting):
    return sr.lipschitz_alpha_A(setting["A"], setting["B"], setting["x"], setting["R"])


def alpha_inverse_A(setting):
    A, B, x = setting["A"], setting["B"], setting["x"]
    return sr.lipschitz_alpha_inverse_A(A, B, x, setting["R"], torch.minimum(sr.alpha(A, x), sr.alpha(B, x)))


def shift_A(setting):
    A, B, x = setting["A"], setting["B"], setting["x"]
    beta = torch.minimum(sr.alpha(A, x), sr.alpha(B, x))
    return sr.shift_bound_A(A, B, x, setting["R"], beta)


def shift_A_versus_M(setting):
    A, B, x, R = setting["A"], setting["B"], setting["x"], setting["R"]
    sr.check_A_assumptions(A, B, x, R)
    return sr.shift_from_A(A, B, x).norm(dim=-1), sr.M(A.shape[-2], R) * sr.spectral_norm(B - A)
