"""Theorem 3.2 (and C.2): a Rademacher bound for the dual model's one-step learning problem.

Chapters: generalization_bound.

Function class  F = { f(x) = W phi(W_K x) : ||W||_F <= w },  loss  l(f, x) = -(W_V x) . f(x)  (Eq. (10)),
L(f) = E l(f, x) over the task distribution, L_hat(f) its mean over N demonstrations, and the kernel
matrix (K_S)_ij = phi(W_K x_i) . phi(W_K x_j). With ||W_V x||, ||W phi(W_K x)|| <= rho, with probability
at least 1 - delta (explicit constants derived in the math specification, Section 7):

    uniform, Eq. (29):   L(f) <= L_hat(f) + 4 rho w sqrt(d_o Tr K_S) / N + 6 rho^2 sqrt(log(4/delta) / (2N))
    Theorem 3.2:         L(f_hat) <= L(f*) + 4 rho w sqrt(d_o Tr K_S) / N + 8 rho^2 sqrt(log(4/delta) / (2N))

The loss is linear in W: L_hat(f) = -<W, M_S>_F with M_S = 1/N sum_i (W_V x_i) phi(W_K x_i)^T, so the
constrained minimiser is f_hat: W = w M_S / ||M_S||_F, and likewise f*: W = w M / ||M||_F with
M = E[(W_V x) phi(W_K x)^T]. With K negatives per token (C.2) the label W_V x becomes
W_V x - mean_j W_V x_j^-, the loss range doubles, and the Lipschitz constant sqrt(2) rho of the
loss in (f(x), labels) becomes sqrt(5 + 1/K) rho.
"""

import math
from dataclasses import dataclass

import torch

from icl_lens import tasks
from icl_lens.device import generator as make_generator
from icl_lens.kernels import PositiveRandomFeatures, draw_omega
from icl_lens.validation import as_tensor, check_finite_number, check_open_unit, check_positive_float, check_positive_int


# --- the empirical problem ----------------------------------------------------------------------------


def features(demos, W_K, feature_map):
    """phi(W_K x_i) for the rows x_i of ``demos``: (..., N, d_r)."""
    as_tensor(demos, "demos")
    as_tensor(W_K, "W_K")
    if W_K.dim() != 2 or W_K.shape[1] != demos.shape[-1]:
        raise ValueError(f"W_K must be (d_o, {demos.shape[-1]}), got {tuple(W_K.shape)}")
    return feature_map(demos @ W_K.T)


def kernel_matrix(demos, W_K, feature_map):
    """(K_S)_ij = phi(W_K x_i) . phi(W_K x_j), shape (..., N, N)."""
    phi = features(demos, W_K, feature_map)
    return phi @ phi.transpose(-1, -2)


def moment_matrix(features_, labels):
    """M_S = 1/N sum_i y_i phi_i^T, shape (..., d_o, d_r): the empirical loss is -<W, M_S>_F."""
    return labels.transpose(-1, -2) @ features_ / features_.shape[-2]


def negative_labels(labels, negatives):
    """y_i - mean_j y_ij^- for labels (..., N, d_o) and negatives' labels (..., N, K, d_o) (C.2)."""
    return labels - negatives.mean(dim=-2)


def empirical_loss(W, features_, labels):
    """L_hat(f) = -1/N sum_i y_i . W phi_i for f = W phi (labels already negative-adjusted for C.2)."""
    return -(moment_matrix(features_, labels) * W).sum(dim=(-2, -1))


def erm_weight(features_, labels, w):
    """The minimiser of the empirical loss over ||W||_F <= w: w M_S / ||M_S||_F (a linear loss on a ball)."""
    w = check_positive_float(w, "w")
    M = moment_matrix(features_, labels)
    norm = torch.linalg.matrix_norm(M).clamp(min=torch.finfo(M.dtype).tiny)
    return w * M / norm[..., None, None]


@dataclass
class Population:
    """Moments of the task distribution, estimated once on many samples; L(f) = -<W, M>_F exactly."""

    M: torch.Tensor              # E[(W_V x) phi(W_K x)^T]
    mean_value: torch.Tensor     # E[W_V x]
    mean_feature: torch.Tensor   # E[phi(W_K x)]
    num_samples: int

    def loss(self, W, negatives=False):
        """L(f) (or, with negatives, L^-(f) = -<W, M - E[W_V x] E[phi]^T>, the negatives independent)."""
        M = self.M - torch.outer(self.mean_value, self.mean_feature) if negatives else self.M
        return -(M * W).sum(dim=(-2, -1))

    def optimal_weight(self, w, negatives=False):
        M = self.M - torch.outer(self.mean_value, self.mean_feature) if negatives else self.M
        return check_positive_float(w, "w") * M / torch.linalg.matrix_norm(M)


