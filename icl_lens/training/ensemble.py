"""Trainable self-attention layers with the modifications of Section 4 / Appendix D, many at once.

Chapters: modifications, experiments, transformer_layer.

The paper trains one self-attention layer per setting (Section 5): Performer positive random features
with d_r = 100 (d_t + d_s), or exact softmax. Each modification is a per-model switch with a neutral
value, so models that differ in alpha, k, beta or augmentation share one set of tensors:

    alpha        regularized attention (Eq. (12), D.1): the query's own score scaled by (1 - alpha)
                 (alpha_form "proportional", the form the loss gives) or lowered by alpha ("constant",
                 A - alpha I, the reading of Lemma D.1), then, unless renormalise=False, the scores
                 renormalised to sum to one (the self-attention version); 0 = off
    value_map    g1 on the values W_V x (Eq. (14), D.2): "none", "gelu" (sigma(W x + b), one layer),
                 "mlp-gelu" or "mlp-elu" (two layers, the g^+ of Appendix E)
    key_map      g2 on the keys W_K x, same choices
    negative_k,  negative samples (Eq. (15), D.3): each demonstration x_i becomes
    beta         x_i - beta mean_{j in N(i)} x_j, N(i) its k lowest-attention tokens; k = 0 = off
    ridge        the ridge / mesa layer of Eq. (33) (unnormalised kernel ridge regression); 0 = off

An :class:`AttentionEnsemble` holds M such layers as stacked weights, shape (M, ...), and maps tokens
(M, B, n, d) to the output of each sequence's last token (the query), (M, B, d). Summing the models'
losses and stepping with per-model learning rates is exactly M independent SGD runs: no weight is
shared, so each model's gradient is its own loss's gradient (:func:`icl_lens.training.loop.train`).

Temperature: q and k are multiplied by d**-1/4 each before the feature map, so exp(q' . k') is the
paper's exp(q . k / sqrt(d_o)) (as in :mod:`icl_lens.attention`); ``LayerConfig(temperature=False)``
leaves them unscaled.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from icl_lens.attention import kernel_attention
from icl_lens.device import generator as make_generator
from icl_lens.device import pick
from icl_lens.dual import dual_model, transformer_layer_dual
from icl_lens.kernels import PositiveRandomFeatures, positive_random_features
from icl_lens.tasks import sample_sequences
from icl_lens.validation import as_tensor, check_positive_int

MAP_KINDS = ("none", "gelu", "mlp-gelu", "mlp-elu")
ALPHA_FORMS = ("proportional", "constant")
# how far below its row's largest a random-feature exponent is raised in the evaluation passes
# (floored_logsumexp_); None leaves the exponents as they are
EXPONENT_FLOOR = 80.0


@dataclass(frozen=True)
class Modification:
    """The switches of one model; the defaults are the plain ("normal") layer."""

    alpha: float = 0.0
    value_map: str = "none"
    key_map: str = "none"
    negative_k: int = 0
    beta: float = 0.0
    ridge: float = 0.0
    alpha_form: str = "proportional"      # or "constant": the two readings of the regularized form
    renormalise: bool = True              # regularized scores renormalised to sum to one

    def __post_init__(self):
        for name in ("value_map", "key_map"):
            if getattr(self, name) not in MAP_KINDS:
                raise ValueError(f"{name} must be one of {MAP_KINDS}, got {getattr(self, name)!r}")
        for name in ("alpha", "beta", "ridge"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if not isinstance(self.negative_k, int) or self.negative_k < 0:
            raise ValueError(f"negative_k must be a non-negative int, got {self.negative_k!r}")
        if self.ridge < 0:
            raise ValueError(f"ridge must be >= 0, got {self.ridge}")
        if self.alpha_form not in ALPHA_FORMS:
            raise ValueError(f"alpha_form must be one of {ALPHA_FORMS}, got {self.alpha_form!r}")
        if self.renormalise and self.alpha and (self.alpha >= 1 if self.alpha_form == "proportional" else self.alpha == 1):
            # the renormalising sum 1 - alpha a_jj (or 1 - alpha) can reach zero
            raise ValueError(f"alpha={self.alpha} with alpha_form={self.alpha_form!r} and renormalise=True can "
                             "divide by zero; use alpha < 1 (proportional), alpha != 1 (constant) or renormalise=False")

    @property
    def name(self):
        """A short label for legends: 'normal', 'alpha=0.1', 'g1=gelu', 'k=3 beta=0.1', joined by ' + '."""
        parts = []
        if self.alpha:
            form = {"proportional": "", "constant": " const"}[self.alpha_form]
            parts.append(f"alpha={self.alpha:.3g}{form}{'' if self.renormalise else ' raw'}")
        if self.value_map != "none":
            parts.append(f"g1={self.value_map}")
        if self.key_map != "none":
            parts.append(f"g2={self.key_map}")
        if self.negative_k and self.beta:
            parts.append(f"k={self.negative_k} beta={self.beta:g}")
        if self.ridge:
            parts.append(f"ridge={self.ridge:g}")
        return " + ".join(parts) or "normal"


@dataclass(frozen=True)
class LayerConfig:
    """What every model of an ensemble shares. ``num_features`` None means 100 * token_dim (Section 5)."""

    token_dim: int = 12
    num_features: int = None
    kernel: str = "performer"                 # or "softmax"
    # q and k each times d**-1/4, so that exp(q'.k') is exp(q.k / sqrt(d)) (Eq. (1)); the dual-model
    # theorems omit the scale and the experiments do not state it (the appendix of departures)
    temperature: bool = True

    def __post_init__(self):
        check_positive_int(self.token_dim, "token_dim")
        if self.num_features is not None:
            check_positive_int(self.num_features, "num_features")
        if self.kernel not in ("performer", "softmax"):
            raise ValueError(f"kernel must be 'performer' or 'softmax', got {self.kernel!r}")

    @property
    def features(self):
        return self.num_features or 100 * self.token_dim


def initial_parameters(seed, config, dtype=torch.float64):
    """The draws of one seed, on cpu: omega ~ N(0, I), and W_Q, W_K, W_V and the maps g1, g2 with
    torch.nn.Linear's default U(-1/sqrt(d), 1/sqrt(d)). Models with one seed start identical."""
    d = config.token_dim
    g = make_generator(10_000 + seed)   # apart from the task's generator, which uses the seed itself
    bound = 1 / math.sqrt(d)

    def uniform(*shape):
        return (2 * torch.rand(*shape, generator=g, dtype=dtype) - 1) * bound

    drawn = {"omega": torch.randn(config.features, d, generator=g, dtype=dtype)}
    for name in ("W_Q", "W_K", "W_V"):
        drawn[name] = uniform(d, d)
    for prefix in ("value", "key"):
        drawn[f"{prefix}_W1"], drawn[f"{prefix}_b1"] = uniform(d, d), uniform(d)
        drawn[f"{prefix}_W2"], drawn[f"{prefix}_b2"] = uniform(d, d), uniform(d)
    return drawn


