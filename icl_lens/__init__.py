"""icl_lens: the code behind the icl-lens book.

Chapters: intro (its map from each result to its code).

The mathematics, one module per idea, each named after what it computes:

- :mod:`icl_lens.kernels`       positive random features, Eq. (7) and Performer (FAVOR+)
- :mod:`icl_lens.attention`     softmax attention, Eq. (1) and (5), and its kernel form, Eq. (6)-(7)
- :mod:`icl_lens.dual`          the dual models: Theorem 3.1 (Eqs. (8)-(9), (16)-(19)), Theorem B.1
                                (Eqs. (20)-(23)) and Theorem B.2 (Eqs. (24)-(25))
- :mod:`icl_lens.bounds`        the generalization bound of Theorem 3.2 and C.2, and its experiment
- :mod:`icl_lens.modifications` regularized, augmented, negative-sample and ridge attention (Sec. 4, App. D)
- :mod:`icl_lens.approximation` how well random features approximate attention (Figs. 6-9)
- :mod:`icl_lens.constructions` linear attention as a dual (Eqs. (3)-(4)); von Oswald et al. (App. F)
- :mod:`icl_lens.softmax_regression` Li et al.: definitions, gradient lemma, Lipschitz lemmas, shift of b
- :mod:`icl_lens.counterexamples` searches for violations of inequalities (random + gradient ascent)
- :mod:`icl_lens.symbolic`      sympy derivations of the identities the book checks
- :mod:`icl_lens.tasks`         in-context regression tasks of Section 5 / Appendix E
- :mod:`icl_lens.baselines`     training-free predictors: context mean, Nadaraya-Watson, one GD step, least squares
- :mod:`icl_lens.context_use`   does a trained layer read its context, or answer from the query's own token?

The experiments, in folders:

- :mod:`icl_lens.training`      the trainable layers and the loop toolkit every study shares
- :mod:`icl_lens.verdicts`      paired comparisons, the verdict rules, the convergence criterion
- :mod:`icl_lens.studies`       one module per study (Section 5, Fig. 14, across tasks, Li et al., Table 1)
- :mod:`icl_lens.bert`          Table 1's modifications inside a Hugging Face BERT, GLUE, the WordNet stand-in
- :mod:`icl_lens.figures`       the book's figures by chapter family, in one style
- :mod:`icl_lens.reproduce`     ``python -m icl_lens reproduce ...``: every saved run as PNG + JSON

And the tools: :mod:`icl_lens.device` (``pick("auto")``: cuda when present, else cpu),
:mod:`icl_lens.results` (JSON + PNG files that the chapters show), :mod:`icl_lens.widgets`
(ipywidgets explorers, live with a kernel, frames without), :mod:`icl_lens.validation`.

Tokens are rows: a sequence is a tensor ``(..., tokens, dim)`` and a weight of shape
``(d_out, d_in)`` acts as ``x @ W.T``, which is the paper's ``W x`` on a column ``x``.
"""

__version__ = "0.1.0"
