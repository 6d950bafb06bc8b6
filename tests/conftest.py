import pytest
import torch

from icl_lens.device import generator

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def rng():
    return generator(1234)


def random_layer_weights(d_in, d_out, generator, dtype=torch.float64, device="cpu"):
    """W_Q, W_K, W_V with N(0, 1/d_in) entries."""
    return tuple(
        (torch.randn(d_out, d_in, generator=generator, dtype=dtype) / d_in**0.5).to(device) for _ in range(3)
    )
