"""Every page of the built book, opened in headless Chromium as a reader would open it.

For each page: no JavaScript error, no request leaves the machine, MathJax typesets its math with no
error node, every image loads, every internal link points at a file of the build, and pages with
widgets render them from the embedded state. Nothing is wider than its box (a code line, a printed
line, a display equation, a table, an image or an API signature that a reader would have to scroll
sideways to read, and the page itself no wider than the window), no figure caption shows a number
(it would clash with the papers' figure numbers), and no live explorer (an ipywidgets ``interactive``, which needs a kernel) is on the page.
A screenshot of each page goes to ``screenshots/``.
"""

import pathlib
import shutil
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--disable-sync"]


@pytest.fixture(scope="module")
def html_pages(built_book):
    assert CHROMIUM, "headless Chromium is needed: apt-get install chromium (scripts/setup.sh does this as root)"
    pages = sorted(p for p in built_book.rglob("*.html")
                   if "_static" not in p.parts and p.name not in {"search.html", "genindex.html"})
    assert len(pages) >= 10
    return built_book, pages


# elements whose content is wider than the box they are shown in (2 px of slack for rounding);
# MathJax puts a display equation in an mjx-container that scrolls; images are scaled by CSS,
# so for them it is the rendered width against the text column's
OVERFLOW_SCRIPT = """() => {
  const found = [];
  const column = document.querySelector('article') || document.body;
  const right = column.getBoundingClientRect().right;
  // a wide table is shown in a container that scrolls (the theme's, or docutils' wrapper): check both
  const boxes = 'pre, mjx-container[display="true"], table, .pst-scrollable-table-container, ' +
                '.table-wrapper, article img, .widget-box, dl.py dt';
  for (const el of column.querySelectorAll(boxes)) {
    const box = el.tagName === 'IMG' ? el.getBoundingClientRect().right - right : el.scrollWidth - el.clientWidth;
    if (box > 2 && el.offsetParent !== null) {
      found.push(el.tagName.toLowerCase() + ': ' + (el.textContent || el.src || '').trim().slice(0, 60));
    }
  }
  // the page itself: nothing may make the window scroll sideways
  const page = document.documentElement.scrollWidth - window.innerWidth;
  if (page > 2) {
    found.push('page: ' + page + ' px wider than the window');
  }
  return found;
}"""


# a reader holds a page of at most this many pixels at 1280 px wide (the API reference and the
# source listings are looked things up in, not read through)
MAX_HEIGHT = 13_500


def check_page(browser, html, page_path, screenshots, *, source_listing=False, reference=False):
    """The problems of one page; a ``source_listing`` (viewcode's copy of a module) may scroll
    sideways, as an editor would, and it or a ``reference`` page may be taller than MAX_HEIGHT."""
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    errors, remote = [], []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)

    def route(route_request):
        url = route_request.request.url
        if url.startswith(("file://", "data:", "blob:", "about:")):
            return route_request.continue_()
        remote.append(url)
        return route_request.abort()

    page.route("**/*", route)
    page.goto(page_path.as_uri(), wait_until="load")
    # the root index.html redirects to the first chapter: wait (across the navigation) for the page that stays
    page.wait_for_function("() => document.readyState === 'complete' && "
                           "!document.querySelector('meta[http-equiv=\"Refresh\" i]')", timeout=30000)
    has_math = page.evaluate("() => document.querySelectorAll('.math, span.math, div.math').length")
    if has_math:
        # MathJax's configuration object can exist before its startup does: wait for the startup itself
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30000)
        page.evaluate("() => MathJax.startup.promise")
    typeset = page.evaluate("() => document.querySelectorAll('mjx-container').length")
    math_errors = page.evaluate("() => document.querySelectorAll('mjx-merror').length")
    images = page.evaluate("() => Array.from(document.images).filter(i => !i.src.includes('logo'))"
                           ".map(i => [i.src.slice(0, 80), i.complete && i.naturalWidth > 0])")
    links = page.evaluate("() => Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))")
    # the root index.html redirects to the first chapter: links resolve against where the browser is
    landed = pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(page.url).path))
    has_widgets = page.evaluate("() => document.querySelectorAll('script[type=\"application/vnd.jupyter.widget-view+json\"]').length")
    if has_widgets:
        page.wait_for_selector(".widget-slider, .jupyter-widgets", timeout=20000)
    rendered_widgets = page.evaluate("() => document.querySelectorAll('.widget-slider, .widget-dropdown').length")
    live_controls = page.evaluate("() => document.querySelectorAll('.widget-interact').length")
    too_wide = page.evaluate(OVERFLOW_SCRIPT)
    height = page.evaluate("() => document.documentElement.scrollHeight")
    # the book's figures are "Book figure N.M": a bare "Fig. N" would clash with the papers'
    numbered = page.evaluate("() => Array.from(document.querySelectorAll('figcaption .caption-number'))"
                             ".filter(e => e.offsetParent !== null && !/^Book figure \\d/.test(e.textContent))"
                             ".length")
    page.screenshot(path=str(screenshots / f"{page_path.stem}.png"), full_page=False)
    page.close()

    problems = []
    if errors:
        problems.append(f"JavaScript errors: {errors[:3]}")
    if remote:
        problems.append(f"requests off the machine: {remote[:3]}")
    if has_math and not typeset:
        problems.append("math present but MathJax typeset nothing")
    if math_errors:
        problems.append(f"{math_errors} MathJax error nodes")
    broken = [src for src, ok in images if not ok]
    if broken:
        problems.append(f"images not loaded: {broken[:3]}")
    for href in links:
        if href.startswith(("http:", "https:", "mailto:", "#", "javascript:")):
            continue
        target = urllib.parse.unquote(href.split("#")[0])
        if target and not (landed.parent / target).resolve().exists():
            problems.append(f"broken internal link {href}")
    if has_widgets and not rendered_widgets:
        problems.append("widget state embedded but no widget rendered")
    if live_controls:
        problems.append(f"{live_controls} live explorer(s) that need a kernel")
    if numbered:
        problems.append(f"{numbered} numbered figure caption(s) without 'Book figure': they would clash with the "
                        "papers' numbers")
    if too_wide and not source_listing:
        problems.append(f"wider than their box: {too_wide[:4]}")
    if height > MAX_HEIGHT and not (source_listing or reference):
        problems.append(f"taller than {MAX_HEIGHT} px: {height} px")
    return problems, {"math": typeset, "images": len(images), "widgets": rendered_widgets, "height": height}


