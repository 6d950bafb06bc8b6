"""sympy derivations of the identities that the book checks exactly.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers, appendix_f,
modifications, softmax_regression, lipschitz_lemmas, weight_shifting.

Each function returns the intermediate expressions (so a chapter can print them) together with the
residuals that must simplify to zero.
"""

import sympy as sp


def gaussian_moment():
    """E_w[exp(w z)] = exp(z^2 / 2) for w ~ N(0, 1), and the 1-D unbiasedness of positive features.

    Returns ``(moment, feature_product_mean)``: the integral of exp(w z) N(w; 0, 1) dw, and the integral
    of exp(w a - a^2/2) exp(w b - b^2/2) N(w; 0, 1) dw, which must equal exp(a b) (Eq. (7) estimator).
    """
    w, z, a, b = sp.symbols("w z a b", real=True)
    density = sp.exp(-(w**2) / 2) / sp.sqrt(2 * sp.pi)
    moment = sp.simplify(sp.integrate(sp.exp(w * z) * density, (w, -sp.oo, sp.oo)))
    product = sp.exp(w * a - a**2 / 2) * sp.exp(w * b - b**2 / 2)
    feature_product_mean = sp.simplify(sp.integrate(product * density, (w, -sp.oo, sp.oo)))
    return moment, feature_product_mean


def gaussian_moment_multivariate(dim=2):
    """E exp(w . z) = exp(|z|^2 / 2) for w ~ N(0, I_dim): the integral factorises over coordinates."""
    ws = sp.symbols(f"w1:{dim + 1}", real=True)
    zs = sp.symbols(f"z1:{dim + 1}", real=True)
    integrand = sp.exp(sum(wi * zi for wi, zi in zip(ws, zs))) * sp.exp(-sum(wi**2 for wi in ws) / 2)
    result = integrand / sp.sqrt(2 * sp.pi) ** dim
    for wi in ws:
        result = sp.integrate(result, (wi, -sp.oo, sp.oo))
    return sp.simplify(result), sp.exp(sum(zi**2 for zi in zs) / 2)


def theorem_3_1(num_demos=2, num_query_side=1, value_dim=2, num_features=2):
    """Theorem 3.1 on symbolic matrices, with generic symbols for every feature value.

    The identity needs no property of phi, so phi(z_i), phi(k_j) and phi(q) are free symbols. Returns a
    dict with the loss, the gradient by differentiation, its closed form (Eq. (16)), the stepped weight
    (Eq. (17)), the dual prediction (Eq. (18)), the kernel-attention output, and the two residual
    matrices that must be zero: gradient minus closed form, prediction minus attention (Eq. (19)).
    """
    eta = sp.symbols("eta", positive=True)
    phi_D = sp.Matrix(num_demos, num_features, lambda i, r: sp.Symbol(f"phi_{i + 1}{r + 1}", positive=True))
    phi_T = sp.Matrix(num_query_side, num_features, lambda i, r: sp.Symbol(f"psi_{i + 1}{r + 1}", positive=True))
    phi_q = sp.Matrix(num_features, 1, lambda r, _: sp.Symbol(f"q_{r + 1}", positive=True))
    V_D = sp.Matrix(num_demos, value_dim, lambda i, c: sp.Symbol(f"v_{i + 1}{c + 1}"))
    V_T = sp.Matrix(num_query_side, value_dim, lambda i, c: sp.Symbol(f"u_{i + 1}{c + 1}"))
    W = sp.Matrix(value_dim, num_features, lambda c, r: sp.Symbol(f"W_{c + 1}{r + 1}"))

    D = sum(phi_D * phi_q) + sum(phi_T * phi_q)
    W0 = V_T.T * phi_T / D
    loss = -sum((V_D[i, :] * W * phi_D[i, :].T)[0, 0] for i in range(num_demos)) / (eta * D)
    gradient = W.applyfunc(lambda entry: sp.diff(loss, entry))
    closed_form = -(V_D.T * phi_D) / (eta * D)
    W1 = W0 - eta * closed_form
    prediction = W1 * phi_q
    keys = phi_D.col_join(phi_T)
    all_values = V_D.col_join(V_T)
    scores = keys * phi_q
    attention = all_values.T * scores / sum(scores)
    return {
        "D": D,
        "phi_q": phi_q,
        "W0": W0,
        "loss": loss,
        "gradient": gradient,
        "closed_form_gradient": closed_form,
        "W1": W1,
        "prediction": prediction,
        "attention": attention,
        "gradient_residual": (gradient - closed_form).applyfunc(sp.simplify),
        "prediction_residual": (prediction - attention).applyfunc(sp.simplify),
    }