def floored_logsumexp_(x, floor):
    """torch.logsumexp over the last dim computed as ATen computes it (the row's maximum taken
    out, exp, sum, log, the maximum put back), with every difference from the maximum raised to
    -``floor`` before exp, in ``x``'s own memory: ``x`` is overwritten.

    Eager exp (MKL's) is tens of times slower where its result underflows, even with subnormals
    flushed, and a trained layer's far-negative random-feature exponents make it underflow. A
    term more than ``floor`` = 80 below its row's largest is under 2e-35 of the row's sum, far
    under float32's resolution of it, so the result is the same float32 number
    (``tests/test_ensemble.py``). In place, because a fresh (models, batch, tokens, d_r) tensor
    for each step of the pass cost more than the step (measured once, the test-loss pass of the
    exponential task's first part at trained weights: 0.74 s out of place, 0.26 s in place;
    ``benchmarks/batched_training.py`` prints it against torch.logsumexp). Without gradients
    only: with them the plain logsumexp is kept, whose backward the floor would change, and
    compiled graphs use another exp, without that slow path.
    """
    top = x.amax(-1, keepdim=True)
    infinite = top.abs() == math.inf
    top = top.masked_fill(infinite, 0)   # as ATen: an infinite maximum is not taken out, nor floored
    lowest = torch.full_like(top, -floor).masked_fill_(infinite, -math.inf)
    return torch.maximum(x.sub_(top), lowest, out=x).exp_().sum(-1).log_().add_(top.squeeze(-1))


