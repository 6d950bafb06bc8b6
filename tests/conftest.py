import os
import pathlib
import subprocess
import sys

import pytest
import torch

from icl_lens.device import generator
from icl_lens.reproduce import QUICK_RUNS

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session", autouse=True)
def quick_runs_made_once(tmp_path_factory):
    """The chapters' quick runs (``reproduce all --quick`` and each study's) are made once in this
    session and copied from then on (icl_lens.reproduce.quick_reproduction): the chapter run from
    the repository root, the book build's run from the chapter's folder and the tests that check
    the quick runs' files all read one run, and each still executes every cell it has."""
    os.environ[QUICK_RUNS] = str(tmp_path_factory.mktemp("quick-runs"))
    yield
    del os.environ[QUICK_RUNS]


@pytest.fixture
def rng():
    return generator(1234)


def random_layer_weights(d_in, d_out, generator, dtype=torch.float64, device="cpu"):
    """W_Q, W_K, W_V with N(0, 1/d_in) entries."""
    return tuple(
        (torch.randn(d_out, d_in, generator=generator, dtype=dtype) / d_in**0.5).to(device) for _ in range(3)
    )


ROOT = pathlib.Path(__file__).resolve().parents[1]


def build_book(source, output):
    """jupyter-book build with warnings as errors, every chapter executed; returns the CompletedProcess."""
    return subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "jupyter-book"), "build", str(source), "--path-output", str(output),
         "-W", "--keep-going", "--all"],
        capture_output=True, text=True, timeout=1500,
    )


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """The whole book, built once per test session (quick mode under scripts/test.sh): its html folder."""
    output = tmp_path_factory.mktemp("book")
    result = build_book(ROOT, output)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return output / "_build" / "html"
