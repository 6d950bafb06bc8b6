"""The training machinery the studies share: the trainable layers and the loop toolkit.

- :mod:`icl_lens.training.ensemble`      M attention layers with every modification of App. D as a
                                         switch, stacked and trained as one (Section 5, Fig. 14)
- :mod:`icl_lens.training.prompt_layer`  one attention layer read at the query, trained on prompts
                                         with a task each (across tasks, Li et al.)
- :mod:`icl_lens.training.data`          each seed's task weight, training stream and test set
- :mod:`icl_lens.training.loop`          the SGD step, the "decay" schedule, the half-length fork,
                                         the ensemble's loop, the process pool

Chapters: experiments, modifications, across_tasks, closeness_experiment, transformer_layer.
"""
