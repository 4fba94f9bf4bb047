"""Widgets that work on the static website as well as in Jupyter: HTML, its data, and a small script.

An ipywidgets widget calls back into the kernel when it moves; the website has no kernel, so there
it only shows its last state. These widgets need none. Two kinds:

- ``frame_viewer(controls, frame)`` calls ``frame(**setting)`` for every combination of the
  controls' options while the notebook runs and stores the HTML frames; the page switches between
  them. For data that only the model can produce (a generation, a scheduler run).
- ``calculator(controls, renderer, data)`` computes in the browser: ``renderer`` names a function
  in ``static_widgets.js`` whose formulas mirror the library's Python (tests/test_site_widgets.py
  checks them against it on a grid of inputs, and drives each widget on the built site).

Both return a ``StaticWidget``; ``display()`` it. The same HTML runs in Jupyter (an output's
script runs in a trusted notebook) and on the site.

    from inference_course.static_widgets import frame_viewer, slider
    frame_viewer([slider("n", [1, 2, 3], 1)], lambda n: f"<b>{n * n}</b>")
"""
from __future__ import annotations

import hashlib
import html
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SCRIPT = Path(__file__).with_name("static_widgets.js")
MAX_FRAMES = 2000          # a frame viewer stores every frame in the page: keep pages small
MAX_BYTES = 3 * 2**20

STYLE = """<style>
.ii-widget{border:1px solid #ddd;border-radius:4px;padding:.5rem .7rem;margin:.4rem 0 1rem;max-width:100%;overflow-x:auto}
.ii-controls{display:flex;flex-wrap:wrap;gap:.3rem 1.2rem;align-items:center;margin-bottom:.4rem}
.ii-control{display:flex;align-items:center;gap:.4rem;flex-wrap:wrap}
.ii-knob{display:inline-flex;align-items:center;gap:.3rem;white-space:nowrap}
.ii-control>.ii-name{font-weight:600;white-space:nowrap}
.ii-control output{font-family:monospace;min-width:3.5em}
.ii-control input[type=range]{width:min(11rem,36vw)}
.ii-control button{padding:0 .5rem}
.ii-multi label{white-space:nowrap;margin-right:.5rem}
.ii-note{font-size:.9em;color:#555;margin:.3rem 0 0}
.ii-table td{padding:1px .6rem 1px 0;vertical-align:top}
.ii-chart{display:block;max-width:100%;height:auto}
.ii-legend{display:flex;flex-wrap:wrap;gap:.1rem 1rem;font-size:.9em;margin:.2rem 0 .4rem}
.ii-key{display:inline-flex;align-items:center;gap:.3rem}
.ii-swatch{display:inline-block;width:1.6em;height:0}
.ii-barcell{width:40%;min-width:6rem}
.ii-bar{display:inline-block;height:.9em;vertical-align:middle}
.ii-caption{margin:.2rem 0}
</style>"""


@dataclass(frozen=True)
class Control:
    """One input: ``options`` are the values it can take (JSON-able), ``labels`` how they show."""
    name: str
    kind: str                       # slider | dropdown | checkbox | multi
    options: list
    value: Any
    label: str
    labels: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.options:
            raise ValueError(f"control {self.name!r} has no options")
        if self.kind == "multi":
            bad = [v for v in self.value if v not in self.options]
        else:
            bad = [] if self.value in self.options else [self.value]
        if bad:
            raise ValueError(f"control {self.name!r}: {bad!r} is not among its options {self.options!r}")
        if self.labels and len(self.labels) != len(self.options):
            raise ValueError(f"control {self.name!r}: {len(self.labels)} labels for {len(self.options)} options")
        json.dumps(self.options)  # raises now rather than in the page
        if not self.labels:
            object.__setattr__(self, "labels", [str(o) for o in self.options])

    @property
    def index(self) -> int:
        if self.kind == "multi":
            return sum(1 << i for i, o in enumerate(self.options) if o in self.value)
        return self.options.index(self.value)

    def spec(self) -> dict:
        return {"name": self.name, "kind": self.kind, "options": self.options, "labels": self.labels}

    def html(self) -> str:
        name, label = html.escape(self.name), f'<span class="ii-name">{html.escape(self.label)}</span>'
        if self.kind == "slider":
            return (f'<span class="ii-control" data-ii-name="{name}" data-ii-kind="slider">{label}'
                    f'<span class="ii-knob"><button type="button" data-ii-step="-1" aria-label="{name} down">◀</button>'
                    f'<input type="range" min="0" max="{len(self.options) - 1}" step="1" value="{self.index}"'
                    f' aria-label="{html.escape(self.label)}">'
                    f'<button type="button" data-ii-step="1" aria-label="{name} up">▶</button>'
                    f'<output>{html.escape(self.labels[self.index])}</output></span></span>')
        if self.kind == "dropdown":
            opts = "".join(f'<option value="{i}"{" selected" if i == self.index else ""}>{html.escape(t)}</option>'
                           for i, t in enumerate(self.labels))
            return (f'<label class="ii-control" data-ii-name="{name}" data-ii-kind="dropdown">{label}'
                    f'<select>{opts}</select></label>')
        if self.kind == "checkbox":
            return (f'<label class="ii-control" data-ii-name="{name}" data-ii-kind="checkbox">'
                    f'<input type="checkbox"{" checked" if self.value else ""}>{html.escape(self.label)}</label>')
        boxes = "".join(f'<label><input type="checkbox"{" checked" if o in self.value else ""}>'
                        f"{html.escape(t)}</label>" for o, t in zip(self.options, self.labels))
        return (f'<span class="ii-control ii-multi" data-ii-name="{name}" data-ii-kind="multi">{label}'
                f"{boxes}</span>")