def estimate_population(sample, W_K, W_V, feature_map, num_samples, *, chunk=20_000):
    """Monte Carlo moments from ``sample(count)`` -> tokens (count, d); chunked to bound memory."""
    check_positive_int(num_samples, "num_samples")
    M = mean_value = mean_feature = 0.0
    remaining = num_samples
    while remaining > 0:
        size = min(chunk, remaining)
        x = sample(size)
        phi = features(x, W_K, feature_map)
        v = x @ W_V.T
        M = M + v.T @ phi
        mean_value = mean_value + v.sum(0)
        mean_feature = mean_feature + phi.sum(0)
        remaining -= size
    return Population(M / num_samples, mean_value / num_samples, mean_feature / num_samples, num_samples)


# --- rho: a bound on every prediction and label (used by make_bound_setting) ---------------------------


def max_feature_norm(omega, radius):
    """sup of ||phi(z)||_2 over ||z|| <= radius for positive random features with rows w_r of omega.

    ||phi(z)||^2 = 1/m sum_r exp(2 w_r . z - |z|^2) and max over ||z|| <= r of 2|w| s - s^2 (s = |z|
    aligned with w) is |w|^2 if |w| <= r, else 2 |w| r - r^2. Summing the per-feature maxima is an
    upper bound (each feature may peak at a different z).
    """
    radius = float(radius)
    if radius < 0:
        raise ValueError(f"radius must be non-negative, got {radius}")
    lengths = omega.norm(dim=1)
    exponent = torch.where(lengths <= radius, lengths**2, 2 * lengths * radius - radius**2)
    return float(torch.exp(exponent).mean().sqrt())


# --- the bound ----------------------------------------------------------------------------------------


@dataclass
class BoundTerms:
    """The right-hand sides of Eq. (29) (uniform) and Theorem 3.2 (excess risk), term by term."""

    empirical_loss: float
    rademacher: float           # 2 * Lipschitz * sqrt(2) * (w / N) sqrt(d_o Tr K_S)
    confidence_uniform: float   # 3 * (loss range) * sqrt(log(4/delta) / (2N))
    confidence_excess: float    # (3 + 1) * (loss range) * sqrt(log(4/delta) / (2N))
    trace: float

    @property
    def uniform(self):
        """Upper bound on L(f) for every f in F: L_hat(f) + rademacher + confidence_uniform."""
        return self.empirical_loss + self.rademacher + self.confidence_uniform

    @property
    def excess(self):
        """Upper bound on L(f_hat) - L(f*) (Theorem 3.2)."""
        return self.rademacher + self.confidence_excess


def check_kernel_matrix(K_S, N, tolerance=1e-10):
    as_tensor(K_S, "K_S")
    if K_S.dim() != 2 or K_S.shape[0] != K_S.shape[1]:
        raise ValueError(f"K_S must be a square matrix, got shape {tuple(K_S.shape)}")
    if K_S.shape[0] != N:
        raise ValueError(f"K_S is {K_S.shape[0]} x {K_S.shape[0]} but N = {N}")
    scale = float(K_S.abs().max()) or 1.0
    if float((K_S - K_S.T).abs().max()) > tolerance * scale:
        raise ValueError("K_S must be symmetric")
    if float(torch.linalg.eigvalsh(K_S).min()) < -tolerance * scale:
        raise ValueError("K_S must be positive semi-definite (an eigenvalue is negative beyond tolerance)")


def generalization_bound(K_S, rho, w, delta, N, *, output_dim, empirical_loss=0.0, negatives=None):
    """Theorem 3.2 (``negatives=None``) or C.2 (``negatives=K``), each term separately.

    ``output_dim`` is d_o, the dimension of W_V x; ``empirical_loss`` is L_hat(f) for the uniform form.
    K_S enters only through its trace; it is checked to be a square PSD matrix of size N.
    """
    N = check_positive_int(N, "N")
    check_kernel_matrix(K_S, N)
    return bound_from_trace(float(torch.trace(K_S)), rho, w, delta, N, output_dim=output_dim,
                            empirical_loss=empirical_loss, negatives=negatives)