def per_demo_sgd_equals_full_step(num_demos=3, value_dim=1, num_features=2):
    """N per-demonstration steps on L_i equal one full step on L, because L is linear in W.

    Returns the residual W_N(sgd) - W_1(full), which must be the zero matrix.
    """
    eta, D = sp.symbols("eta D", positive=True)
    phi_D = sp.Matrix(num_demos, num_features, lambda i, r: sp.Symbol(f"phi_{i + 1}{r + 1}"))
    V_D = sp.Matrix(num_demos, value_dim, lambda i, c: sp.Symbol(f"v_{i + 1}{c + 1}"))
    W = sp.Matrix(value_dim, num_features, lambda c, r: sp.Symbol(f"W_{c + 1}{r + 1}"))

    def loss(i, weight):
        return -(V_D[i, :] * weight * phi_D[i, :].T)[0, 0] / (eta * D)

    def gradient_at(loss_expr, weight):
        symbolic = W.applyfunc(lambda entry: sp.diff(loss_expr, entry))
        return symbolic.subs(dict(zip(W, weight)))

    current = W
    for i in range(num_demos):
        current = current - eta * gradient_at(loss(i, W), current)
    full_loss = sum(loss(i, W) for i in range(num_demos))
    full_step = W - eta * gradient_at(full_loss, W)
    return (current - full_step).applyfunc(sp.simplify)


def is_zero_matrix(matrix):
    """True when every entry of a sympy matrix simplifies to exactly 0."""
    return all(sp.simplify(entry) == 0 for entry in matrix)


def theorem_b_1(num_demos=2, num_query_side=1, dim=2, num_features=2):
    """Theorem B.1 on symbolic matrices: a fixed W_F and bias b on top of Theorem 3.1.

    Returns the gradient residual (dL/dW minus -1/(eta D) W_F V_D^T phi(K_D)) and the prediction
    residual (W_hat phi(q) + b minus (W_F h' + b)), both of which must be zero.
    """
    base = theorem_3_1(num_demos, num_query_side, dim, num_features)
    eta = sp.symbols("eta", positive=True)
    W_F = sp.Matrix(dim, dim, lambda a, c: sp.Symbol(f"F_{a + 1}{c + 1}"))
    b = sp.Matrix(dim, 1, lambda a, _: sp.Symbol(f"b_{a + 1}"))
    W = sp.Matrix(dim, num_features, lambda c, r: sp.Symbol(f"W_{c + 1}{r + 1}"))
    D, phi_q = base["D"], base["phi_q"]
    phi_D = sp.Matrix(num_demos, num_features, lambda i, r: sp.Symbol(f"phi_{i + 1}{r + 1}", positive=True))
    V_D = sp.Matrix(num_demos, dim, lambda i, c: sp.Symbol(f"v_{i + 1}{c + 1}"))
    labels = V_D * W_F.T
    loss = -sum((labels[i, :] * (W * phi_D[i, :].T + b))[0, 0] for i in range(num_demos)) / (eta * D)
    gradient = W.applyfunc(lambda entry: sp.diff(loss, entry))
    closed_form = -(W_F * V_D.T * phi_D) / (eta * D)
    W1 = W_F * base["W0"] - eta * gradient
    prediction = W1 * phi_q + b
    return {
        "loss": loss,
        "gradient_residual": (gradient - closed_form).applyfunc(sp.simplify),
        "prediction_residual": (prediction - (W_F * base["attention"] + b)).applyfunc(sp.simplify),
    }