def batched_linear(x, W, b=None):
    """x (M, B, n, d_in) times per-model W (M, d_out, d_in), plus b (M, d_out)."""
    out = x @ W.transpose(-1, -2).unsqueeze(1)
    return out if b is None else out + b[:, None, None, :]


def augment(x, W1, b1, W2, b2, kind):
    """g(x) per model: identity (kind 0), GELU(W1 x + b1) (1), or W2 act(W1 x + b1) + b2 with GELU (2)
    or ELU (3). All kinds are computed and one is chosen, which keeps one code path for the ensemble."""
    hidden = batched_linear(x, W1, b1)
    gelu = F.gelu(hidden)
    inner = torch.where((kind == 3)[:, None, None, None], F.elu(hidden), gelu)
    two_layer = batched_linear(inner, W2, b2)
    kind = kind[:, None, None, None]
    return torch.where(kind == 0, x, torch.where(kind == 1, gelu, two_layer))


def used_switches(modifications):
    """{switch: whether any of ``modifications`` turns it on}: an ensemble computes a switch for
    all its models once one uses it, and skips it otherwise."""
    return {
        "alpha": any(m.alpha for m in modifications),
        "value_map": any(m.value_map != "none" for m in modifications),
        "key_map": any(m.key_map != "none" for m in modifications),
        "negative": any(m.negative_k and m.beta for m in modifications),
        "ridge": any(m.ridge for m in modifications),
    }


