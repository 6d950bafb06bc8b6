"""The training loop (icl_lens.training.loop.train) against SGD written out by hand on models whose
gradients are known: which step of the run the schedule is asked for, which sequence each step
reads, the epoch losses, the callbacks, and what the loop leaves behind."""

import torch

from icl_lens.training import loop


class Scalars(torch.nn.Module):
    """M models of one weight p each. A step on sequence s has loss p * a_s + b_s, so its gradient
    is a_s and the step lowers p by lr * factor * a_s."""

    def __init__(self, start, dtype=torch.float64):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor(start, dtype=dtype))
        self.seeds = list(range(len(start)))


class Sequences:
    """Epoch e's step s reads a = e * 10 + s + 1 (tokens) and b = 100 * a (targets), the same for
    every model: a step that read another step's sequence would move p by another amount."""

    def __init__(self):
        self.epochs = 0

    def epoch(self, seeds, steps, dtype, device):
        a = self.epochs * 10 + torch.arange(1, steps + 1, dtype=dtype, device=device)
        self.epochs += 1
        tokens = a.expand(len(seeds), steps).unsqueeze(-1).contiguous()
        return tokens, 100 * tokens


def errors(model, tokens, targets):
    return model.p * tokens[:, :, 0].sum(1) + targets[:, :, 0].sum(1)


class Progress:
    def __init__(self):
        self.count = 0

    def update(self, n):
        self.count += n


def test_the_schedule_sees_the_step_of_the_whole_run():
    """A run forked at epoch 1 of 2 epochs of 3 steps: the schedule is asked for steps 3, 4, 5 of the
    whole run, and with the "decay" schedule (decay from step 3 of 6) the rates are lr * (1, 2/3, 1/3)."""
    asked, decay = [], loop.decay_schedule(6, 0.5)

    def schedule(step):
        asked.append(step)
        return decay(step)

    model, data, progress, before, after = Scalars([1.0, 2.0]), Sequences(), Progress(), [], []
    history = loop.train(model, data, steps=3, epochs=2, first_epoch=1, lr=0.3, schedule=schedule,
                         step_errors=errors, progress=progress, before_epoch=before.append, after_epoch=after.append)
    assert asked == [3, 4, 5]
    assert [decay(t) for t in range(6)] == [1.0, 1.0, 1.0, 1.0, 2 / 3, 1 / 3]
    # by hand: the first epoch trained reads a = 1, 2, 3 (the data's first epoch)
    p, losses = [1.0, 2.0], [[], []]
    for a, factor in zip((1.0, 2.0, 3.0), (1.0, 2 / 3, 1 / 3)):
        for m in range(2):
            losses[m].append(p[m] * a + 100 * a)
            p[m] -= 0.3 * factor * a
    assert torch.allclose(model.p.detach(), torch.tensor(p, dtype=torch.float64), rtol=0, atol=1e-14)
    assert history.shape == (1, 2) and history.dtype == torch.float64
    assert torch.allclose(history[0], torch.tensor([sum(l) / 3 for l in losses], dtype=torch.float64), rtol=1e-15)
    assert progress.count == 3 and before == [1] and after == [2]


def test_constant_rate_two_epochs_and_what_the_loop_leaves_behind():
    """No schedule: every step at lr; epoch losses in float64 from a float32 model; subnormal
    numbers are not flushed once train returns (PyTorch's default); an empty range gives (0, M)."""
    model = Scalars([1.0], dtype=torch.float32)
    history = loop.train(model, Sequences(), steps=2, epochs=2, lr=0.01, step_errors=errors)
    p, expected = 1.0, []
    for epoch in range(2):
        seen = []
        for a in (epoch * 10 + 1.0, epoch * 10 + 2.0):
            seen.append(p * a + 100 * a)
            p -= 0.01 * a
        expected.append(sum(seen) / 2)
    assert history.dtype == torch.float64
    assert torch.allclose(history[:, 0], torch.tensor(expected, dtype=torch.float64), rtol=1e-6)
    assert abs(float(model.p) - p) < 1e-5
    assert float(torch.tensor([1e-310], dtype=torch.float64) * 0.5) > 0
    empty = loop.train(model, Sequences(), steps=2, epochs=1, first_epoch=1, lr=0.01, step_errors=errors)
    assert empty.shape == (0, 1) and empty.dtype == torch.float64


def test_fork_without_an_optimiser():
    model, stream = Scalars([1.0]), torch.Generator().manual_seed(3)
    copied, copied_stream, state = loop.fork(model, stream)
    assert state is None and copied is not model and torch.equal(copied.p, model.p)
    assert torch.equal(torch.rand(3, generator=copied_stream), torch.rand(3, generator=stream))