def softmax_regression_gradient_lemma(n=3, d=2):
    """DLS23 Lemma 5.6 on symbolic A (n x d), x, b: each part's derivative minus its closed form.

    Returns a dict part -> sympy Matrix of residuals (rows: coordinates i of x), all of which must be 0,
    plus the residual of the vector forms grad_x = A^T (diag f - f f^T) c and grad_A = (diag f - f f^T) c x^T.
    """
    A = sp.Matrix(n, d, lambda r, k: sp.Symbol(f"a_{r + 1}{k + 1}", real=True))
    x = sp.Matrix(d, 1, lambda k, _: sp.Symbol(f"x_{k + 1}", real=True))
    b = sp.Matrix(n, 1, lambda r, _: sp.Symbol(f"b_{r + 1}", real=True))
    exp_Ax = (A * x).applyfunc(sp.exp)
    alpha = sum(exp_Ax)
    f = exp_Ax / alpha
    c = f - b
    loss = (c.T * c)[0, 0] / 2
    residuals = {key: [] for key in ("exp", "alpha", "alpha_inverse", "f", "f_dot_b", "loss")}
    for i in range(d):
        column = A[:, i]
        f_dot_column = (f.T * column)[0, 0]
        hadamard = f.multiply_elementwise(column)
        closed = {
            "exp": exp_Ax.multiply_elementwise(column),
            "alpha": sp.Matrix([(exp_Ax.T * column)[0, 0]]),
            "alpha_inverse": sp.Matrix([-f_dot_column / alpha]),
            "f": -f_dot_column * f + hadamard,
            "f_dot_b": sp.Matrix([-f_dot_column * (f.T * b)[0, 0] + (hadamard.T * b)[0, 0]]),
            "loss": sp.Matrix([-f_dot_column * (c.T * f)[0, 0] + (c.T * hadamard)[0, 0]]),
        }
        derivative = {
            "exp": exp_Ax.diff(x[i]),
            "alpha": sp.Matrix([sp.diff(alpha, x[i])]),
            "alpha_inverse": sp.Matrix([sp.diff(1 / alpha, x[i])]),
            "f": f.diff(x[i]),
            "f_dot_b": sp.Matrix([sp.diff((f.T * b)[0, 0], x[i])]),
            "loss": sp.Matrix([sp.diff(loss, x[i])]),
        }
        for key in residuals:
            residuals[key].append((derivative[key] - closed[key]).applyfunc(sp.simplify))
    result = {key: sp.Matrix.hstack(*columns) for key, columns in residuals.items()}
    jacobian = sp.diag(*f) - f * f.T
    gradient_x = sp.Matrix([sp.diff(loss, x[i]) for i in range(d)])
    result["grad_x_vector_form"] = (gradient_x - A.T * jacobian * c).applyfunc(sp.simplify)
    gradient_A = sp.Matrix(n, d, lambda r, k: sp.diff(loss, A[r, k]))
    result["grad_A_vector_form"] = (gradient_A - jacobian * c * x.T).applyfunc(sp.simplify)
    return result


def shift_decomposition(n=3):
    """delta_b = delta_b1 + delta_b2 (Sec. 5.2) as an identity in the exponentials: the residual, 0."""
    u = sp.Matrix(n, 1, lambda r, _: sp.Symbol(f"u_{r + 1}", positive=True))   # exp(A x_t)
    v = sp.Matrix(n, 1, lambda r, _: sp.Symbol(f"v_{r + 1}", positive=True))   # exp(A x_{t+1})
    alpha_u, alpha_v = sum(u), sum(v)
    delta = u / alpha_u - v / alpha_v
    parts = (1 / alpha_u - 1 / alpha_v) * u + (u - v) / alpha_v
    return (delta - parts).applyfunc(sp.simplify)


