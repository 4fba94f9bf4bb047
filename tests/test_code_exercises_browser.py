"""The website grades the plain-Python code exercises in the browser: Pyodide, in a Web Worker,
runs the reader's code against the cases CodeExercise.browser_export() wrote into the page, and
gives the verdict and message the Python grader gives, for the solution, the stub and every
planted wrong version (tests/test_code_exercises.py). A loop that never ends is stopped after the
time limit with the case named, and the page stays responsive meanwhile. Nothing is fetched from
outside the page's own server.

Most tests build their page here from the exercises' own HTML and the site's scripts, so they run
without the book (they need `make assets`: Pyodide copied from node_modules); one checks the built
site carries the graders (`make book`), and test_site's code-exercise test grades each built chapter's."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from inference_course.code_exercises import (BROWSER_CLASS, BROWSER_RERUN, BROWSER_TIME_LIMIT_S, NOT_IMPLEMENTED,
                                             timed_out_message)
from test_code_exercises import ALL, WRONG, define
from test_site import SITE, press_check, serve_folder, site_pages

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "book" / "_static"
PYODIDE = ROOT / "book" / "_static_offline" / "pyodide"
GRADED = [ex for ex in ALL if ex.browser_export() is not None]


def answers(ex) -> list[str]:
    """The solution, the stub, each planted wrong version, and two more ways to be wrong."""
    return ([ex.solution, ex.stub] + [source for wrong_ex, _, source, _ in WRONG if wrong_ex is ex]
            + [f"def {ex.name}(*args):\n    raise ValueError('not this way')\n",
               f"def {ex.name}(*args):\n    return None\n"])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A page holding every browser-graded exercise, with the site's scripts and Pyodide."""
    if not (PYODIDE / "pyodide.mjs").is_file():
        pytest.fail(f"{PYODIDE} is missing: run `make assets` (npm ci, then scripts/offline_assets.py)")
    root = tmp_path_factory.mktemp("site")
    static = root / "_static"
    static.mkdir()
    for name in ("code_exercises.js", "code_exercises_worker.js", "course.css"):
        shutil.copy2(STATIC / name, static / name)
    shutil.copytree(PYODIDE, static / "pyodide")
    body = "\n".join(f'<section id="{ex.name}">{ex._static_html()}</section>' for ex in GRADED)
    (root / "index.html").write_text(
        '<!doctype html><html><head><meta charset="utf-8"><link rel="stylesheet" href="_static/course.css">'
        f'<script defer src="_static/code_exercises.js"></script></head><body>{body}</body></html>')
    with serve_folder(root) as url:
        yield url


@pytest.fixture(scope="module")
def page(browser, site):
    """One tab on the page; every request it makes (workers included) is recorded."""
    context = browser.new_context(service_workers="block")
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(site, wait_until="load")
    yield pg
    context.close()
    # The workers' requests are seen too (Pyodide's runtime is fetched by a worker), so none left.
    assert any(u.endswith("/_static/pyodide/pyodide.asm.wasm") for u in requests), requests
    external = [u for u in requests if urlsplit(u).netloc != urlsplit(site).netloc]
    assert not external, f"requests left the page's server: {external[:5]}"
    assert not errors, errors


def check(pg, ex, source: str, timeout_s: float = 120) -> tuple[bool, str]:
    """Type `source` into the exercise's editor, press Check, wait for the verdict."""
    return press_check(pg, pg.locator(f"#{ex.name} .{BROWSER_CLASS}"), source, timeout_s)


def test_every_chapter_has_exercises_graded_in_the_browser(page):
    names = {ex.name for ex in GRADED}
    assert len(GRADED) >= 7, names
    assert page.locator(f".{BROWSER_CLASS}:visible").count() == len(GRADED)   # the script showed each


@pytest.mark.parametrize("ex", GRADED, ids=lambda ex: ex.name)
def test_browser_and_python_give_the_same_verdicts(page, ex):
    mismatches = []
    for source in answers(ex):
        python = ex.grade(define(source, ex.name), rerun=BROWSER_RERUN)
        browser = check(page, ex, source)
        if browser != (python.correct, python.message):
            mismatches.append(f"{source!r}\n  python:  {python}\n  browser: {browser}")
    assert not mismatches, "\n".join(mismatches)


def test_code_that_does_not_compile_is_reported(page):
    ex = GRADED[0]
    correct, message = check(page, ex, f"def {ex.name}(:\n    pass\n")
    assert not correct and message.startswith("Your code did not run: SyntaxError")


def test_shift_enter_checks_and_tab_indents(page):
    ex = GRADED[0]
    editor = page.locator(f"#{ex.name} .{BROWSER_CLASS} textarea")
    editor.fill("")
    editor.press("Tab")
    assert editor.input_value() == "    "
    editor.fill(ex.solution)
    # the box grows with its code: no scrolling inside it
    assert editor.evaluate("el => el.rows") >= ex.solution.count("\n") + 1
    assert editor.evaluate("el => el.scrollHeight <= el.clientHeight + 1")
    editor.press("Shift+Enter")
    page.wait_for_function(f"document.querySelector('#{ex.name} .{BROWSER_CLASS}').dataset.state === 'done'",
                           timeout=120_000)
    assert page.locator(f"#{ex.name} output").text_content().startswith("Correct: all")


