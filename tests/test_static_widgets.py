"""static_widgets: settings map to the right frames, bad specs fail clearly, and the page's
JavaScript formulas equal the library's Python on a grid of inputs (the last in Chromium)."""
from __future__ import annotations

import itertools
import json
import math

import pytest

from inference_internals.analysis import roofline as hw
from inference_internals.analysis import kv_memory
from inference_internals.kv_cache import kv_cache_bytes
from inference_internals.model import LlamaConfig
from inference_internals.speculative import best_gamma, expected_speedup, expected_tokens_per_pass
from inference_course.static_widgets import (SCRIPT, calculator, checkbox, dropdown, frame_viewer, multi,
                                                slider)


def test_every_setting_gets_its_own_frame():
    w = frame_viewer([slider("n", [1, 2, 3], 2), checkbox("sq", True), dropdown("unit", ["a", "b"], "b")],
                     lambda n, sq, unit: f"{n * n if sq else n}{unit}")
    spec = w.spec
    assert len(spec["index"]) == 3 * 2 * 2
    for (i, j, k), frame in w.frames.items():
        n, sq, unit = [1, 2, 3][i], [False, True][j], ["a", "b"][k]
        assert frame == f"{n * n if sq else n}{unit}"
        assert spec["frames"][spec["index"][f"{i},{j},{k}"]] == frame
    # n=1 is the same frame squared or not: stored once
    assert len(spec["frames"]) == len(set(w.frames.values())) < len(w.frames)


def test_html_holds_controls_data_and_script():
    w = frame_viewer([slider("step", list(range(5)), 3, "tokens", labels=list("abcde"))], lambda step: f"<b>{step}</b>")
    page = w._repr_html_()
    assert 'value="3"' in page and ">d</output>" in page and 'class="ii-data"' in page
    assert SCRIPT.read_text() in page
    data = page.split('class="ii-data">')[1].split("</script>")[0]
    assert json.loads(data.replace("<\\/", "</"))["frames"][3] == "<b>3</b>"
    assert "</b>" not in data  # a frame's closing tags cannot end the data script early
    assert w.html == frame_viewer([slider("step", list(range(5)), 3, "tokens", labels=list("abcde"))],
                                  lambda step: f"<b>{step}</b>").html  # the same page every build


@pytest.mark.parametrize("make, message", [
    (lambda: slider("x", [1, 2], 3), "not among its options"),
    (lambda: slider("x", [], None), "no options"),
    (lambda: slider("x", [1, 2], 1, labels=["one"]), "1 labels for 2 options"),
    (lambda: multi("m", ["a", "b"], ["c"]), "not among its options"),
    (lambda: frame_viewer([slider("x", [1], 1), slider("x", [2], 2)], lambda x: ""), "distinct names"),
    (lambda: frame_viewer([multi("m", ["a"], ["a"])], lambda m: ""), "multi-select"),
    (lambda: frame_viewer([slider("x", list(range(3000)), 0)], lambda x: ""), "3000 settings"),
    (lambda: frame_viewer([slider("x", [1], 1)], lambda x: 1), "HTML string"),
    (lambda: frame_viewer([slider("x", list(range(4)), 0)], lambda x: "y" * 2**20 + str(x)), "MiB"),
    (lambda: calculator([slider("x", [1], 1)], "no_such", {}), "unknown renderer"),
    (lambda: calculator([slider("x", [1], 1)], "kv_sizer", {"f": object()}), "JSON serializable"),
])
def test_bad_specs_fail_clearly(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


# --- the JavaScript formulas against the Python ones, in Chromium -----------------------------

@pytest.fixture(scope="module")
def js(browser):
    """A blank page with static_widgets.js loaded (in conftest's one Chromium); returns a function
    evaluating JS there."""
    page = browser.new_page()
    page.set_content(f"<script>{SCRIPT.read_text()}</script>")
    yield lambda expr, arg=None: page.evaluate(expr, arg)
    page.close()


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0)


def machine_json(m):
    return {"bandwidth": m.bandwidth, "flops": m.flops, "memory": m.memory}


@pytest.mark.browser
def test_js_roofline_formulas_match_python(js):
    grid = list(itertools.product(hw.GPUS.values(), hw.WEIGHT_DTYPES, [135e6, 8e9, 70e9], [1, 7, 64, 1024]))
    args = [[machine_json(m), d, p, b] for m, d, p, b in grid]
    got = js("""([args, dt]) => args.map(([m, d, p, b]) => [
        IIWidgets.formulas.predict_decode_tok_s(m, dt, p, d, b),
        IIWidgets.formulas.predict_ttft(m, dt, p, 4 * b, d),
        IIWidgets.formulas.critical_batch(m, dt, d),
        IIWidgets.formulas.fits(m, dt, p, d)])""", [args, hw.WEIGHT_DTYPES])
    for (m, d, p, b), (tok_s, ttft, crit, fits) in zip(grid, got):
        assert close(tok_s, hw.predict_decode_tok_s(m, p, d, batch=b)), (m.name, d, p, b)
        assert close(ttft, hw.predict_ttft(m, p, 4 * b, d)), (m.name, d, p, b)
        assert close(crit, hw.critical_batch(m, d)), (m.name, d)
        assert fits == hw.fits(m, p, d), (m.name, d, p)
    # a machine with no memory figure always fits
    free = hw.Machine("x", 1e9, {"fp32": 1e12})
    assert js("([m, dt]) => IIWidgets.formulas.fits(m, dt, 1e15, 'fp32')", [machine_json(free), hw.WEIGHT_DTYPES])


@pytest.mark.browser
def test_js_kv_formulas_match_python(js):
    specs = list(kv_memory.PUBLISHED_CONFIGS.values())
    grid = list(itertools.product(specs, [0, 1, 4096, 131072], [1, 8, 128], sorted(set(kv_memory.BYTES.values()))))
    args = [[{f: getattr(s, f) for f in ("layers", "kv_heads", "head_dim", "latent", "params")}, c, b, v]
            for s, c, b, v in grid]
    got = js("""(args) => args.map(([s, c, b, v]) => [IIWidgets.formulas.kv_bytes(s, c, b, v),
                                                      IIWidgets.formulas.weight_bytes(s)])""", args)
    for (s, c, b, v), (kv, w) in zip(grid, got):
        assert kv == kv_memory.kv_bytes(s, c, b, v) and w == kv_memory.weight_bytes(s), (s.name, c, b, v)
    cfg = LlamaConfig()
    small = {k: getattr(cfg, k) for k in ("num_hidden_layers", "num_key_value_heads", "head_dim")}
    for t, b, e in itertools.product([1, 256, 8192], [1, 64], [2, 4]):
        assert js("([c, t, b, e]) => IIWidgets.formulas.kv_cache_bytes(c, t, b, e)", [small, t, b, e]) == \
            kv_cache_bytes(cfg, t, b, e)


@pytest.mark.browser
def test_js_speculative_formulas_match_python(js):
    grid = [(a / 100, g, c / 100) for a in range(0, 101, 3) for g in range(0, 17, 3) for c in (0, 5, 30, 100)]
    got = js("""(grid) => grid.map(([a, g, c]) => [IIWidgets.formulas.expected_tokens_per_pass(a, g),
        IIWidgets.formulas.expected_speedup(a, g, c), IIWidgets.formulas.best_gamma(a, c, 16)])""", grid)
    for (a, g, c), (tokens, speed, best) in zip(grid, got):
        assert close(tokens, expected_tokens_per_pass(a, g)), (a, g)
        assert close(speed, expected_speedup(a, g, c)), (a, g, c)
        assert best == best_gamma(a, c, 16), (a, c)
