"""The trainable layers: each switch equals its dual-side form in float64, and the batched ensemble is
M independent SGD runs."""

import math

import pytest
import torch
import torch.nn.functional as F

from icl_lens import kernels
from icl_lens.studies import section5
from icl_lens.training import loop
from icl_lens.training.data import task_data
from icl_lens import modifications as m
from icl_lens.attention import kernel_attention, kernel_attention_weights, softmax_attention
from icl_lens.device import generator
from icl_lens.training.ensemble import (AttentionEnsemble, LayerConfig, Modification, initial_parameters,
                                       squared_errors)
from icl_lens.training.ensemble import test_loss as ensemble_test_loss   # not collected as a test

from conftest import DEVICES

TOLERANCE = 1e-12   # float64 identities; measured errors are ~1e-16 (ridge ~1e-15, a linear solve)


def ensemble_of(modifications, *, seed=0, device="cpu", **config):
    layer = LayerConfig(token_dim=config.pop("token_dim", 12), **config)
    return AttentionEnsemble(layer, modifications, [seed] * len(modifications), dtype=torch.float64, device=device)


def tokens_for(ensemble, n=16, seed=5):
    g = generator(seed)
    X = (2 * torch.rand(n, ensemble.config.token_dim, generator=g, dtype=torch.float64) - 1).to(ensemble.W_Q.device)
    return X, X.expand(ensemble.num_models, 1, n, -1).contiguous()


def weights_of(ensemble, model):
    return tuple(getattr(ensemble, name)[model].detach() for name in ("W_Q", "W_K", "W_V"))


def close(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) < TOLERANCE * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["performer", "softmax"])
def test_plain_layer_is_attention(device, kernel):
    ensemble = ensemble_of([Modification()], seed=3, device=device, kernel=kernel)
    X, batch = tokens_for(ensemble)
    W_Q, W_K, W_V = weights_of(ensemble, 0)
    if kernel == "performer":
        phi = kernels.PositiveRandomFeatures(ensemble.omega[0])
        expected = kernel_attention(X[-1:], X, W_Q, W_K, W_V, feature_map=phi)[0]
    else:
        expected = softmax_attention(X[-1:], X, W_Q, W_K, W_V)[0]
    assert close(ensemble(batch)[0, 0], expected)


def test_every_switch_equals_its_dual_form():
    modifications = [
        Modification(alpha=0.3, renormalise=False),
        Modification(value_map="gelu", key_map="mlp-elu"),
        Modification(value_map="mlp-gelu", key_map="gelu"),
        Modification(negative_k=3, beta=0.2),
        Modification(alpha=-0.4, negative_k=2, beta=0.5, renormalise=False),
        Modification(ridge=0.5),
    ]
    ensemble = ensemble_of(modifications)
    X, batch = tokens_for(ensemble)
    out = ensemble(batch)[:, 0]
    W_Q, W_K, W_V = weights_of(ensemble, 0)
    phi = kernels.PositiveRandomFeatures(ensemble.omega[0])
    prompt = m.kernel_prompt(X[:-1], X[-1:], W_Q, W_K, W_V, phi)
    # Eq. (12): the query side (here the query itself) scaled by 1 - alpha, normaliser unchanged
    assert close(out[0], m.modified_attention(prompt, query_side_factor=0.7))

    def mlp(prefix, model, activation, two_layer):
        p = {n: getattr(ensemble, f"{prefix}_{n}")[model].detach() for n in ("W1", "b1", "W2", "b2")}
        inner = lambda x: activation(x @ p["W1"].T + p["b1"])  # noqa: E731
        return (lambda x: inner(x) @ p["W2"].T + p["b2"]) if two_layer else inner

    for model, (g1, g2) in ((1, (mlp("value", 1, F.gelu, False), mlp("key", 1, F.elu, True))),
                            (2, (mlp("value", 2, F.gelu, True), mlp("key", 2, F.gelu, False)))):
        augmented = m.kernel_prompt(X[:-1], X[-1:], W_Q, W_K, W_V, phi, key_map=g2, value_map=g1)   # Eq. (14)
        assert close(out[model], m.modified_attention(augmented))
    logits = (X @ W_Q.T) @ (X @ W_K.T).T
    for model, k, beta, alpha in ((3, 3, 0.2, 0.0), (4, 2, 0.5, -0.4)):
        tilde = m.negative_tokens(X, m.lowest_attention_neighbours(logits, k), beta)   # Eq. (15)
        negative = m.replace(prompt, demo_values=tilde[:-1] @ W_V.T)
        assert close(out[model], m.modified_attention(negative, query_side_factor=1 - alpha))
    everything = m.kernel_prompt(X, X[-1:], W_Q, W_K, W_V, phi)   # the self-attention ridge layer
    assert close(out[5], m.ridge_attention(everything, 0.5))      # Eq. (33)