class AttentionEnsemble(torch.nn.Module):
    """M self-attention layers, model m with ``modifications[m]`` and initial draws of ``seeds[m]``."""

    def __init__(self, config, modifications, seeds, *, dtype=torch.float32, device="cpu"):
        super().__init__()
        if len(modifications) == 0 or len(modifications) != len(seeds):
            raise ValueError(
                f"modifications and seeds must be non-empty and of one length, got {len(modifications)} and {len(seeds)}"
            )
        for m in modifications:
            if not isinstance(m, Modification):
                raise ValueError(f"modifications must hold Modification objects, got {type(m).__name__}")
        self.config = config
        self.seeds = [int(s) for s in seeds]
        device = pick(device)
        draws = {s: initial_parameters(s, config) for s in sorted(set(self.seeds))}

        def stack(name):
            return torch.stack([draws[s][name] for s in self.seeds]).to(dtype=dtype, device=device)

        self.register_buffer("omega", stack("omega"))
        for name in draws[self.seeds[0]]:
            if name != "omega":
                setattr(self, name, torch.nn.Parameter(stack(name)))

        def per_model(values, kind=dtype):
            return torch.tensor(values, dtype=kind, device=device)

        self.register_buffer("alpha", per_model([m.alpha for m in modifications]))
        self.register_buffer("alpha_constant", per_model([m.alpha_form == "constant" for m in modifications], torch.bool))
        self.register_buffer("renormalise", per_model([m.renormalise for m in modifications], torch.bool))
        self.register_buffer("beta", per_model([m.beta if m.negative_k else 0.0 for m in modifications]))
        self.register_buffer("negative_k", per_model([m.negative_k if m.beta else 0 for m in modifications], torch.long))
        self.register_buffer("ridge", per_model([m.ridge for m in modifications]))
        self.register_buffer("value_kind", per_model([MAP_KINDS.index(m.value_map) for m in modifications], torch.long))
        self.register_buffer("key_kind", per_model([MAP_KINDS.index(m.key_map) for m in modifications], torch.long))
        self.max_negative_k = max(m.negative_k if m.beta else 0 for m in modifications)
        self.register_buffer("negative_models", torch.tensor(
            [i for i, m in enumerate(modifications) if m.negative_k and m.beta], dtype=torch.long, device=device))
        # switches nobody uses are skipped, so a plain ensemble costs what a plain layer costs
        self.uses = used_switches(modifications)

    @property
    def num_models(self):
        return len(self.seeds)

    def check_tokens(self, tokens):
        # the finiteness check is data-dependent: it would split a compiled graph, and compiled
        # training draws its own tokens
        if not torch.compiler.is_compiling():
            as_tensor(tokens, "tokens")
        expected = (self.num_models, self.config.token_dim)
        if tokens.dim() != 4 or (tokens.shape[0], tokens.shape[-1]) != expected:
            raise ValueError(
                f"tokens must be (models={expected[0]}, batch, tokens, dim={expected[1]}), got {tuple(tokens.shape)}"
            )
        if tokens.shape[2] < 1:
            raise ValueError("tokens must hold at least the query (n >= 1)")
        if tokens.dtype != self.W_Q.dtype or tokens.device != self.W_Q.device:
            raise ValueError(f"tokens ({tokens.dtype}, {tokens.device}) must match the ensemble ({self.W_Q.dtype}, {self.W_Q.device})")

    def keys(self, tokens):
        k = batched_linear(tokens, self.W_K)
        if self.uses["key_map"]:
            k = augment(k, self.key_W1, self.key_b1, self.key_W2, self.key_b2, self.key_kind)
        return k

    def values(self, tokens):
        v = batched_linear(tokens, self.W_V)
        if self.uses["value_map"]:
            v = augment(v, self.value_W1, self.value_b1, self.value_W2, self.value_b2, self.value_kind)
        return v

    def negative_neighbours(self, tokens, k):
        """Indices (M', B, n, k_max) of each token's lowest-scoring other tokens, lowest first, for the
        M' models with negative samples (``tokens`` and ``k`` are theirs): :func:`lowest_scoring`."""
        n, k_max = tokens.shape[-2], self.max_negative_k
        if k_max >= n:
            raise ValueError(f"negative_k={k_max} needs more than {k_max} tokens per sequence, got {n}")
        with torch.no_grad():
            return lowest_scoring(batched_linear(tokens, self.W_Q[self.negative_models]) @ k.transpose(-1, -2), k_max)

    def with_negatives(self, tokens, k):
        """x~_i = x_i - beta / k sum_{j in N(i)} x_j for the demonstrations (Eq. (15)); the query is kept.

        Only the models with negative samples are computed (ranking n x n scores is the costly part);
        x~ depends on the tokens alone, the neighbour choice carrying no gradient.
        """
        chosen = self.negative_models
        sub_tokens = tokens[chosen]
        index = self.negative_neighbours(sub_tokens, k[chosen])
        shifted = negative_samples(sub_tokens, index, self.beta[chosen], self.negative_k[chosen])
        return tokens.index_copy(0, chosen, shifted)

    def query_log_scores(self, q, k):
        """log of the query's unnormalised score for every token, (M, B, n), up to a constant per row.

        Softmax: the logits q . k_j. Performer: phi(q) . phi(k_j) = 1/m sum_r exp(w_r . (q + k_j)
        - |q|^2/2 - |k_j|^2/2) (Eq. (7)), so its log is logsumexp_r(w_r . (q + k_j) - |k_j|^2/2) plus a
        constant of the row, which the softmax over j removes; logsumexp subtracts its maximum, so no
        exponent overflows however large q and k grow.
        """
        if self.config.kernel == "softmax":
            return (k @ q.unsqueeze(-1)).squeeze(-1)
        exponent = (k + q.unsqueeze(-2)) @ self.omega.transpose(-1, -2).unsqueeze(1)
        half_norms = 0.5 * (k * k).sum(-1, keepdim=True)
        if EXPONENT_FLOOR is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
            return torch.logsumexp(exponent - half_norms, dim=-1)
        # the evaluation passes (test losses, context use), in place: see floored_logsumexp_
        return floored_logsumexp_(exponent.sub_(half_norms), EXPONENT_FLOOR)

    def features(self, x):
        """phi(x) of Eq. (7) with each model's omega: x (M, B, ..., d) -> (M, B, ..., d_r)."""
        per_model = self.omega.reshape(self.num_models, *([1] * (x.dim() - 3)), *self.omega.shape[1:])
        return positive_random_features(x, per_model)

    def ridge_output(self, q, k, v):
        """Eq. (33) for the query: V^T (Phi Phi^T + ridge I)^-1 Phi phi(q), unnormalised, over all tokens."""
        if self.config.kernel == "softmax":
            raise ValueError("the ridge layer needs a feature map: use kernel='performer'")
        phi_k, phi_q = self.features(k), self.features(q)
        gram = phi_k @ phi_k.transpose(-1, -2)
        ridge = torch.where(self.ridge > 0, self.ridge, torch.ones_like(self.ridge))[:, None, None, None]
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        weights = torch.linalg.solve(gram + ridge * eye, phi_k @ phi_q.unsqueeze(-1))
        return (v.transpose(-1, -2) @ weights).squeeze(-1)

    def attend(self, tokens):
        """The query's attention over the tokens: (weights (M, B, n), values (M, B, n, d), and the
        scaled query (M, B, d) and keys (M, B, n, d)). A prompt of the query alone (n = 1) has no
        demonstration to shift with negative samples."""
        self.check_tokens(tokens)
        root = self.config.token_dim ** -0.25 if self.config.temperature else 1.0
        k = self.keys(tokens)
        value_tokens = self.with_negatives(tokens, k) if self.uses["negative"] and tokens.shape[-2] > 1 else tokens
        v = self.values(value_tokens)
        q = root * batched_linear(tokens[..., -1:, :], self.W_Q).squeeze(-2)
        k = root * k
        weights = torch.softmax(self.query_log_scores(q, k), dim=-1)
        if self.uses["alpha"]:
            weights = self.regularize(weights)
        return weights, v, q, k

    def forward(self, tokens):
        """Output of the last token (the query) of every sequence: tokens (M, B, n, d) -> (M, B, d)."""
        weights, v, q, k = self.attend(tokens)
        out = (weights.unsqueeze(-2) @ v).squeeze(-2)
        if self.uses["ridge"]:
            out = torch.where((self.ridge > 0)[:, None, None], self.ridge_output(q, k, v), out)
        return out

    def regularize(self, weights):
        """Eq. (12) in self-attention form, per model: :func:`regularized_weights`."""
        return regularized_weights(weights, self.alpha[:, None], self.alpha_constant[:, None],
                                   self.renormalise[:, None, None])


