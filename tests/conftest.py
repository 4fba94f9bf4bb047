"""Shared fixtures: the real model, its Hugging Face reference and tokenizer, loaded once per run;
Chromium for the browser tests."""
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from inference_internals.device import available_devices

# `make test` (and so CI) draws the same examples every run, so a red run means the change broke
# something, not that a fresh draw found an old edge case. Plain `pytest` keeps exploring.
settings.register_profile("repeatable", derandomize=True)

# Under xdist (`make test-unit`: two workers on two cores) each worker gets one core: two torch
# processes with a thread per core each oversubscribe the machine, and OpenMP's spinning threads
# made the real-model tests up to 4x slower than they run alone.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


# `make test-unit` hands each of its two workers one file at a time (--dist loadfile), the next when
# one is nearly done, in collection order (--no-loadscope-reorder: xdist's own reorder puts files
# with the most tests first, which queued test_optimize_compile, 6 tests and two minutes, last: the
# other worker then sat idle for 74 s). The longest files go first, so only short ones are left to
# even out the end. Measured with --durations=0 (seconds on one core); a stale
# order costs time, never a test. (2-core EPYC, 2026-12-07.)
LONGEST_FILES = ["test_vllm_fields.py",  # 72 s
                 "test_optimize_compile.py", "test_gemma_model.py", "test_speculative.py", "test_blockdot.py",
                 "test_gguf_door.py", "test_model.py", "test_serve.py", "test_logprobs.py", "test_optimize.py",
                 "test_gguf_kquants.py", "test_paged_model.py", "test_llm.py"]  # 62 (its first run) ... 11 s


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    # `make test-browser` (--dist loadgroup): a built page's tests run on one worker, one after another,
    # so that those that only read it share one loaded tab (test_site.shared_page), and those that click
    # or type come last and take it (test_site.taken_page). The page of every browser-graded exercise
    # (test_code_exercises_browser: Pyodide copied and started once) is one group too.
    # One stable sort: the tests that take a tab last, the longest unit files first, the rest as collected.
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: (item.get_closest_marker("takes_tab") is not None, rank.get(item.path.name, len(rank))))
    for item in items:
        page = getattr(item, "callspec", None) and item.callspec.params.get("page")
        if not item.get_closest_marker("browser"):
            continue
        if isinstance(page, str):
            item.add_marker(pytest.mark.xdist_group(page))
        elif item.path.name == "test_code_exercises_browser.py":
            item.add_marker(pytest.mark.xdist_group(item.path.name))


@pytest.fixture(scope="session")
def model():
    from inference_internals.model import Llama

    return Llama.from_pretrained(device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def reference():
    from inference_internals.model import load_reference

    return load_reference(device="cpu")


@pytest.fixture(scope="session")
def tokenizer():
    from inference_internals.model import load_tokenizer

    return load_tokenizer()


def pytest_generate_tests(metafunc):
    # Any test taking `device` runs once per device this machine has (cpu; cuda/mps too where present).
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", available_devices(), scope="module")


# `make gpu-check` runs this suite on a GPU box that holds the working tree but not the real
# weights: there (and only when it asks, so CI never hides a missing model) a test that needs
# them is reported as skipped, not failed.
if os.environ.get("INFERENCE_INTERNALS_SKIP_REAL") == "1":
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        from inference_internals.weights import ModelNotFoundError

        report = (yield).get_result()
        if call.excinfo is not None and call.excinfo.errisinstance(ModelNotFoundError):
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, "needs the real weights (absent here)")


# Debian's Chromium, driven by Playwright (never `playwright install`); $CHROMIUM overrides.
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
# The last flag: the exercises' Python (Pyodide, ~10 MB of WebAssembly) is compiled lazily, function by
# function, and never recompiled by V8's optimizing tier in the background. A page's first Check took
# 5.3 s with the default tiering (both cores busy compiling), 3.1 s without; the code it grades runs
# for milliseconds either way. Readers' browsers keep their defaults: this is the tests' machine time.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--js-flags=--wasm-lazy-compilation --no-wasm-tier-up",
                 # Offline by construction: every request not to 127.0.0.1 goes to a closed port and fails,
                 # besides the tests' own guard, which records and refuses it (test_site.open_page).
                 "--proxy-server=http://127.0.0.1:9"]  # (127.0.0.1 itself is never proxied)


@pytest.fixture(scope="session")
def server():
    """The built site (`make book`) on 127.0.0.1, one server for the run."""
    from test_site import SITE, serve_folder

    if not (SITE / "index.html").is_file():
        pytest.fail(f"{SITE} has no index.html: build the site first with `make book`")
    with serve_folder(SITE) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test of the run."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium); "
                    "do not use `playwright install`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def open_tabs(browser):
    """Tabs that tests which only read a page share (test_site.shared_page), closed before Chromium."""
    tabs: dict = {}
    yield tabs
    for manager, _, _ in tabs.values():
        manager.__exit__(None, None, None)
