"""The book builds with warnings as errors, serves everything itself, and a failing chapter fails it."""

import pathlib
import re
import shutil

import yaml

from conftest import build_book

ROOT = pathlib.Path(__file__).resolve().parents[1]
REMOTE = re.compile(r"""(?:src|href)=["'](https?:)?//(?!mybinder\.org|github\.com)[^"']+\.(?:js|css)""")


def test_every_chapter_is_rendered(built_book):
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    for name in files:
        assert (built_book / f"{name}.html").exists(), name


def test_no_page_loads_scripts_or_styles_from_the_network(built_book):
    for page in built_book.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        offenders = [m.group(0) for m in REMOTE.finditer(text)]
        assert not offenders, f"{page.name}: {offenders[:3]}"
    assert (built_book / "_static" / "mathjax" / "tex-chtml.js").exists()
    assert (built_book / "_static" / "require.js").exists()
    assert (built_book / "_static" / "html-manager" / "embed-amd.js").exists()


def test_widget_state_is_embedded_for_static_pages(built_book):
    page = (built_book / "book" / "theorem_3_1.html").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-state+json" in page
    assert '"selected_index"' in page or "StackModel" in page


def test_a_failing_check_fails_the_build(tmp_path):
    source = tmp_path / "broken"
    (source / "book").mkdir(parents=True)
    shutil.copy(ROOT / "_config.yml", source / "_config.yml")
    shutil.copy(ROOT / "book" / "references.bib", source / "book" / "references.bib")
    (source / "_vendor").symlink_to(ROOT / "_vendor")
    (source / "book" / "_ext").symlink_to(ROOT / "book" / "_ext")
    (source / "_toc.yml").write_text("format: jb-book\nroot: book/broken\n")
    header = (ROOT / "book" / "theorem_3_1.md").read_text().split("---", 2)[1]
    (source / "book" / "broken.md").write_text(
        f"---{header}---\n\n# Broken\n\n```{{code-cell}} ipython3\nassert 1 + 1 == 3, 'a theorem failed'\n```\n"
    )
    result = build_book(source, tmp_path / "out")
    assert result.returncode != 0
    assert "a theorem failed" in result.stdout + result.stderr


def test_environment_yml_pins_match_pyproject():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        pins |= set(extra)
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    listed = {line for line in pip_section if not line.startswith("--")}
    assert {pin.lower() for pin in listed} == {pin.lower() for pin in pins}
