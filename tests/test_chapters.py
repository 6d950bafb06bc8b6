"""Every chapter of the book, executed top to bottom as a test (a failing assert fails the test).

The chapters are MyST notebooks; jupytext reads them and nbclient runs them in a fresh kernel with
the working directory set to the chapter's folder, as the book build does. The test suite sets
ICL_LENS_QUICK=1, so chapters use their quick sizes.
"""

import asyncio
import os
import pathlib
import sys
import time
from queue import Empty

import jupytext
import nbclient
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from kernel_replies import SLICE, read_replies_in_slices, sliced  # noqa: E402

# as in the book build: a missed wake-up holds a cell for a second, not for its timeout
read_replies_in_slices()
# per cell, seconds: quick-mode cells take seconds, so a stuck kernel fails fast here
CELL_TIMEOUT = int(os.environ.get("CHAPTER_TIMEOUT", "300"))


def toc_files():
    """The chapter files named in _toc.yml, in book order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]
    for part in toc.get("parts", []):
        names += [entry["file"] for entry in part["chapters"]]
    names += [entry["file"] for entry in toc.get("chapters", [])]
    return [ROOT / f"{name}.md" for name in names]


def is_notebook(path):
    head = path.read_text(encoding="utf-8")[:2000]
    return head.startswith("---") and "kernelspec:" in head


CHAPTERS = [path for path in toc_files() if path.exists() and is_notebook(path)]


def test_every_toc_entry_exists_and_chapters_are_found():
    missing = [str(path) for path in toc_files() if not path.exists()]
    assert not missing, missing
    assert len(CHAPTERS) >= 3


def test_kernel_messages_are_waited_for_in_slices():
    """A wait for a kernel message is cut into waits of at most SLICE seconds (a missed wake-up
    then costs a second, not the cell's timeout), returns the message when it comes, and still
    raises Empty when the caller's timeout ends."""
    waits = []

    async def get_msg(channel, timeout=None):
        waits.append(timeout)
        if len(waits) < 3:
            raise Empty
        return "reply"

    assert asyncio.run(sliced(get_msg)(None, timeout=300)) == "reply"
    assert len(waits) == 3 and max(waits) <= SLICE
    waits.clear()

    async def silent(channel, timeout=None):
        waits.append(timeout)
        await asyncio.sleep(timeout)
        raise Empty

    start = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(sliced(silent)(None, timeout=0.3))
    assert 0.3 <= time.monotonic() - start < 0.3 + SLICE and waits[0] == pytest.approx(0.3, abs=0.01)


def execute(path, working_directory):
    notebook = jupytext.read(path)
    timeout = min(CELL_TIMEOUT, int(notebook.metadata.get("mystnb", {}).get("execution_timeout", CELL_TIMEOUT)))
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(working_directory)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{path.name}: {error}", pytrace=False)
    except (TimeoutError, nbclient.exceptions.CellTimeoutError) as error:
        pytest.fail(f"{path.name}: timed out after {timeout}s per cell: {error}", pytrace=False)
    return notebook


@pytest.mark.parametrize("path", CHAPTERS, ids=[path.stem for path in CHAPTERS])
def test_chapter_executes(path, tmp_path_factory, monkeypatch):
    """From the repository root, as Binder or a reader may run it, so that no path depends on the
    working directory. The run from the chapter's folder is the book build's own
    (tests/test_book_build.py executes every chapter there, warnings as errors), so it is not
    repeated here. The chapter writes its results under a folder of this test session (the
    kernel inherits ICL_LENS_RESULTS), so the repository's results/ is the book build's alone."""
    monkeypatch.setenv("ICL_LENS_RESULTS", str(tmp_path_factory.getbasetemp() / "results"))
    notebook = execute(path, ROOT)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors
