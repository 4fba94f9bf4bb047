"""Sphinx hooks for the course website (loaded by _config.yml's `sphinx: local_extensions`).

- Thebe is off (`launch_buttons.thebe: false`), but Jupyter Book always loads sphinx-thebe,
  which still adds its configuration script (`const THEBE_JS_URL = "https://unpkg.com/..."`)
  and its loader to every page. Sphinx 7.4 then writes the configuration script twice (the
  registry's copy and the builder's copy of the same inline script), and the second
  `const THEBE_JS_URL` is a console error on every page. Nothing on the site uses Thebe, so
  its scripts, its stylesheet and the kernel configuration it writes into each page's body
  (a Binder repository it would launch) are dropped from every page.
- The exercise checker (book/_static/exercises.js) loads only on the pages that have an
  exercise to check: a page-specific `add_js_file` in `html-page-context`; so does the code
  exercises' grader (book/_static/code_exercises.js, which starts Pyodide when a reader
  presses Check).
"""
from __future__ import annotations

import re

from sphinx.application import Sphinx

EXERCISE_SCRIPT = "exercises.js"
EXERCISE_MARK = 'class="exercise-answer"'   # what Exercise.show() puts in the page
CODE_EXERCISE_SCRIPT = "code_exercises.js"
CODE_EXERCISE_MARK = 'class="code-exercise-browser"'   # what CodeExercise.show() puts there


# What sphinx-thebe's doctree-resolved hook writes at the end of each page's body.
THEBE_BODY = re.compile(r'\s*<script type="text/x-thebe-config">.*?</script>\s*<script>kernelName = [^<]*</script>', re.S)


def _is_thebe(asset) -> bool:
    body = asset.attributes.get("body", "")
    return "THEBE_JS_URL" in body or "sphinx-thebe." in (asset.filename or "")


def _page_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if EXERCISE_MARK in context.get("body", ""):
        app.add_js_file(EXERCISE_SCRIPT, loading_method="defer")  # before the list is replaced below
    if CODE_EXERCISE_MARK in context.get("body", ""):
        app.add_js_file(CODE_EXERCISE_SCRIPT, loading_method="defer")
    thebe_on = app.config.html_theme_options.get("launch_buttons", {}).get("thebe")
    if not thebe_on:
        for key in ("script_files", "css_files"):
            if key in context:
                context[key] = [a for a in context[key] if not _is_thebe(a)]
        if "body" in context:
            context["body"] = THEBE_BODY.sub("", context["body"])


def setup(app: Sphinx) -> dict:
    # After sphinx-thebe and the theme have added theirs (priority: later runs later).
    app.connect("html-page-context", _page_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
