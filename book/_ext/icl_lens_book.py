"""Small fixes to the built pages, so that they load with no JavaScript error and nothing missing.

1. The thebe configuration script is inserted twice (sphinx-thebe's set-up runs twice under Jupyter
   Book), declaring ``const THEBE_JS_URL`` twice, a SyntaxError in the browser: after the build,
   identical inline scripts are kept once per page. The theme's first-visit mode "" becomes "auto".
2. The ipywidgets HTML manager typesets widget labels with the MathJax 2 call ``MathJax.Hub.Queue``;
   the book serves MathJax 3, which has no ``Hub``. ``icl_lens_shims.js`` maps the call to MathJax 3.
3. The HTML manager loads its icon fonts from ``<page folder>/@jupyter-widgets/html-manager/dist/``;
   copy them there from the vendored package.
4. The package's docstrings are plain text written for ``help()`` (norms as ``|x|``, products as
   ``a * b``, formulas indented on lines of their own). For the API reference, autodoc reads them
   as reStructuredText: ``plain_docstring`` escapes the characters that reStructuredText would take
   as markup and turns indented formula lines into literal blocks, so that they show as written; a
   module's ``Chapters:`` paragraph is left out (the page's "Used in" line shows it, ``api_page.py``).
5. The chapters run in this process (MyST-NB's nbclient): its kernel channels wait in slices of a
   second, so a missed wake-up cannot hold a cell for its whole timeout (``kernel_replies.py``).
"""

import pathlib
import re
import shutil

from kernel_replies import read_replies_in_slices

HERE = pathlib.Path(__file__).resolve().parent
FONT_SUFFIXES = {".woff", ".woff2", ".ttf", ".eot", ".svg"}


INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>\n?", re.DOTALL)


def drop_duplicate_inline_scripts(html):
    """Keep the first of identical inline <script> elements (a page loads each once)."""
    seen = set()

    def keep_first(match):
        if match.group(1) in seen:
            return ""
        seen.add(match.group(1))
        return match.group(0)

    return INLINE_SCRIPT.sub(keep_first, html)


def fix_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    outdir = pathlib.Path(app.outdir)
    for page in outdir.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        # on a first visit the theme reads an empty mode from localStorage and logs an error
        fixed = drop_duplicate_inline_scripts(text).replace(
            'dataset.mode = localStorage.getItem("mode") || "";', 'dataset.mode = localStorage.getItem("mode") || "auto";')
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")
    copy_widget_fonts(outdir, pathlib.Path(app.srcdir))


def copy_widget_fonts(outdir, srcdir):
    source = srcdir / "js" / "node_modules" / "@jupyter-widgets" / "html-manager" / "dist"
    if not source.exists():
        return
    fonts = [path for path in source.iterdir() if path.suffix in FONT_SUFFIXES]
    for folder in {outdir, *(page.parent for page in outdir.rglob("*.html"))}:
        if "_static" in folder.parts:
            continue
        target = folder / "@jupyter-widgets" / "html-manager" / "dist"
        target.mkdir(parents=True, exist_ok=True)
        for font in fonts:
            shutil.copy2(font, target / font.name)


LIST_ITEM = re.compile(r"^\s*([*-]|\d+\.)\s")
LITERAL = re.compile(r"(``.+?``|:\w+:`[^`]+`)")


def escape_markup(line):
    """Backslash ``|`` and ``*`` outside ``literals`` and roles; a leading list bullet stays."""
    bullet = LIST_ITEM.match(line)
    head, rest = (line[:bullet.end()], line[bullet.end():]) if bullet else ("", line)
    parts = LITERAL.split(rest)
    for k in range(0, len(parts), 2):   # even parts are outside literals
        parts[k] = parts[k].replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")
    return head + "".join(parts)


def drop_chapters_paragraph(lines):
    """A module docstring's ``Chapters:`` paragraph, which the API page shows as its "Used in"
    line (``api_page.py``), left out of the module's text there."""
    start = next((i for i, line in enumerate(lines) if line.startswith("Chapters:")), None)
    if start is None:
        return lines
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[:start] + lines[end + 1:]


def plain_docstring(app, what, name, obj, options, lines):
    """Rewrite ``lines`` in place: escaped paragraphs, literal blocks for indented lines that do
    not continue a list item (autodoc has already removed the docstring's common indentation)."""
    if what == "module":
        lines[:] = drop_chapters_paragraph(lines)
    out, in_block, item_open = [], False, False
    for line in lines:
        indented = line.startswith(" ") and line.strip()
        if not line.strip():
            out.append(line)
            continue
        if indented and (in_block or not item_open):
            if not in_block:
                if out and out[-1].strip():
                    out.append("")
                out += ["::", ""]
                in_block = True
            out.append("    " + line)
            continue
        if in_block and out[-1].strip():
            out.append("")
        in_block = False
        if not indented:
            item_open = bool(LIST_ITEM.match(line))
        out.append(escape_markup(line))
    lines[:] = out


def setup(app):
    read_replies_in_slices()
    app.connect("build-finished", fix_pages)
    app.connect("autodoc-process-docstring", plain_docstring)
    app.connect("builder-inited", lambda app: app.config.html_static_path.append(str(HERE / "static")))
    app.add_js_file("icl_lens_shims.js", loading_method="defer", priority=900)
    app.add_css_file("icl_lens_book.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