def test_both_regularized_forms_in_one_ensemble():
    """Each model reads its own form: proportional or constant, renormalised or not, alpha = 16 too."""
    readings = [(0.4, "proportional", True), (0.4, "constant", True), (16.0, "constant", True),
                (16.0, "proportional", False), (16.0, "constant", False), (-0.5, "proportional", True)]
    modifications = [Modification(alpha=a, alpha_form=f, renormalise=r) for a, f, r in readings]
    ensemble = ensemble_of([Modification(), *modifications])
    X, batch = tokens_for(ensemble)
    W_Q, W_K, _ = weights_of(ensemble, 0)
    phi = kernels.PositiveRandomFeatures(ensemble.omega[0])
    out = ensemble(batch)[:, 0]
    v = X @ ensemble.W_V[0].detach().T
    for model, (alpha, form, renormalise) in enumerate(readings, start=1):
        a = kernel_attention_weights(X[-1:], X, W_Q, W_K, feature_map=phi)[0]
        a[-1] = a[-1] * (1 - alpha) if form == "proportional" else a[-1] - alpha
        expected = (a / a.sum() if renormalise else a) @ v
        assert close(out[model], expected), (alpha, form, renormalise)
    wrong = kernel_attention_weights(X[-1:], X, W_Q, W_K, feature_map=phi)[0]
    wrong[-1] = wrong[-1] - 0.4   # the constant form applied to the proportional model must not match
    assert not close(out[1], (wrong / wrong.sum()) @ v)


@pytest.mark.parametrize("alpha, form", [(1.0, "proportional"), (16.0, "proportional"), (1.0, "constant")])
def test_renormalised_alpha_that_can_divide_by_zero_is_rejected(alpha, form):
    with pytest.raises(ValueError, match="alpha"):
        Modification(alpha=alpha, alpha_form=form)
    with pytest.raises(ValueError, match="alpha_form"):
        Modification(alpha=0.1, alpha_form="other")


def test_batched_training_is_independent_sgd():
    """Each model of a trained ensemble equals the same model trained alone (float64, 12 steps)."""
    config = section5.ExperimentConfig(epochs=1, tokens_per_epoch=12 * 16, dtype="float64")
    variants = [Modification(), Modification(alpha=0.2), Modification(value_map="gelu", key_map="mlp-gelu"),
                Modification(negative_k=3, beta=0.1)]
    seeds = [0, 1, 0, 1]
    lr = torch.tensor([0.003, 0.003, 0.005, 0.005], dtype=torch.float64)
    together = AttentionEnsemble(config.layer, variants, seeds, dtype=torch.float64)
    batched = loop.train(together, task_data(config.task, seeds), steps=12, epochs=1, lr=lr,
                         step_errors=squared_errors)
    for i, (variant, seed) in enumerate(zip(variants, seeds)):
        alone = AttentionEnsemble(config.layer, [variant], [seed], dtype=torch.float64)
        single = loop.train(alone, task_data(config.task, [seed]), steps=12, epochs=1, lr=lr[i : i + 1],
                            step_errors=squared_errors)
        assert abs(float(single[0, 0]) - float(batched[0, i])) < 1e-10 * float(single[0, 0])
        for name, parameter in alone.named_parameters():
            assert torch.allclose(parameter[0], getattr(together, name)[i], rtol=0, atol=1e-12), name