def basic_fact_scalar_threshold():
    """The largest u* with e^u - 1 <= 2u on [0, u*]: the root of e^u - 1 - 2u beyond 0 (about 1.2564).

    Returns (u_star, derivative_sign_change): g(u) = 2u - (e^u - 1) has g(0) = 0, g' = 2 - e^u > 0 on
    [0, log 2), so g rises, then falls to its root u*; for u < 0, |e^u - 1| = 1 - e^u <= |u| <= 2|u|.
    """
    u = sp.Symbol("u", real=True)
    g = 2 * u - (sp.exp(u) - 1)
    turning_point = sp.solve(sp.diff(g, u), u)[0]
    root = sp.nsolve(g, u, 1.2)
    return root, turning_point


def rademacher_second_moment(num_samples=2, output_dim=2, num_features=2):
    """E ||sum_i eps_i phi_i^T||_F^2 = d_o sum_i ||phi_i||^2 = d_o Tr(K_S), by exact enumeration of all
    2^(N d_o) sign patterns with symbolic features. Returns (average, d_o Tr K_S, residual)."""
    import itertools

    phi = sp.Matrix(num_samples, num_features, lambda i, r: sp.Symbol(f"phi_{i + 1}{r + 1}", real=True))
    patterns = list(itertools.product((-1, 1), repeat=num_samples * output_dim))
    total = 0
    for pattern in patterns:
        eps = sp.Matrix(num_samples, output_dim, pattern)
        summed = eps.T * phi
        total += sum(entry**2 for entry in summed)
    average = sp.expand(total / len(patterns))
    trace_form = output_dim * sum(entry**2 for entry in phi)
    return average, trace_form, sp.simplify(average - trace_form)


def loss_gradient_norms(output_dim=2, negatives=2):
    """Squared gradient norms of the two losses of Theorem 3.2 / C.2 as functions of their arguments.

    h(u) = -<u_1, u_2> has ||grad h||^2 = ||u_1||^2 + ||u_2||^2 (so sqrt(2) rho on the rho-balls);
    h^-(u) = -1/K sum_j <u_1, u_2 - u_{j+2}> has ||grad||^2 = ||u_2 - mean_j u_{j+2}||^2 + (1 + 1/K) ||u_1||^2,
    at most (4 + 1 + 1/K) rho^2. Returns both expressions and the residuals against these closed forms.
    """
    blocks = [sp.Matrix(output_dim, 1, lambda a, _: sp.Symbol(f"u{k}_{a + 1}", real=True)) for k in range(negatives + 2)]
    u1, u2, others = blocks[0], blocks[1], blocks[2:]
    variables = [entry for block in blocks for entry in block]

    def squared_gradient(expression, used):
        return sp.expand(sum(sp.diff(expression, v) ** 2 for v in used))

    h = -(u1.T * u2)[0, 0]
    binary = squared_gradient(h, variables[: 2 * output_dim])
    binary_closed = sp.expand((u1.T * u1)[0, 0] + (u2.T * u2)[0, 0])
    h_negative = -sum((u1.T * (u2 - other))[0, 0] for other in others) / negatives
    negative = squared_gradient(h_negative, variables)
    mean_other = sum(others, sp.zeros(output_dim, 1)) / negatives
    negative_closed = sp.expand(((u2 - mean_other).T * (u2 - mean_other))[0, 0] + (1 + sp.Rational(1, negatives)) * (u1.T * u1)[0, 0])
    return {
        "binary": binary,
        "binary_residual": sp.simplify(binary - binary_closed),
        "negative": negative,
        "negative_residual": sp.simplify(negative - negative_closed),
    }


def symbol_matrix(name, rows, columns, **assumptions):
    return sp.Matrix(rows, columns, lambda i, j: sp.Symbol(f"{name}_{i + 1}{j + 1}", **assumptions))


