"""The data of the regression studies: each seed's stream of training sequences and its fixed test
set. Section 5's protocol (R&L Sec. 5, App. E.1): one task weight W per seed, sequences drawn afresh
(:class:`TaskData`); a new task per prompt (the protocol R&L leave open): a fresh W for every
sequence (:class:`NewTaskData`).

Chapters: experiments, transformer_layer, modifications_across_tasks.
"""

from dataclasses import dataclass

import torch

from icl_lens.device import generator as make_generator
from icl_lens.tasks import LINKS, RegressionTask, sample_sequences, sample_task_weight
from icl_lens.training.loop import copy_stream
from icl_lens.validation import check_positive_int

# the test set of seed s is drawn from generator(TEST_SET + s), apart from its training stream
TEST_SET = 2_000_000


@dataclass
class TaskData:
    """The fixed task weight and the sequence stream of each seed."""

    task: RegressionTask
    weights: dict
    generators: dict
    fixed_task = True

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


def new_task_sequences(task, count, *, generator=None):
    """``count`` sequences of ``task``, each with its own task weight W ~ N(0, 1) (float64, cpu):
    tokens (count, num_tokens, token_dim) with the query's label 0, targets (count, output_dim).
    Drawn as :func:`icl_lens.tasks.sample_sequences` draws one task's, W first."""
    check_positive_int(count, "count")
    weights = torch.randn(count, task.output_dim, task.input_dim, generator=generator, dtype=torch.float64)
    uniform = torch.rand(count, task.num_tokens, task.input_dim, generator=generator, dtype=torch.float64)
    inputs = task.input_low + (task.input_high - task.input_low) * uniform
    labels = LINKS[task.kind](inputs @ weights.transpose(-1, -2))
    targets = labels[:, -1, :].clone()
    labels[:, -1, :] = 0.0
    return torch.cat([inputs, labels], dim=-1), targets


# the one task weight of a seed that the new-task protocol still uses: the sequence of the
# Theorem 3.1 check on the trained layer (an identity on any sequence) is drawn with it
CHECK_WEIGHT = 9_000_000


@dataclass
class NewTaskData:
    """The sequence stream of each seed, a new task weight W for every sequence; ``weights`` holds
    one W per seed for the checks that need a sequence of one task (not for training)."""

    task: RegressionTask
    generators: dict
    weights: dict
    fixed_task = False

    def epoch(self, seeds, steps, dtype, device):
        """(models, steps, n, d) tokens and (models, steps, d_s) targets: seed seeds[m]'s stream for model m."""
        drawn = {s: new_task_sequences(self.task, steps, generator=self.generators[s]) for s in sorted(self.generators)}
        tokens = torch.stack([drawn[s][0] for s in seeds]).to(dtype=dtype, device=device)
        targets = torch.stack([drawn[s][1] for s in seeds]).to(dtype=dtype, device=device)
        return tokens, targets

    def copy(self):
        """The same streams from where they stand now, drawn independently of this one's."""
        return NewTaskData(self.task, {s: copy_stream(g) for s, g in self.generators.items()}, self.weights)


def new_task_data(task, seeds):
    """Seed s draws its sequences from generator(s), each with its own W (float64, cpu)."""
    generators = {s: make_generator(s) for s in sorted(set(seeds))}
    weights = {s: sample_task_weight(task, generator=make_generator(CHECK_WEIGHT + s)) for s in generators}
    return NewTaskData(task, generators, weights)


def new_task_test_sets(task, seeds, num_sequences, offset=TEST_SET):
    """{seed: (tokens, targets)}: :func:`test_sets` for the new-task protocol, a fresh W for every
    test sequence, from generator(``offset`` + seed)."""
    return {s: new_task_sequences(task, num_sequences, generator=make_generator(offset + s)) for s in sorted(set(seeds))}
