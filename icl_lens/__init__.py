"""icl_lens: the code behind the icl-lens book.

One module per idea, each named after what it computes:

- :mod:`icl_lens.kernels`       positive random features, Eq. (7) and Performer (FAVOR+)
- :mod:`icl_lens.attention`     softmax attention, Eq. (1) and (5), and its kernel form, Eq. (6)-(7)
- :mod:`icl_lens.dual`          the dual models: Theorem 3.1 (Eqs. (8)-(9), (16)-(19)), Theorem B.1
                                (Eqs. (20)-(23)) and Theorem B.2 (Eqs. (24)-(25))
- :mod:`icl_lens.bounds`        the generalization bound of Theorem 3.2 and C.2, and its experiment
- :mod:`icl_lens.modifications` regularized, augmented, negative-sample and ridge attention (Sec. 4, App. D)
- :mod:`icl_lens.layers`        trainable self-attention with every modification as a switch, batched
- :mod:`icl_lens.experiments`   the regression experiments of Section 5 (Figs. 3, 10-13)
- :mod:`icl_lens.reproduce`     ``python -m icl_lens reproduce fig3``: figures as PNG + JSON
- :mod:`icl_lens.ffn_rank`      the rank bound of W_F (Fig. 14, right)
- :mod:`icl_lens.constructions` linear attention as a dual (Eqs. (3)-(4)); von Oswald et al. (App. F)
- :mod:`icl_lens.softmax_regression` Li et al.: definitions, gradient lemma, Lipschitz lemmas, shift of b
- :mod:`icl_lens.counterexamples` searches for violations of inequalities (random + gradient ascent)
- :mod:`icl_lens.approximation` how well random features approximate attention (Figs. 6-9)
- :mod:`icl_lens.symbolic`      sympy derivations of the identities the book checks
- :mod:`icl_lens.tasks`         in-context regression tasks of Section 5 / Appendix E
- :mod:`icl_lens.device`        ``pick("auto")``: cuda when present, else cpu
- :mod:`icl_lens.results`       JSON + PNG files that the chapters show
- :mod:`icl_lens.widgets`       ipywidgets explorers (live with a kernel, frames without)

Tokens are rows: a sequence is a tensor ``(..., tokens, dim)`` and a weight of shape
``(d_out, d_in)`` acts as ``x @ W.T``, which is the paper's ``W x`` on a column ``x``.
"""

__version__ = "0.1.0"
