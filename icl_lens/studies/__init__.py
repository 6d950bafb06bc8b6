"""The book's experiments, one module per study. Each has a config dataclass with the paper's
defaults (``ExperimentConfig`` / ``StudyConfig``), a run function that returns a JSON-ready
record, and its claims judged by the rules of :mod:`icl_lens.verdicts`; the figures are in
:mod:`icl_lens.figures`. No study imports another.

- :mod:`icl_lens.studies.section5`       R&L Section 5 / App. E: Figs. 3, 6-13 (its claims in
                                         :mod:`icl_lens.studies.section5_claims`)
- :mod:`icl_lens.studies.ffn_rank`       R&L App. B.1: Fig. 14 (right), the rank of W_F
- :mod:`icl_lens.studies.across_tasks`   one layer trained with a new task per prompt
- :mod:`icl_lens.studies.li_et_al`       Li et al.'s experiment: a trained softmax layer against
                                         one gradient step of softmax regression
- :mod:`icl_lens.studies.table1`         R&L Table 1 offline (BERT on a WordNet stand-in for RTE)

Chapters: experiments, transformer_layer, across_tasks, closeness_experiment, bert.
"""
