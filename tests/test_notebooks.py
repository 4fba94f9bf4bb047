"""Every page of the book that is a notebook runs from top to bottom without an error.

Each notebook executes exactly as the book build executes it (jupyter-cache's executor, the page's
folder as the working directory, _config.yml's timeout), and a notebook that passes goes into the
cache the build reads. So `make book` renders the outputs this test checked instead of running
every notebook a second time, which would cost as long again as the test.

Run by `make test-notebooks` (which first empties the cache: it is keyed on the notebooks' code
alone, and their outputs depend on src/ too). Deselected from the unit tests by its marker.

`make test-busy` runs the same test beside a program that keeps one core busy, with
NOTEBOOK_BUDGET_S (each page must finish within it), NOTEBOOK_TIMES (a JSON file the page times
are added to) and NOTEBOOK_NO_CACHE=1 (outputs measured on a busy machine stay out of the book).
"""
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
PAGES = sorted((ROOT / "chapters").glob("*.ipynb")) + [ROOT / "book" / "benchmarks.ipynb", ROOT / "book" / "benchmarks_more.ipynb",
                                                       ROOT / "book" / "production.ipynb", ROOT / "book" / "serving.ipynb"]
# jupyter-book's default for `execute: cache:`; the build looks there.
CACHE = ROOT / (CONFIG["execute"].get("cache") or "_build/.jupyter_cache")

pytestmark = pytest.mark.notebook


def test_the_book_reads_this_cache():
    assert CONFIG["execute"]["execute_notebooks"] == "cache", (
        "_config.yml must use the cache: in force mode the build runs every notebook again")
    assert not CONFIG["execute"].get("run_in_temp"), "the test runs each page in its own folder"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_notebook_runs(page):
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(page, as_version=4)
    result = single_nb_execution(nb, cwd=str(page.parent), timeout=CONFIG["execute"]["timeout"],
                                 allow_errors=False, meta_override=True)
    if result.err is not None:
        # CellExecutionError's text names the cell (its source) and holds the kernel's traceback.
        pytest.fail(f"{page.relative_to(ROOT)} failed after {result.time:.0f} s:\n{result.exc_string}",
                    pytrace=False)
    print(f"{page.relative_to(ROOT)}: {result.time:.1f} s")
    if os.environ.get("NOTEBOOK_TIMES"):
        times_file = Path(os.environ["NOTEBOOK_TIMES"])
        times = json.loads(times_file.read_text()) if times_file.exists() else {}
        times[page.stem] = round(result.time, 1)
        times_file.write_text(json.dumps(times, indent=1) + "\n")
    budget = float(os.environ.get("NOTEBOOK_BUDGET_S", "inf"))
    assert result.time <= budget, f"{page.relative_to(ROOT)} took {result.time:.0f} s, over its {budget:.0f} s budget"
    if os.environ.get("NOTEBOOK_NO_CACHE") == "1":
        return
    cache = get_cache(str(CACHE))
    cache.cache_notebook_bundle(CacheBundleIn(nb, str(page), data={"execution_seconds": result.time}),
                                check_validity=False, overwrite=True)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_page_that_runs_a_model_runs_torch_on_the_free_cores(page):
    """Beside another busy program, torch on every core waits for the thread that shares the busy one:
    chapter 7 without ``use_free_cores()`` took 184 s beside one busy-looping program, 53 s with it."""
    code = "\n".join(c.source for c in nbformat.read(page, as_version=4).cells if c.cell_type == "code")
    if re.search(r"\.from_pretrained\(|(?<![`\w])LLM\(", code):  # a call, not a name quoted in the prose
        assert "use_free_cores()" in code, f"{page.name} runs a model but never calls use_free_cores()"
