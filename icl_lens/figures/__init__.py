"""The book's figures, by chapter family, in one style (:mod:`icl_lens.figures.style`). Each
function takes numbers computed elsewhere (a saved record) and returns a matplotlib figure.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
weight_shifting, experiments, across_tasks, closeness_experiment, bert.
"""