def bound_from_trace(trace, rho, w, delta, N, *, output_dim, empirical_loss=0.0, negatives=None):
    """The same terms as :func:`generalization_bound`, from Tr(K_S) = sum_i ||phi(W_K x_i)||^2."""
    N = check_positive_int(N, "N")
    rho = check_positive_float(rho, "rho")
    w = check_positive_float(w, "w")
    delta = float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    check_positive_int(output_dim, "output_dim")
    if trace < 0:
        raise ValueError(f"the trace of K_S must be non-negative, got {trace}")
    rademacher_class = w / N * math.sqrt(output_dim * trace)
    if negatives is None:
        lipschitz, loss_range = math.sqrt(2) * rho, 2 * rho**2
    else:
        check_positive_int(negatives, "negatives")
        lipschitz, loss_range = math.sqrt(5 + 1 / negatives) * rho, 4 * rho**2
    root = math.sqrt(math.log(4 / delta) / (2 * N))
    return BoundTerms(
        empirical_loss=float(empirical_loss),
        rademacher=2 * math.sqrt(2) * lipschitz * rademacher_class,
        confidence_uniform=3 * loss_range * root,
        confidence_excess=4 * loss_range * root,
        trace=float(trace),
    )


def violations(measured, bounds):
    """Indices where a measured quantity exceeds its bound: the checker the book and tests assert on."""
    measured = torch.as_tensor(measured, dtype=torch.float64)
    bounds = torch.as_tensor(bounds, dtype=torch.float64)
    if measured.shape != bounds.shape:
        raise ValueError(f"measured {tuple(measured.shape)} and bounds {tuple(bounds.shape)} differ in shape")
    return torch.nonzero(measured > bounds).flatten().tolist()


def rademacher_samples(features_, w, output_dim, draws, *, generator=None):
    """``draws`` samples of (w/N) || sum_i eps_i phi_i^T ||_F, eps_i uniform in {-1, 1}^d_o; their
    mean estimates the class's empirical Rademacher complexity (Step 3 of Theorem 3.2)."""
    check_positive_int(draws, "draws")
    N = features_.shape[0]
    source = generator.device if generator is not None else torch.device("cpu")
    signs = torch.randint(0, 2, (draws, N, output_dim), generator=generator, device=source).to(features_) * 2 - 1
    sums = signs.transpose(-1, -2) @ features_
    return w / N * torch.linalg.matrix_norm(sums)


def rademacher_monte_carlo(features_, w, output_dim, draws, *, generator=None):
    """Estimate of (w/N) E || sum_i eps_i phi_i^T ||_F with eps_i uniform in {-1, 1}^d_o (the class part)."""
    return float(rademacher_samples(features_, w, output_dim, draws, generator=generator).mean())


def loss_gradient_norm(u, negatives=None):
    """|grad h(u)| for the loss of Theorem 3.2, h(u) = -<u_1, u_2> (u = [u_1; u_2], blocks of size d),
    or of C.2, h(u) = -(1/K) sum_j <u_1, u_2 - u_{j+2}> (``negatives`` = K, K + 2 blocks). Batched
    over leading dimensions of u (..., blocks, d)."""
    u1, u2 = u[..., 0, :], u[..., 1, :]
    if negatives is None:
        return torch.sqrt((u1 * u1).sum(-1) + (u2 * u2).sum(-1))
    mean_negative = u[..., 2:, :].mean(-2)
    squared = ((u2 - mean_negative) ** 2).sum(-1) + (u1 * u1).sum(-1) + (u1 * u1).sum(-1) / negatives
    return torch.sqrt(squared)


def lipschitz_search(rho, dim, *, negatives=None, samples=20_000, ascent_steps=1000, generator=None):
    """The largest |grad h| found on the product of rho-balls, over the constant the proof uses
    (sqrt(2) rho, or sqrt(5 + 1/K) rho with K negatives): random points, then projected gradient
    ascent from the best of them. A ratio near 1 means the constant is attained; above 1, wrong.

    On a convex set the Lipschitz constant of a smooth h is the largest gradient norm, so this is a
    search for the worst ratio |h(u) - h(v)| / |u - v| in the limit v -> u."""
    blocks = 2 if negatives is None else negatives + 2
    constant = (math.sqrt(2) if negatives is None else math.sqrt(5 + 1 / negatives)) * rho
    u = torch.randn(samples, blocks, dim, generator=generator, dtype=torch.float64)
    radius = rho * torch.rand(samples, blocks, 1, generator=generator, dtype=torch.float64) ** (1 / dim)
    u = radius * u / u.norm(dim=-1, keepdim=True)
    best = u[loss_gradient_norm(u, negatives).argmax()].clone().requires_grad_(True)
    for _ in range(ascent_steps):
        (gradient,) = torch.autograd.grad(loss_gradient_norm(best, negatives), best)
        with torch.no_grad():
            best += 0.05 * rho * gradient
            best *= torch.clamp(rho / best.norm(dim=-1, keepdim=True), max=1.0)   # back onto the balls
    found = max(float(loss_gradient_norm(u, negatives).max()), float(loss_gradient_norm(best.detach(), negatives)))
    return found / constant


