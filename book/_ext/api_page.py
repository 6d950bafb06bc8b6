"""Write the API reference page ``book/api.md`` from the package itself.

Every module of ``icl_lens`` names the chapters that use it in its docstring, in a paragraph that
starts with ``Chapters:`` (file names of ``book/``, or ``none``); the page's "Used in" lines come
from there and the chapter titles from each chapter's first heading, so nothing on the page is kept
by hand. ``python book/_ext/api_page.py`` rewrites the page; ``tests/test_reference.py`` checks
that the committed page is what this script writes.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "book" / "api.md"

INTRO = """# API reference

Every public function and class of the package `icl_lens`, with its docstring, which names the
equation, lemma or figure of the paper it implements. The sections follow the package's folders:
the mathematics (one module an idea), the training machinery, the verdict rules, the studies, the
BERT patch, the figures and the tools. Each module lists the chapters that use it (from its own
docstring); the `[source]` link beside an entry opens its code.
"""

# (section title, modules in the order shown); every module of the package must be in one
SECTIONS = (
    ("The dual view (Ren & Liu)", ("attention", "kernels", "approximation", "dual", "symbolic", "tasks",
                                   "constructions", "bounds")),
    ("Modifications, baselines, context use (Ren & Liu, Sec. 4-5)", ("modifications", "baselines", "context_use")),
    ("Softmax regression (Li et al.)", ("softmax_regression", "counterexamples")),
    ("Training machinery", ("training", "training.ensemble", "training.prompt_layer", "training.data",
                            "training.loop", "training.journal")),
    ("Verdicts", ("statistics", "verdicts", "claims_table", "findings")),
    ("Studies", ("studies", "studies.section5", "studies.section5_readings", "studies.section5_measures", "studies.section5_claims", "studies.trained_layer_claims", "studies.ffn_rank",
                 "studies.across_tasks", "studies.modifications_across_tasks", "studies.li_et_al",
                 "studies.table1")),
    ("BERT (R&L Table 1)", ("bert", "bert.modify", "bert.glue", "bert.wordnet")),
    ("Figures", ("figures", "figures.style", "figures.theory", "figures.section5", "figures.prompt_layers",
                 "figures.table1", "figures.claims")),
    ("Running and tools", ("reproduce", "results", "widgets", "device", "validation")),
)
CHAPTERS_LINE = re.compile(r"^Chapters:(.*?)(?:\n\s*\n|\Z)", re.S | re.M)


def package_modules():
    """Dotted names (below ``icl_lens``) of every module and subpackage, ``__main__`` aside."""
    names = set()
    for path in (ROOT / "icl_lens").rglob("*.py"):
        parts = path.relative_to(ROOT / "icl_lens").with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts:
            names.add(".".join(parts))
    return names


def module_path(name):
    base = ROOT / "icl_lens" / pathlib.Path(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def chapters_of(name):
    """The chapters a module's docstring names (``Chapters: a, b.``); [] for ``none``."""
    docstring = ast.get_docstring(ast.parse(module_path(name).read_text())) or ""
    found = CHAPTERS_LINE.search(docstring)
    if found is None:
        raise ValueError(f"icl_lens.{name}: its docstring names no chapters (a 'Chapters:' paragraph)")
    text = " ".join(found.group(1).split()).rstrip(".")
    if text.startswith("none"):
        return []
    return [re.match(r"[\w]+", item.strip()).group(0) for item in text.split(",")]


def chapter_title(stem):
    path = ROOT / "book" / f"{stem}.md"
    if not path.exists():
        raise ValueError(f"a docstring names the chapter {stem!r}, but book/{stem}.md does not exist")
    return next(line[2:].strip() for line in path.read_text().splitlines() if line.startswith("# "))


def render():
    listed = [name for _, names in SECTIONS for name in names]
    missing, extra = package_modules() - set(listed), set(listed) - package_modules()
    if missing or extra:
        raise ValueError(f"SECTIONS must list every module once: missing {sorted(missing)}, unknown {sorted(extra)}")
    lines = [INTRO]
    for title, names in SECTIONS:
        lines.append(f"## {title}\n")
        for name in names:
            chapters = chapters_of(name)
            used = (", ".join(f"[{chapter_title(c)}]({c}.md)" for c in chapters) + "."
                    if chapters else "the other modules (no chapter calls it directly).")
            lines += [f"### `icl_lens.{name}`\n", f"Used in: {used}\n",
                      "```{eval-rst}", f".. automodule:: icl_lens.{name}", "   :members:", "```\n"]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)}")