def test_compiled_steps_train_the_models_the_plain_loop_trains():
    """compile=True (a few SGD steps per torch.compile graph, the update inside it) against the
    plain loop, float64, with every switch and the "decay" schedule: 2 epochs of 8 steps, so 4
    steps a call as in the full runs, and the weights the after_epoch callback sees after each
    epoch. The same run at another learning rate moves the weights far beyond the tolerance, so
    the comparison can fail."""
    config = section5.ExperimentConfig(epochs=1, tokens_per_epoch=8 * 16, dtype="float64")
    variants = [Modification(), Modification(alpha=0.2), Modification(value_map="gelu", key_map="mlp-gelu"),
                Modification(negative_k=3, beta=0.1)]
    lr = torch.tensor([0.003, 0.003, 0.005, 0.005], dtype=torch.float64)
    schedule = loop.decay_schedule(16, 0.5)

    def trained(rates, compile):
        ensemble = AttentionEnsemble(config.layer, variants, [0, 1, 0, 1], dtype=torch.float64)
        seen = []
        history = loop.train(ensemble, task_data(config.task, [0, 1]), steps=8, epochs=2, lr=rates,
                             step_errors=squared_errors, schedule=schedule, compile=compile,
                             after_epoch=lambda epoch: seen.append(ensemble.W_V.detach().clone()))
        return history, dict(ensemble.named_parameters()), seen

    plain_history, plain, plain_seen = trained(lr, False)
    compiled_history, compiled, compiled_seen = trained(lr, True)
    assert torch.allclose(compiled_history, plain_history, rtol=1e-12, atol=0)
    gaps = {name: float((compiled[name] - p).detach().abs().max()) for name, p in plain.items()}
    assert max(gaps.values()) < 1e-12, gaps
    assert len(compiled_seen) == 2
    assert all(float((a - b).abs().max()) < 1e-12 for a, b in zip(compiled_seen, plain_seen))
    _, other, _ = trained(2 * lr, False)
    assert max(float((other[name] - p).detach().abs().max()) for name, p in plain.items()) > 1e-6


def test_the_exponent_floor_changes_no_float32_number(monkeypatch):
    """Without gradients (the evaluation passes) the random-feature exponents more than
    EXPONENT_FLOOR below their row's largest are raised to there (floored_logsumexp_: eager exp
    is slow where it underflows). With queries and keys as large as a trained layer's many are,
    and the outputs are still torch.logsumexp's float32 numbers; a floor inside the sums'
    resolution (1) changes them, so the comparison can fail. With gradients (training) the
    plain logsumexp is kept."""
    from icl_lens.training import ensemble as module

    config = section5.exponential_experiment()
    variants = [Modification(), Modification(alpha=0.2), Modification(key_map="gelu", negative_k=3, beta=0.1)]
    seeds = [config.seeds[0]] * len(variants)
    tokens, _ = task_data(config.task, seeds[:1]).epoch(seeds, 4, torch.float32, "cpu")
    ensemble = AttentionEnsemble(config.layer, variants, seeds)
    with torch.no_grad():
        ensemble.W_Q *= 8
        ensemble.W_K *= 8

    def outputs(floor, gradients=False):
        monkeypatch.setattr(module, "EXPONENT_FLOOR", floor)
        with torch.set_grad_enabled(gradients):
            return ensemble(tokens).detach()

    floor = module.EXPONENT_FLOOR
    exponents = []   # what query_log_scores hands to logsumexp
    logsumexp = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda x, dim: exponents.append(x.detach()) or logsumexp(x, dim=dim))
    plain = outputs(None)
    monkeypatch.setattr(torch, "logsumexp", logsumexp)
    below = torch.cat([(x < x.amax(-1, keepdim=True) - floor).flatten() for x in exponents])
    assert below.float().mean() > 0.05   # the floor has terms to raise
    assert torch.equal(outputs(floor), plain)
    assert not torch.equal(outputs(1.0), plain)
    assert torch.equal(outputs(1.0, gradients=True), plain)
    # rows a diverged model can give: as torch.logsumexp, infinities and nan included
    rows = torch.tensor([[math.inf, 0.0], [-math.inf, -math.inf], [math.nan, 0.0], [3e38, -3e38], [0.0, -200.0]])
    expected = logsumexp(rows, dim=-1)
    found = module.floored_logsumexp_(rows.clone(), floor)
    assert torch.equal(found.isnan(), expected.isnan())
    assert torch.equal(found[~expected.isnan()], expected[~expected.isnan()])