def linear_attention_dual(num_samples=2, input_dim=2, output_dim=2, signal_sign=-1):
    """Eqs. (3)-(4): one GD step of a linear layer W on (1/2) sum_i |W x_i - y_i|^2 is
    W_0 + sum_i e_i x_i^T with e_i = -eta dL/dy_hat_i, and its test prediction is
    W_0 x + LA(E, X, x) = W_0 x + E X^T x. Returns the two residuals (zero matrices);
    ``signal_sign=+1`` (the wrong sign of e_i) makes them non-zero."""
    eta = sp.symbols("eta", positive=True)
    W0 = symbol_matrix("w", output_dim, input_dim)
    X = symbol_matrix("x", input_dim, num_samples)        # columns are the inputs, as in Eq. (3)
    Y = symbol_matrix("y", output_dim, num_samples)
    x_test = symbol_matrix("t", input_dim, 1)
    W = symbol_matrix("W", output_dim, input_dim)
    loss = sum(((W * X[:, i] - Y[:, i]).T * (W * X[:, i] - Y[:, i]))[0, 0] for i in range(num_samples)) / 2
    gradient = W.applyfunc(lambda entry: sp.diff(loss, entry)).subs(dict(zip(W, W0)))
    stepped = W0 - eta * gradient
    E = sp.Matrix.hstack(*[signal_sign * eta * (W0 * X[:, i] - Y[:, i]) for i in range(num_samples)])   # e_i
    outer = sum((E[:, i] * X[:, i].T for i in range(num_samples)), sp.zeros(output_dim, input_dim))
    return {"step_residual": (stepped - (W0 + outer)).applyfunc(sp.expand),
            "prediction_residual": (stepped * x_test - (W0 * x_test + E * X.T * x_test)).applyfunc(sp.expand)}


def stacked_demo_outputs(num_demos=3, value_dim=2, num_features=2, rescale=True):
    """Theorem B.2, Eq. (25): (D / D_i) [f_hat(q_i) - f_init(q_i)] is the PrefixLM output of
    demonstration i, sum_j v_j phi(k_j)^T phi(q_i) / D_i with D_i = sum_j phi(k_j)^T phi(q_i)
    (generic symbols for every feature value). Returns the residual for each demonstration;
    ``rescale=False`` drops the D / D_i factor, which must leave a residual."""
    eta, D = sp.symbols("eta D", positive=True)
    phi_K = symbol_matrix("phi", num_demos, num_features, positive=True)
    V = symbol_matrix("v", num_demos, value_dim)
    W = symbol_matrix("W", value_dim, num_features)
    W0 = symbol_matrix("w", value_dim, num_features)
    loss = -sum((V[i, :] * W * phi_K[i, :].T)[0, 0] for i in range(num_demos)) / (eta * D)   # Eq. (24)
    W_hat = W0 - eta * W.applyfunc(lambda entry: sp.diff(loss, entry))
    residuals = []
    for i in range(num_demos):
        phi_q = symbol_matrix(f"q{i + 1}", num_features, 1, positive=True)
        D_i = sum(phi_K * phi_q)
        dual_side = (D / D_i if rescale else 1) * (W_hat * phi_q - W0 * phi_q)
        prefix_lm = V.T * (phi_K * phi_q) / D_i
        residuals.append((dual_side - prefix_lm).applyfunc(sp.simplify))
    return residuals


def augmented_dual(num_demos=2, value_dim=2, num_features=2, augment_query_side=True):
    """Eqs. (13)-(14): with labels g_1(W_V x_i) and inputs phi(g_2(W_K x_i)) (generic symbols), one
    step of the augmented loss from W_0 = g_1(v_q) phi(g_2(k_q))^T / D predicts the augmented
    attention output. Returns the residual; ``augment_query_side=False`` starts from the
    un-augmented query value, which must leave one."""
    eta = sp.symbols("eta", positive=True)
    G1 = symbol_matrix("g", num_demos + 1, value_dim)                # g_1 of every value, query last
    Phi2 = symbol_matrix("phi", num_demos + 1, num_features, positive=True)   # phi(g_2(key))
    phi_q = symbol_matrix("q", num_features, 1, positive=True)
    W = symbol_matrix("W", value_dim, num_features)
    scores = Phi2 * phi_q
    D = sum(scores)
    query_value = G1[-1, :] if augment_query_side else symbol_matrix("u", 1, value_dim)
    W0 = query_value.T * Phi2[-1, :] / D
    loss = -sum((G1[i, :] * W * Phi2[i, :].T)[0, 0] for i in range(num_demos)) / (eta * D)
    W1 = W0 - eta * W.applyfunc(lambda entry: sp.diff(loss, entry))
    attention = G1.T * scores / D
    return (W1 * phi_q - attention).applyfunc(sp.simplify)