def test_an_endless_loop_is_stopped_and_its_case_named(page):
    ex = next(ex for ex in GRADED if ex.name == "accept_greedy")
    export = ex.browser_export()
    hangs = ex.solution.replace("    n = 0\n", "    n = 0\n    while not drafted:\n        pass\n")
    stopped = 5   # the first case with an empty draft
    assert export["cases"][stopped]["label"] == "no draft (γ = 0): the target's own token"
    assert check(page, ex, ex.solution)[0]   # the page's Python is up: the loop below is what runs
    root = page.locator(f"#{ex.name} .{BROWSER_CLASS}")
    root.locator("textarea").fill(hangs)
    started = time.perf_counter()
    root.locator("button").click()
    page.wait_for_function(f"document.querySelector('#{ex.name} output').textContent.startsWith('Running')",
                           timeout=120_000)
    # The loop runs in the worker: the page still answers at once.
    t = time.perf_counter()
    assert page.evaluate("() => 1 + 1") == 2 and time.perf_counter() - t < 1.0
    page.wait_for_function(f"document.querySelector('#{ex.name} .{BROWSER_CLASS}').dataset.state === 'done'",
                           timeout=120_000)
    message = root.locator("output").text_content()
    assert message == timed_out_message(export["cases"][stopped]["label"], BROWSER_TIME_LIMIT_S,
                                        export["cases"][stopped]["shown"], ex.hint), message
    assert "Inputs: drafted=[], target_choice=[3]." in message
    assert time.perf_counter() - started >= export["time_limit_s"]
    # A fresh worker grades the next Check.
    assert check(page, ex, ex.solution)[0]
    assert check(page, ex, "while True:\n    pass\n") == (False, export["no_case"])


def test_the_pages_exercises_share_one_python_and_take_turns(browser, site):
    """Python starts once for the page (its runtime fetched once), whichever exercise is checked; two
    Checks pressed together are graded one after the other, each with its own verdict."""
    context = browser.new_context(service_workers="block")
    wasm: list[str] = []
    context.on("request", lambda r: wasm.append(r.url) if r.url.endswith("/pyodide.asm.wasm") else None)
    try:
        pg = context.new_page()
        pg.goto(site, wait_until="load")
        first, second, third = GRADED[:3]
        assert check(pg, first, first.solution)[0]
        correct, message = check(pg, second, second.stub)
        assert not correct and message.startswith(f"{NOT_IMPLEMENTED}: fill in {second.name}() and {BROWSER_RERUN}."), message
        roots = [pg.locator(f"#{ex.name} .{BROWSER_CLASS}") for ex in (first, third)]
        for root, source in zip(roots, (first.stub, third.solution)):
            root.locator("textarea").fill(source)
        # Both pressed in one task of the page's, the second's message read in it: no answer from Python
        # can arrive in between. (Two Playwright clicks, a second apart on a busy machine, let the first
        # check finish before the second was pressed, and the test failed.)
        waiting = pg.evaluate("""([sel, a, b]) => {
            const roots = [a, b].map(id => document.querySelector(`#${id} .${sel}`));
            roots.forEach(root => root.querySelector("button").click());
            return roots[1].querySelector("output").textContent;
        }""", [BROWSER_CLASS, first.name, third.name])
        assert waiting.startswith("Waiting for another exercise"), waiting
        for root in roots:
            pg.wait_for_function("el => el.dataset.state === 'done'", arg=root.element_handle(), timeout=120_000)
        assert roots[0].locator("output").text_content().startswith(NOT_IMPLEMENTED)
        assert roots[1].locator("output").text_content().startswith("Correct: all")
        assert len(wasm) == 1, wasm
    finally:
        context.close()


def _graded_pages() -> dict[str, int]:
    """Each built page and how many browser-graded exercises it carries."""
    return {page: (SITE / page).read_text().count(f'class="{BROWSER_CLASS}"') for page in site_pages()}


def test_the_built_chapters_carry_their_graders(server):
    """On the built site every chapter has an exercise that carries the grader (nine in all), and the
    script loads on exactly the pages that have one."""
    graded = _graded_pages()
    assert sum(graded.values()) >= 9, graded
    chapters = [page for page in graded if page.startswith("chapters/")]
    notebooks = sorted((ROOT / "chapters").glob("0*.ipynb"))
    assert len(chapters) == len(notebooks) >= 7 and all(graded[page] for page in chapters), graded
    for page in graded:
        assert ("_static/code_exercises.js" in (SITE / page).read_text()) == bool(graded[page]), page