def test_an_empty_epoch_range_trains_nothing():
    config = section5.ExperimentConfig(epochs=1, tokens_per_epoch=2 * 16)
    ensemble = AttentionEnsemble(config.layer, [Modification(), Modification()], [0, 0])
    before = ensemble.W_Q.detach().clone()
    history = loop.train(ensemble, task_data(config.task, [0]), steps=2, epochs=3, first_epoch=3, lr=0.003,
                         step_errors=squared_errors)
    assert history.shape == (0, 2) and torch.equal(ensemble.W_Q, before)


def test_a_diverging_model_leaves_the_others_alone():
    config = section5.ExperimentConfig(epochs=2, tokens_per_epoch=20 * 16)
    ensemble = AttentionEnsemble(config.layer, [Modification(), Modification()], [0, 0])
    lr = torch.tensor([0.003, 1e6])
    history = loop.train(ensemble, task_data(config.task, [0]), steps=20, epochs=2, lr=lr,
                         step_errors=squared_errors)
    assert torch.isfinite(history[:, 0]).all() and not torch.isfinite(history[-1, 1])


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="value_map"):
        Modification(value_map="relu")
    with pytest.raises(ValueError, match="negative_k"):
        Modification(negative_k=-1)
    with pytest.raises(ValueError, match="alpha"):
        Modification(alpha=math.nan)
    with pytest.raises(ValueError, match="kernel"):
        LayerConfig(kernel="linear")
    with pytest.raises(ValueError, match="alpha"):
        ensemble_of([Modification(alpha=1.5)])
    with pytest.raises(ValueError, match="seeds"):
        AttentionEnsemble(LayerConfig(), [Modification()], [0, 1])
    ensemble = ensemble_of([Modification(negative_k=5, beta=0.1)])
    with pytest.raises(ValueError, match="tokens"):
        ensemble(torch.zeros(1, 1, 16, 11, dtype=torch.float64))
    with pytest.raises(ValueError, match="negative_k"):
        ensemble(torch.zeros(1, 1, 4, 12, dtype=torch.float64))
    with pytest.raises(ValueError, match="finite"):
        ensemble(torch.full((1, 1, 16, 12), math.nan, dtype=torch.float64))
    with pytest.raises(ValueError, match="ridge"):
        ensemble_of([Modification(ridge=1.0)], kernel="softmax")(torch.zeros(1, 1, 4, 12, dtype=torch.float64))


def test_without_the_temperature_queries_and_keys_are_not_scaled():
    """temperature=False is the layer with W_Q and W_K each d**-1/4 larger, so the kernel sees
    q . k instead of q . k / sqrt(d); and a query alone gets weight 1 whatever the switches."""
    d = 12
    tokens = torch.rand(1, 3, 16, d, generator=generator(5), dtype=torch.float64)
    variants = [Modification(), Modification(alpha=-0.5), Modification(key_map="gelu")]
    for kernel in ("softmax", "performer"):
        scaled = AttentionEnsemble(LayerConfig(token_dim=d, kernel=kernel), variants[:1], [0], dtype=torch.float64)
        plain = AttentionEnsemble(LayerConfig(token_dim=d, kernel=kernel, temperature=False), variants[:1], [0],
                                  dtype=torch.float64)
        with torch.no_grad():
            plain.W_Q.mul_(d ** -0.25)
            plain.W_K.mul_(d ** -0.25)
        assert torch.allclose(plain(tokens), scaled(tokens), rtol=1e-12, atol=1e-12), kernel
        assert not torch.allclose(
            AttentionEnsemble(LayerConfig(token_dim=d, kernel=kernel, temperature=False), variants[:1], [0],
                              dtype=torch.float64)(tokens), scaled(tokens)), kernel
    ensemble = AttentionEnsemble(LayerConfig(token_dim=d), variants + [Modification(negative_k=3, beta=0.1)],
                                 [0] * 4, dtype=torch.float64)
    alone = tokens[..., -1:, :].expand(4, -1, -1, -1)
    weights, values, _, _ = ensemble.attend(alone)
    assert torch.allclose(weights, torch.ones_like(weights))
    assert torch.allclose(ensemble(alone), values[..., 0, :])


