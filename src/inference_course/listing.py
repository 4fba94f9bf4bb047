"""Source listings in the chapters: short ones shown whole, long ones folded.

A listing of a few lines reads as part of the text; one of 80 lines pushes the text it explains
off the screen. ``source(obj, ...)`` shows the source of the objects given, highlighted; past
``FOLD_LINES`` lines the listing sits in a ``<details>`` element, closed, with the names and the
length on the fold, so a reader opens it when they want it (Jupyter and the website alike).

    from inference_course.listing import source
    source(speculative_generate)            # as the last line of a cell, or display(source(...))
"""
from __future__ import annotations

import html
import inspect

from IPython.display import Code

FOLD_LINES = 12  # longer folds: the chapter's inline code is the lesson, the library's version a click away


class Listing:
    """The highlighted source of some objects; folded in HTML when longer than ``fold_lines``."""

    def __init__(self, *objs, fold_lines: int = FOLD_LINES):
        if not objs:
            raise ValueError("source() needs at least one function, class or module")
        self.names = [getattr(o, "__qualname__", getattr(o, "__name__", repr(o))) for o in objs]
        self.text = "\n".join(inspect.getsource(o) for o in objs)
        self.lines = self.text.count("\n") + (not self.text.endswith("\n"))
        self.folded = self.lines > fold_lines
        self._code = Code(self.text, language="python")

    def _repr_html_(self) -> str:
        code = self._code._repr_html_()
        if not self.folded:
            return code
        names = ", ".join(f"<code>{html.escape(n)}</code>" for n in self.names)
        return (f'<details class="listing"><summary>Source of {names} ({self.lines} lines): '
                f"click to show</summary>{code}</details>")

    def __repr__(self) -> str:
        return self.text


def source(*objs, fold_lines: int = FOLD_LINES) -> Listing:
    """The source of ``objs`` for display: whole when short, folded past ``fold_lines`` lines."""
    return Listing(*objs, fold_lines=fold_lines)
