"""The book's pointers into the code: the intro's result-to-code map and the API reference page."""

import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = re.compile(r"\{py:obj\}`[^`<]*<(icl_lens(?:\.\w+)+)>`")


def resolve(dotted):
    """Import the object a dotted path names (module, then attributes)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def test_result_map_points_at_code_that_exists():
    intro = (ROOT / "book" / "intro.md").read_text()
    rows = [line for line in intro.splitlines() if line.startswith("| ") and "{py:obj}" in line]
    assert len(rows) >= 30
    for row in rows:
        target = TARGET.search(row).group(1)
        assert callable(resolve(target)), target
        chapter = re.search(r"\]\((\w+)\.md\)", row).group(1)
        assert (ROOT / "book" / f"{chapter}.md").exists(), chapter


def test_resolve_fails_on_a_name_that_is_gone():
    with pytest.raises(AttributeError):
        resolve("icl_lens.dual.no_such_function")


def test_api_reference_documents_every_module_and_links_real_chapters():
    page = (ROOT / "book" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. automodule:: icl_lens\.(\w+)$", page, re.M))
    modules = {path.stem for path in (ROOT / "icl_lens").glob("*.py") if not path.stem.startswith("__")}
    assert documented == modules, modules ^ documented
    for chapter in re.findall(r"\]\((\w+)\.md\)", page):
        assert (ROOT / "book" / f"{chapter}.md").exists(), chapter