def hoeffding_tail(N, t, rho):
    """Exact P(mean of N losses - their expectation >= t) for losses equal to +rho^2 or -rho^2 with
    probability 1/2 each: the worst case for Hoeffding's inequality on [-rho^2, rho^2], by a
    binomial sum (float64, log-space)."""
    check_positive_int(N, "N")
    rho = check_positive_float(rho, "rho")
    t = check_finite_number(t, "t")
    k = torch.arange(N + 1, dtype=torch.float64)
    log_probabilities = (torch.lgamma(torch.tensor(N + 1.0, dtype=torch.float64)) - torch.lgamma(k + 1)
                         - torch.lgamma(N - k + 1) - N * math.log(2))
    means = rho**2 * (2 * k - N) / N
    chosen = log_probabilities[means >= t - 1e-12]
    return float(torch.logsumexp(chosen, 0).exp()) if chosen.numel() else 0.0


def hoeffding_deviation(N, delta, rho):
    """t with P(mean - expectation >= t) <= delta for losses in [-rho^2, rho^2] (range 2 rho^2):
    Hoeffding gives t = 2 rho^2 sqrt(log(1/delta) / (2N))."""
    check_positive_int(N, "N")
    check_open_unit(delta, "delta")
    rho = check_positive_float(rho, "rho")
    return 2 * rho**2 * math.sqrt(math.log(1 / delta) / (2 * N))


# --- the experiment: measured gaps against the bound ---------------------------------------------------


@dataclass(frozen=True)
class BoundExperimentConfig:
    """Gap of the dual step's ERM against N, on tokens of the paper's linear task (d = 12).

    W_K and W_V are random, rescaled so that ||W_K x||, ||W_V x|| <= 1 for every token of the task's
    support; w is then chosen so that ||W phi(W_K x)|| <= 1 too. This makes rho = 1 a proven bound
    rather than an estimate, so the check is of the theorem itself.
    """

    sample_sizes: tuple = (4, 8, 16, 32, 64, 128, 256, 512)
    draws: int = 100
    num_features: int = 1200
    population_samples: int = 200_000
    delta: float = 0.05
    negatives: tuple = (1, 4, 16)
    seed: int = 0

    def __post_init__(self):
        for size in self.sample_sizes:
            check_positive_int(size, "sample_sizes")
        check_positive_int(self.draws, "draws")
        check_positive_int(self.num_features, "num_features")
        check_positive_int(self.population_samples, "population_samples")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        for count in self.negatives:
            check_positive_int(count, "negatives")


@dataclass
class BoundSetting:
    sample: object           # count -> tokens (count, d)
    W_K: torch.Tensor
    W_V: torch.Tensor
    feature_map: object
    w: float
    value_sup: float         # sup ||W_V x|| over the support
    feature_sup: float       # sup ||phi(W_K x)|| over the support
    population: Population

    @property
    def rho(self):
        return max(self.value_sup, self.w * self.feature_sup)


def make_bound_setting(config, generator):
    task = tasks.RegressionTask.linear()
    d = task.token_dim
    weight = tasks.sample_task_weight(task, generator=generator)
    # every token has |t_k| <= 1 and |s| <= sum_k |w_k|
    token_radius = math.sqrt(task.input_dim + float(weight.abs().sum()) ** 2)
    W_K, W_V = (torch.randn(d, d, generator=generator, dtype=torch.float64) for _ in range(2))
    W_K = W_K / (float(torch.linalg.matrix_norm(W_K, ord=2)) * token_radius)
    W_V = W_V / (float(torch.linalg.matrix_norm(W_V, ord=2)) * token_radius)
    omega = draw_omega(d, config.num_features, generator=generator)
    value_sup = float(torch.linalg.matrix_norm(W_V, ord=2)) * token_radius
    feature_sup = max_feature_norm(omega, float(torch.linalg.matrix_norm(W_K, ord=2)) * token_radius)

    def sample(count):
        t = task.input_low + (task.input_high - task.input_low) * torch.rand(
            count, task.input_dim, generator=generator, dtype=torch.float64)
        return torch.cat([t, t @ weight.T], dim=-1)

    feature_map = PositiveRandomFeatures(omega)
    population = estimate_population(sample, W_K, W_V, feature_map, config.population_samples)
    return BoundSetting(sample, W_K, W_V, feature_map, 1.0 / feature_sup, value_sup, feature_sup, population)


def bound_experiment(config, *, negatives=None, setting=None, generator=None):
    """For each N: per draw, the measured gap L(f_hat) - L_hat(f_hat), the excess risk
    L(f_hat) - L(f*), and the two bounds (uniform: Rademacher + confidence; excess: Theorem 3.2).
    With ``negatives=K`` the same for the C.2 loss with K negatives per token.
    """
    generator = generator if generator is not None else make_generator(config.seed)
    setting = setting if setting is not None else make_bound_setting(config, generator)
    d_o = setting.W_V.shape[0]
    with_negatives = negatives is not None
    optimum_loss = float(setting.population.loss(setting.population.optimal_weight(setting.w, with_negatives), with_negatives))
    result = {"sample_sizes": list(config.sample_sizes), "w": setting.w, "rho": setting.rho, "negatives": negatives,
              "value_sup": setting.value_sup, "feature_sup": setting.feature_sup, "output_dim": d_o, "delta": config.delta,
              "gap": [], "excess": [], "gap_bound": [], "excess_bound": [], "rademacher": [], "confidence": [],
              "trace": []}
    for N in config.sample_sizes:
        tokens = setting.sample(config.draws * N).reshape(config.draws, N, -1)
        phi = features(tokens, setting.W_K, setting.feature_map)
        labels = tokens @ setting.W_V.T
        if with_negatives:
            others = setting.sample(config.draws * N * negatives).reshape(config.draws, N, negatives, -1)
            labels = negative_labels(labels, others @ setting.W_V.T)
        W_hat = erm_weight(phi, labels, setting.w)
        empirical = empirical_loss(W_hat, phi, labels)
        true = setting.population.loss(W_hat, with_negatives)
        gaps, excess, gap_bounds, excess_bounds, rademacher, confidence, traces = [], [], [], [], [], [], []
        for draw in range(config.draws):
            terms = generalization_bound(
                phi[draw] @ phi[draw].T, setting.rho, setting.w, config.delta, N, output_dim=d_o,
                empirical_loss=float(empirical[draw]), negatives=negatives,
            )
            gaps.append(float(true[draw] - empirical[draw]))
            excess.append(float(true[draw]) - optimum_loss)
            gap_bounds.append(terms.rademacher + terms.confidence_uniform)
            excess_bounds.append(terms.excess)
            rademacher.append(terms.rademacher)
            confidence.append(terms.confidence_uniform)
            traces.append(terms.trace)
        for key, values in zip(("gap", "excess", "gap_bound", "excess_bound", "rademacher", "confidence", "trace"),
                               (gaps, excess, gap_bounds, excess_bounds, rademacher, confidence, traces)):
            result[key].append(values)
    return result


def rescaled(result, w_scale, delta):
    """The experiment's curves for the radius w_scale * w and confidence delta, without re-sampling.

    f_hat scales with w and the loss is linear, so gaps and excess risks scale by w_scale exactly;
    rho becomes max(sup ||W_V x||, w sup ||phi||); the bounds are recomputed from the stored traces.
    """
    w = result["w"] * check_positive_float(w_scale, "w_scale")
    rho = max(result["value_sup"], w * result["feature_sup"])
    curves = {"gap": [], "excess": [], "gap_bound": [], "excess_bound": []}
    for N, gaps, excess, traces in zip(result["sample_sizes"], result["gap"], result["excess"], result["trace"]):
        terms = [bound_from_trace(t, rho, w, delta, N, output_dim=result["output_dim"], negatives=result["negatives"])
                 for t in traces]
        curves["gap"].append([g * w_scale for g in gaps])
        curves["excess"].append([e * w_scale for e in excess])
        curves["gap_bound"].append([t.rademacher + t.confidence_uniform for t in terms])
        curves["excess_bound"].append([t.excess for t in terms])
    return {**result, **curves, "w": w, "rho": rho, "delta": delta}