def test_test_loss_is_the_mean_squared_error_of_the_query_predictions():
    """test_loss against the squared error of each sequence's query written out with kernel_attention,
    with 7 sequences in chunks of 3 (the chunk size 2^22 // (models x tokens x features) = 3 here),
    so that the last chunk of 1 must be weighted by its size."""
    tokens_per_sequence, features = 64, 20_000
    assert 2**22 // (1 * tokens_per_sequence * features) == 3
    ensemble = ensemble_of([Modification()], seed=2, token_dim=3, num_features=features)
    g = generator(11)
    tokens = 2 * torch.rand(1, 7, tokens_per_sequence, 3, generator=g, dtype=torch.float64) - 1
    targets = torch.randn(1, 7, 1, generator=g, dtype=torch.float64)
    W_Q, W_K, W_V = weights_of(ensemble, 0)
    phi = kernels.PositiveRandomFeatures(ensemble.omega[0])
    errors = []
    for X, target in zip(tokens[0], targets[0]):
        prediction = kernel_attention(X[-1:], X, W_Q, W_K, W_V, feature_map=phi)[0, -1]
        errors.append(float((prediction - target[0]) ** 2))
    got = ensemble_test_loss(ensemble, tokens, targets)
    assert got.shape == (1,)
    assert abs(float(got[0]) - sum(errors) / 7) < 1e-12 * sum(errors) / 7


def test_equivalence_curve_reaches_round_off_at_step_n():
    """Fig. 3 (left) for model 1 of an ensemble (seed 1 on the linear task): N + 1 squared errors
    between the dual prediction after t steps and the layer's output, written out here with
    kernel_attention and the dual model of that model's weights; the last is round-off, the first
    not. With an FFN the same against the Transformer layer (Fig. 14, left)."""
    from icl_lens.dual import dual_model
    from icl_lens.tasks import sample_sequences
    from icl_lens.training.ensemble import EQUIVALENCE_SET, equivalence_curve

    config = section5.ExperimentConfig(epochs=1, tokens_per_epoch=16, dtype="float64")
    ensemble = AttentionEnsemble(config.layer, [Modification(), Modification()], [0, 1], dtype=torch.float64)
    data = task_data(config.task, [0, 1])
    curve = equivalence_curve(ensemble, 1, data, 1)
    tokens, _ = sample_sequences(data.task, 1, data.weights[1], generator=generator(EQUIVALENCE_SET + 1))
    X = tokens[0]
    W_Q, W_K, W_V = weights_of(ensemble, 1)
    phi = kernels.PositiveRandomFeatures(ensemble.omega[1])
    layer = kernel_attention(X[-1:], X, W_Q, W_K, W_V, feature_map=phi)[0]
    model = dual_model(X[:-1], X[-1:], W_Q, W_K, W_V, phi)
    first = float(((model.predict(model.W0, model.test_input) - layer) ** 2).sum())
    assert curve["steps"] == list(range(len(X)))
    assert curve["squared_error"][0] == pytest.approx(first, rel=1e-10) and first > 1e-6
    assert curve["squared_error"][-1] < 1e-24
    g = generator(3)
    W_1, W_2 = (torch.randn(12, 12, generator=g, dtype=torch.float64) / 4 for _ in range(2))
    b_1, b_2 = (torch.randn(12, generator=g, dtype=torch.float64) for _ in range(2))
    with_ffn = equivalence_curve(ensemble, 1, data, 1, feed_forward=(W_1, b_1, W_2, b_2))
    assert with_ffn["squared_error"][-1] < 1e-20 < with_ffn["squared_error"][0]


def test_initial_draws_are_linear_layer_uniforms_and_the_test_loss_is_float64():
    d = 12
    drawn = initial_parameters(3, LayerConfig(token_dim=d))
    assert drawn["omega"].shape == (1200, d) and abs(float(drawn["omega"].std()) - 1) < 0.02
    # every weight and bias together fill U(-1/sqrt(d), 1/sqrt(d)) (torch.nn.Linear's default)
    uniforms = torch.cat([value.flatten() for name, value in drawn.items() if name != "omega"])
    assert uniforms.abs().max() <= d**-0.5 and uniforms.min() < -0.95 * d**-0.5 and uniforms.max() > 0.95 * d**-0.5
    assert abs(float(uniforms.mean())) < 0.01
    ensemble = AttentionEnsemble(LayerConfig(token_dim=3, num_features=8), [Modification()], [0], dtype=torch.float32)
    tokens = torch.rand(1, 5, 4, 3)
    assert ensemble_test_loss(ensemble, tokens, torch.rand(1, 5, 1)).dtype == torch.float64