def test_every_page_in_chromium(html_pages):
    from playwright.sync_api import sync_playwright

    html, pages = html_pages
    screenshots = ROOT / "screenshots"
    screenshots.mkdir(exist_ok=True)
    report, failures = {}, {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for page_path in pages:
            problems, counts = check_page(browser, html, page_path, screenshots,
                                          source_listing="_modules" in page_path.parts,
                                          reference=page_path.name == "api.html")
            report[str(page_path.relative_to(html))] = counts
            if problems:
                failures[str(page_path.relative_to(html))] = problems
        browser.close()
    print(report)
    assert not failures, failures
    chapters = [name for name in report if name.startswith("book/")
                and name not in {"book/references.html", "book/api.html"}]
    assert sum(report[name]["math"] > 0 for name in chapters) >= len(chapters) - 1
    assert sum(report[name]["widgets"] > 0 for name in chapters) >= 1
    assert report["book/claims.html"]["images"] >= 1   # the forest plot of every claim


def test_the_checker_catches_a_broken_page(tmp_path):
    """A page with a remote script, a missing image and bad math is reported, so passing means something."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM
    page_path = tmp_path / "broken.html"
    page_path.write_text(
        "<html><body><article style='width:300px'><pre style='overflow:auto'>" + "x" * 200 + "</pre>"
        "<div class='pst-scrollable-table-container' style='overflow:auto'><table><tr><td>"
        + "widecell" * 60 + "</td></tr></table></div>"
        "<div class='widget-interact'>a live explorer</div>"
        "<div class='widget-box' style='width:100px;overflow:auto'><div style='width:400px'>frame</div></div>"
        "</article>"
        "<img src='missing.png'><a href='nowhere.html'>x</a><div style='width:3000px'>too wide a page</div>"
        "<div style='height:14000px'>too tall a page</div>"
        "<figure><figcaption><span class='caption-number'>Fig. 3 </span>a numbered caption</figcaption></figure>"
        "<script src='https://cdn.example.invalid/x.js'></script><script>undefined_function()</script></body></html>")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        problems, _ = check_page(browser, tmp_path, page_path, tmp_path)
        browser.close()
    text = " ".join(problems)
    assert "div: widecell" in text   # the scrolling table container is named
    for expected in ("JavaScript errors", "requests off the machine", "images not loaded", "broken internal link",
                     "wider than their box", "live explorer", "wider than the window", "numbered figure",
                     "taller than"):
        assert expected in text, (expected, problems)


def test_frame_explorer_moves_without_a_kernel(html_pages):
    """Pressing the arrow key on the first slider of a chapter switches the frame shown, in plain HTML."""
    from playwright.sync_api import sync_playwright

    html, _ = html_pages
    visible_images = ("() => Array.from(document.querySelectorAll('.jupyter-widgets img'))"
                      ".filter(i => i.offsetParent !== null).map(i => i.src)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        for chapter in ("theorem_3_1", "kernels", "modifications"):
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto((html / "book" / f"{chapter}.html").as_uri(), wait_until="load")
            page.wait_for_selector(".noUi-handle", timeout=20000)
            before = page.evaluate(visible_images)
            page.locator(".noUi-handle").first.focus()
            page.keyboard.press("ArrowRight")
            page.wait_for_timeout(300)
            after = page.evaluate(visible_images)
            page.close()
            assert before and after and before[0] != after[0], chapter
        browser.close()


def test_the_claims_filter_shows_the_rows_of_one_verdict(html_pages):
    """Choosing a verdict above the claims table leaves exactly the rows of book/data/claims.json with
    that verdict visible, in the static page; choosing "any" shows every row again."""
    import json

    from playwright.sync_api import sync_playwright

    html, _ = html_pages
    saved = json.loads((ROOT / "book" / "data" / "claims.json").read_text())["claims"]
    visible_rows = ("() => Array.from(document.querySelectorAll('section#the-claims table tbody tr'))"
                    ".filter(r => r.offsetParent !== null).length")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto((html / "book" / "claims.html").as_uri(), wait_until="load")
        assert page.evaluate(visible_rows) == len(saved)
        for verdict in ("agrees", "disagrees", "inconclusive"):
            page.select_option("#verdict-filter", verdict)
            assert page.evaluate(visible_rows) == sum(row["verdict"] == verdict for row in saved), verdict
        page.select_option("#verdict-filter", "")
        assert page.evaluate(visible_rows) == len(saved)
        browser.close()
