import concurrent.futures
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


class RecordingPool:
    """Stands in for the process pool of icl_lens.training.loop.run_jobs (patched onto
    ``loop.ProcessPoolExecutor``): runs each job in this process when it is submitted, and
    records the order the latest pool was given its jobs in (``RecordingPool.submitted``)."""

    submitted = []

    def __init__(self, **_):
        RecordingPool.submitted = []

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def submit(self, in_worker, function, job, threads):
        # the job itself, without the worker's thread setting (this is the test's process)
        future = concurrent.futures.Future()
        future.set_result(function(*job, device="cpu"))
        self.submitted.append(job)
        return future
