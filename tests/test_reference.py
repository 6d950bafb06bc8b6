"""The book's pointers into the code: the intro's result-to-code map and the API reference page."""

import importlib
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("api_page", ROOT / "book" / "_ext" / "api_page.py")
api_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_page)
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
    documented = set(re.findall(r"^\.\. automodule:: icl_lens\.([\w.]+)$", page, re.M))
    assert documented == api_page.package_modules(), api_page.package_modules() ^ documented
    for chapter in re.findall(r"\]\((\w+)\.md\)", page):
        assert (ROOT / "book" / f"{chapter}.md").exists(), chapter


def test_api_reference_is_written_from_the_docstrings():
    """The page's "Used in" lines come from each module's ``Chapters:`` paragraph: the committed
    page is what ``python book/_ext/api_page.py`` writes now."""
    assert (ROOT / "book" / "api.md").read_text() == api_page.render(), "run: python book/_ext/api_page.py"


def test_a_module_without_its_chapters_or_with_a_wrong_one_is_refused(tmp_path, monkeypatch):
    (tmp_path / "icl_lens").mkdir()
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "kernels.md").write_text("# Kernels\n")
    monkeypatch.setattr(api_page, "ROOT", tmp_path)
    (tmp_path / "icl_lens" / "kernels.py").write_text('"""Random features.\n\nChapters: kernels.\n"""\n')
    assert api_page.chapters_of("kernels") == ["kernels"]
    (tmp_path / "icl_lens" / "kernels.py").write_text('"""Random features."""\n')
    with pytest.raises(ValueError, match="names no chapters"):
        api_page.chapters_of("kernels")
    (tmp_path / "icl_lens" / "kernels.py").write_text('"""Random features.\n\nChapters: kernel.\n"""\n')
    with pytest.raises(ValueError, match="does not exist"):
        api_page.chapter_title(api_page.chapters_of("kernels")[0])