# The modifications as functions of tensors, shared by the ensemble (Section 5's protocol) and
# the prompt layer (a new task per prompt: icl_lens.training.prompt_layer); with ``augment`` above.


def regularized_weights(weights, alpha, constant, renormalise):
    """Eq. (12) in self-attention form: the query's own attention weight (the last of ``weights``,
    (..., n)) times (1 - alpha), or minus alpha where ``constant`` (A - alpha I, Lemma D.1), then the
    weights renormalised to sum to 1 where ``renormalise``. ``alpha`` and ``constant`` broadcast
    against weights[..., -1], ``renormalise`` against ``weights``."""
    own = weights[..., -1]
    own = torch.where(constant, own - alpha, own * (1 - alpha))
    weights = torch.cat([weights[..., :-1], own.unsqueeze(-1)], dim=-1)
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(renormalise, weights / total, weights)


def lowest_scoring(logits, k_max):
    """The negative samples' neighbours N(i) of Eq. (15): for logits q_i . k_j (..., n, n), the
    indices (..., n, k_max) of each token's ``k_max`` lowest-scoring other tokens, lowest first.

    Ranked by the logits: exp is increasing, so this is the order of the softmax scores (the ones
    random features estimate); the choice is discrete and carries no gradient."""
    n = logits.shape[-1]
    logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=logits.device), math.inf)
    return torch.topk(logits, k_max, dim=-1, largest=False, sorted=True).indices


def negative_samples(tokens, index, beta, count):
    """Eq. (15): x~_i = x_i - beta / k sum_{j in N(i)} x_j for every demonstration, the query (the
    last token) kept. ``tokens`` (M, B, n, d) with ``index`` (M, B, n, k_max) from
    :func:`lowest_scoring`; ``beta`` and ``count`` (k, at most k_max) are per model, (M,)."""
    M, B, n, k_max = index.shape
    gathered = tokens.gather(2, index.reshape(M, B, n * k_max, 1).expand(-1, -1, -1, tokens.shape[-1]))
    gathered = gathered.reshape(M, B, n, k_max, -1)
    used = torch.arange(k_max, device=tokens.device) < count[:, None]
    weight = used.to(tokens.dtype) * (beta / count)[:, None]
    shifted = tokens - (gathered * weight[:, None, None, :, None]).sum(-2)
    return torch.cat([shifted[..., :-1, :], tokens[..., -1:, :]], dim=-2)


def squared_errors(ensemble, tokens, targets):
    """Per-model mean over the batch of |s_hat - s|^2, s_hat the label part of the query's output."""
    output_dim = targets.shape[-1]
    predictions = ensemble(tokens)[..., -output_dim:]
    return ((predictions - targets) ** 2).sum(-1).mean(-1)


def test_loss(ensemble, tokens, targets):
    """Mean squared error of each model on its test sequences, tokens (M, S, n, d), targets (M, S, d_s)."""
    num_sequences = tokens.shape[1]
    # keep the (models, chunk, tokens, d_r) exponent near 2^22 numbers
    chunk = max(1, 2**22 // (ensemble.num_models * tokens.shape[2] * ensemble.omega.shape[1]))
    with torch.no_grad():
        parts = [
            squared_errors(ensemble, tokens[:, i : i + chunk], targets[:, i : i + chunk]) * tokens[:, i : i + chunk].shape[1]
            for i in range(0, num_sequences, chunk)
        ]
    return (torch.stack(parts).sum(0) / num_sequences).to(torch.float64)


# the fresh sequence a trained model's dual model is checked on (seeded apart from the study's draws)
EQUIVALENCE_SET = 1_000_000


def equivalence_curve(ensemble, model, data, seed, feed_forward=None):
    """Fig. 3 (left) for a trained model: its dual model trained one demonstration at a time.

    On a fresh sequence of the model's task, in float64, returns the squared distance between the
    layer's kernel-attention output for the query and the dual prediction after t = 0..N
    per-demonstration SGD steps (Theorem 3.1 says it is round-off at t = N). With
    ``feed_forward`` = (W_1, b_1, W_2, b_2), the model's ReLU FFN after the attention, it is Fig. 14
    (left): the Transformer layer's output against the dual model of Theorem B.1.
    """
    weights = {name: getattr(ensemble, name)[model].detach().to(torch.float64).cpu() for name in ("W_Q", "W_K", "W_V")}
    feature_map = PositiveRandomFeatures(ensemble.omega[model].to(torch.float64).cpu())
    tokens, _ = sample_sequences(data.task, 1, data.weights[seed], generator=make_generator(EQUIVALENCE_SET + seed))
    X = tokens[0]
    attention = kernel_attention(X[-1:], X, weights["W_Q"], weights["W_K"], weights["W_V"], feature_map=feature_map)[0]
    if feed_forward is None:
        dual = dual_model(X[:-1], X[-1:], weights["W_Q"], weights["W_K"], weights["W_V"], feature_map)
    else:
        W_1, b_1, W_2, b_2 = (part.detach().to(torch.float64).cpu() for part in feed_forward)
        dual = transformer_layer_dual(X[:-1], X[-1:], weights["W_Q"], weights["W_K"], weights["W_V"],
                                      W_1, b_1, W_2, b_2, feature_map)
        attention = torch.relu(attention @ W_1.T + b_1) @ W_2.T + b_2
    predictions = dual.predict(dual.sgd_trajectory(), dual.test_input)
    return {"steps": list(range(len(predictions))), "squared_error": ((predictions - attention) ** 2).sum(-1).tolist()}
