"""The data of the fixed-task studies: each seed's task weight, its stream of training sequences
and its fixed test set (R&L Sec. 5: one task weight W per seed, sequences drawn afresh).

Chapters: experiments, transformer_layer.
"""

from dataclasses import dataclass

import torch

from icl_lens.device import generator as make_generator
from icl_lens.tasks import RegressionTask, sample_sequences, sample_task_weight
from icl_lens.training.loop import copy_stream

# the test set of seed s is drawn from generator(TEST_SET + s), apart from its training stream
TEST_SET = 2_000_000


@dataclass
class TaskData:
    """The fixed task weight and the sequence stream of each seed."""

    task: RegressionTask
    weights: dict
    generators: dict

    def epoch(self, seeds, steps, dtype, device):
        """(models, steps, n, d) tokens and (models, steps, d_s) targets: seed seeds[m]'s stream for model m."""
        drawn = {s: sample_sequences(self.task, steps, self.weights[s], generator=self.generators[s])
                 for s in sorted(self.weights)}
        tokens = torch.stack([drawn[s][0] for s in seeds]).to(dtype=dtype, device=device)
        targets = torch.stack([drawn[s][1] for s in seeds]).to(dtype=dtype, device=device)
        return tokens, targets

    def copy(self):
        """The same streams from where they stand now, drawn independently of this one's."""
        return TaskData(self.task, self.weights, {s: copy_stream(g) for s, g in self.generators.items()})


def task_data(task, seeds):
    """Seed s draws its task weight W and then its sequences from generator(s), on cpu in float64."""
    generators = {s: make_generator(s) for s in sorted(set(seeds))}
    weights = {s: sample_task_weight(task, generator=generators[s]) for s in generators}
    return TaskData(task, weights, generators)


def test_sets(task, weights, num_sequences, offset=TEST_SET):
    """{seed: (tokens, targets)}: a fixed test set per seed, drawn apart from the training stream
    from generator(``offset`` + seed) (float64, cpu). Every model and baseline of a seed is
    measured on the same sequences."""
    return {s: sample_sequences(task, num_sequences, w, generator=make_generator(offset + s))
            for s, w in weights.items()}