def slider(name: str, options: list, value, label: str | None = None, labels: list[str] | None = None) -> Control:
    return Control(name, "slider", list(options), value, label or name, list(labels or []))


def dropdown(name: str, options: list, value, label: str | None = None, labels: list[str] | None = None) -> Control:
    return Control(name, "dropdown", list(options), value, label or name, list(labels or []))


def checkbox(name: str, value: bool, label: str | None = None) -> Control:
    return Control(name, "checkbox", [False, True], bool(value), label or name)


def multi(name: str, options: list, value: list, label: str | None = None) -> Control:
    if len(options) > 30:
        raise ValueError(f"control {name!r}: at most 30 options fit its bitmask, got {len(options)}")
    return Control(name, "multi", list(options), list(value), label or name)


class StaticWidget:
    """The widget's HTML; ``display()`` shows it. ``frames`` maps a setting (a tuple of option
    indices, in the controls' order) to its HTML, for a frame viewer."""

    def __init__(self, spec: dict, controls: list[Control], note: str = ""):
        self.spec, self.controls, self.note = spec, controls, note
        self.frames: dict[tuple[int, ...], str] = {}

    @property
    def html(self) -> str:
        data = json.dumps(self.spec, separators=(",", ":")).replace("</", "<\\/")
        uid = hashlib.sha1(data.encode()).hexdigest()[:10]  # the same page every build
        note = f'<p class="ii-note">{self.note}</p>' if self.note else ""
        return (f'{STYLE}<div class="ii-widget" id="ii-{uid}">'
                f'<div class="ii-controls">{"".join(c.html() for c in self.controls)}</div>'
                f'<div class="ii-output" aria-live="polite"></div>{note}'
                f'<script type="application/json" class="ii-data">{data}</script></div>'
                f"<script>{SCRIPT.read_text()}</script>")

    def _repr_html_(self) -> str:
        return self.html


def _check_names(controls: list[Control]) -> None:
    names = [c.name for c in controls]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"controls need distinct names, got {names}")


def frame_viewer(controls: list[Control], frame: Callable[..., str], note: str = "") -> StaticWidget:
    """Every combination of the controls' options, rendered by ``frame(**values)`` to HTML now."""
    _check_names(controls)
    if any(c.kind == "multi" for c in controls):
        raise ValueError("a frame viewer takes sliders, dropdowns and checkboxes (a multi-select has 2**n settings)")
    n = 1
    for c in controls:
        n *= len(c.options)
    if n > MAX_FRAMES:
        raise ValueError(f"{n} settings would be stored in the page (at most {MAX_FRAMES}): use fewer options")
    frames: list[str] = []
    seen: dict[str, int] = {}
    index: dict[str, int] = {}
    widget = StaticWidget({}, controls, note)
    for setting in itertools.product(*(range(len(c.options)) for c in controls)):
        out = frame(**{c.name: c.options[i] for c, i in zip(controls, setting)})
        if not isinstance(out, str):
            raise TypeError(f"frame() must return an HTML string, got {type(out).__name__}")
        widget.frames[setting] = out
        index[",".join(map(str, setting))] = seen.setdefault(out, len(seen))
        if len(seen) > len(frames):
            frames.append(out)
    size = sum(map(len, frames))
    if size > MAX_BYTES:
        raise ValueError(f"the frames take {size / 2**20:.1f} MiB (at most {MAX_BYTES / 2**20:.0f}): make them smaller")
    widget.spec = {"kind": "frames", "controls": [c.spec() for c in controls], "frames": frames, "index": index}
    return widget


RENDERERS = ("kv_sizer", "gpu_calculator", "memory_calculator", "speedup_curves")


def calculator(controls: list[Control], renderer: str, data: dict, note: str = "") -> StaticWidget:
    """A widget that computes in the browser: ``renderer`` (one of RENDERERS, in static_widgets.js)
    gets the chosen values and ``data`` (the library's tables, as JSON)."""
    _check_names(controls)
    if renderer not in RENDERERS:
        raise ValueError(f"unknown renderer {renderer!r}: expected one of {', '.join(RENDERERS)}")
    spec = {"kind": "calc", "renderer": renderer, "controls": [c.spec() for c in controls], "data": data}
    json.dumps(spec)
    return StaticWidget(spec, controls, note)