def negative_sample_dual(beta=sp.Symbol("beta"), neighbours=((1,), (2,), (0, 1)), score_neighbours=None):
    """Eq. (15): labels W_V x~_i with x~_i = x_i - beta / |N(i)| sum_{j in N(i)} x_j give the same
    output as attention with effective weights a'_j = a_j - beta sum_{i: j in N(i)} a_i / |N(i)|
    (scalar values v_j and scores a_j as symbols; 0-based neighbour lists). Returns the residual;
    ``score_neighbours`` other than ``neighbours`` in the score form must leave one."""
    score_neighbours = neighbours if score_neighbours is None else score_neighbours
    count = len(neighbours)
    a = sp.symbols(f"a1:{count + 1}", positive=True)
    v = sp.symbols(f"v1:{count + 1}")
    D = sp.Symbol("D", positive=True)
    tilde = [v[i] - beta * sum(v[j] for j in neighbours[i]) / len(neighbours[i]) for i in range(count)]
    dual_side = sum(tilde[i] * a[i] for i in range(count)) / D        # Delta W phi(q), W_0 part apart
    effective = [a[j] - beta * sum(a[i] / len(score_neighbours[i]) for i in range(count) if j in score_neighbours[i])
                 for j in range(count)]
    score_form = sum(effective[j] * v[j] for j in range(count)) / D
    return sp.simplify(dual_side - score_form)


def regularized_self_attention(n=3, value_dim=1, num_features=2, form="proportional"):
    """App. D, the regularized self-attention form. Token j is its own query; its dual model starts
    from W_0 = v_j phi(k_j)^T / D_j, and one gradient step on the regularized loss (Eq. (11))
    -1/(eta D_j) sum_{i != j} v_i^T W phi(k_i) + alpha / (2 eta) |W|_F^2, differentiated by sympy,
    predicts column j of V (A - alpha (A o I)), with A_ij = phi(k_i)^T phi(q_j) / D_j. Returns the
    residual matrix (value_dim x n); generic symbols for every feature value. ``form="constant"``
    compares with V (A - alpha I) instead, the other reading, which the loss does not give."""
    alpha, eta = sp.symbols("alpha eta", positive=True)
    phi_K = symbol_matrix("phi", n, num_features, positive=True)     # row i: phi(k_i)
    phi_Q = symbol_matrix("psi", n, num_features, positive=True)     # row j: phi(q_j)
    V = symbol_matrix("v", value_dim, n)
    W = symbol_matrix("W", value_dim, num_features)
    columns, A = [], sp.zeros(n, n)
    for j in range(n):
        scores = phi_K * phi_Q[j, :].T
        D_j = sum(scores)
        A[:, j] = scores / D_j
        W0 = V[:, j] * phi_K[j, :] / D_j
        loss = (-sum((V[:, i].T * W * phi_K[i, :].T)[0, 0] for i in range(n) if i != j) / (eta * D_j)
                + alpha / (2 * eta) * sum(entry**2 for entry in W))
        gradient = W.applyfunc(lambda entry: sp.diff(loss, entry)).subs(dict(zip(W, W0)))
        columns.append((W0 - eta * gradient) * phi_Q[j, :].T)
    H = sp.Matrix.hstack(*columns)
    reduction = A.multiply_elementwise(sp.eye(n)) if form == "proportional" else sp.eye(n)
    return (H - V * (A - alpha * reduction)).applyfunc(sp.simplify)
