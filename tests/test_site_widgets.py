"""Drive every widget of the built website in Chromium, with no kernel: move a control and check
the output changed to what the library's Python gives for the new setting.

Calculators are checked against the library's formulas; frame viewers against the frame Python
stored for that setting and the facts it must show (the round, the step, the run). Needs
`_build/html` (`make book`); uses test_site's server and browser.

    .venv/bin/python -m pytest tests/test_site_widgets.py -m browser
"""
from __future__ import annotations

import json

import pytest
from test_site import SHOTS

from inference_internals.analysis import roofline as hw
from inference_internals.analysis import kv_memory
from inference_internals.kv_cache import kv_cache_bytes
from inference_internals.model import LlamaConfig
from inference_internals.speculative import best_gamma, expected_speedup, expected_tokens_per_pass

pytestmark = pytest.mark.browser

INTRO = "book/intro.html"
CH = {n: f"chapters/{stem}.html" for n, stem in [
    (1, "01_inference_flow"), (2, "02_tokenization_to_generation"), (3, "03_prefill_vs_decode"),
    (4, "04_kv_cache"), (5, "05_paged_attention"), (6, "06_speculative_decoding")]}


@pytest.fixture
def open_page(server, browser):  # noqa: F811
    contexts = []

    def open_(path, width=1280):
        ctx = browser.new_context(viewport={"width": width, "height": 900}, service_workers="block")
        contexts.append(ctx)
        pg = ctx.new_page()
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server + path, wait_until="load")
        pg.errors = errors
        return pg

    yield open_
    for ctx in contexts:
        ctx.close()


class Widget:
    """One .ii-widget on a page, found by the name of one of its controls."""

    def __init__(self, pg, control: str):
        self.pg = pg
        self.root = pg.locator(f'.ii-widget:has([data-ii-name="{control}"])')
        assert self.root.count() == 1, f"{self.root.count()} widgets with a control {control!r}"
        self.spec = json.loads(self.root.locator("script.ii-data").text_content())
        self.controls = {c["name"]: c for c in self.spec["controls"]}

    def set(self, name: str, value):
        """Choose ``value`` (one of the control's options) the way a reader would."""
        c, el = self.controls[name], self.root.locator(f'[data-ii-name="{name}"]')
        if c["kind"] == "multi":
            for i, option in enumerate(c["options"]):
                el.locator("input").nth(i).set_checked(option in value)
            return
        i = c["options"].index(value)
        if c["kind"] == "slider":
            el.locator("input[type=range]").fill(str(i))
            assert el.locator("output").inner_text() == c["labels"][i]
        elif c["kind"] == "dropdown":
            el.locator("select").select_option(str(i))
        else:
            el.locator("input").set_checked(bool(value))

    def step(self, name: str, direction: int):
        self.root.locator(f'[data-ii-name="{name}"] button[data-ii-step="{direction}"]').click()

    @property
    def output(self) -> str:
        return self.root.locator(".ii-output").inner_text()

    def frame(self) -> str:
        """The frame Python stored for the setting now chosen (frame viewers)."""
        setting = json.loads(self.root.get_attribute("data-ii-setting"))
        key = ",".join(str(setting[c["name"]]) for c in self.spec["controls"])
        return self.spec["frames"][self.spec["index"][key]]

    def shows_stored_frame(self):
        # The theme sets tabindex on every <pre> after a resize (focusable only when it scrolls), so the
        # attribute is the page's, not the frame's: compare the markup without it.
        unfocus = "el => { el.querySelectorAll('[tabindex]').forEach(x => x.removeAttribute('tabindex')); return el.innerHTML; }"
        shown = self.root.locator(".ii-output").evaluate(
            f"el => ({unfocus})(el.cloneNode(true))")
        stored = self.pg.evaluate(
            f"html => {{ const d = document.createElement('div'); d.innerHTML = html; return ({unfocus})(d); }}",
            self.frame())
        assert shown == stored


def shot(pg, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"widget-{name}.png"), full_page=False)


def fmt(x, digits=0):
    return f"{x:,.{digits}f}"


# --- calculators: the page's numbers are the library's ----------------------------------------

def test_intro_kv_sizer(open_page):
    w = Widget(open_page(INTRO), "context")
    cfg = LlamaConfig()  # SmolLM2-135M's configuration
    before = w.output
    for context, batch, dtype in [(8192, 64, "fp32"), (256, 1, "bf16"), (4096, 8, "bf16")]:
        w.set("context", context)
        w.set("batch", batch)
        w.set("dtype", dtype)
        size = kv_cache_bytes(cfg, context, batch, {"fp32": 4, "bf16": 2}[dtype])
        assert w.output == f"{batch} × {context:,} tokens in {dtype}: {size:,} bytes = {size / 2**30:.2f} GiB"
    assert w.output == before  # back at the defaults


def gpu_rows(chip, model, weights, prompt_len, batch):
    """What chapter 3's calculator must show, from roofline.py."""
    m, p = hw.GPUS[chip], kv_memory.PUBLISHED_CONFIGS[model].params
    one, many = hw.predict_decode_tok_s(m, p, weights), hw.predict_decode_tok_s(m, p, weights, batch=batch)
    crit = hw.critical_batch(m, weights)
    rows = [f"weights\t{fmt(p * hw.bytes_per_param(weights) / 1e9, 1)} GB (fits: "
            f"{'yes' if hw.fits(m, p, weights) else 'no: needs several chips'})",
            f"decode, batch 1\t{fmt(one, 1)} tokens/s ({fmt(1e3 / one, 2)} ms per token)"]
    if batch > 1:
        rows.append(f"decode, batch {batch}\t{fmt(many)} tokens/s in all, {fmt(many / batch, 1)} per sequence "
                    f"({'compute' if batch > crit else 'memory'}-bound)")
    rows += [f"TTFT, {prompt_len:,}-token prompt\t{fmt(hw.predict_ttft(m, p, prompt_len, weights) * 1e3, 1)} ms",
             f"critical batch\t{fmt(crit)}"]
    return rows


def test_ch3_gpu_calculator(open_page):
    pg = open_page(CH[3])
    w = Widget(pg, "chip")
    # the page's chip table is the library's
    for name, m in hw.GPUS.items():
        assert w.spec["data"]["chips"][name] == {"bandwidth": m.bandwidth, "flops": m.flops, "memory": m.memory}
    before = w.output
    for setting in [("A100 80GB SXM", "Llama-3-70B", "int4", 16384, 256), ("RTX 4090", "Llama-3-8B", "fp32", 16, 1),
                    ("Apple M2 Max (38-core GPU)", "Qwen2.5-7B", "bf16", 1024, 8), ("H100 SXM", "Llama-3-8B", "bf16", 1024, 1)]:
        for name, value in zip(["chip", "model", "weights", "prompt_len", "batch"], setting):
            w.set(name, value)
        rows = [r.replace("\xa0", " ") for r in w.output.strip().split("\n")]
        assert rows == gpu_rows(*setting), setting
        labels = [r.split("\t")[0] for r in rows]
        assert len(set(labels)) == len(labels)  # no two rows called the same
    assert w.output == before
    shot(pg, "ch3-calculator")


def memory_rows(names, context, batch, kind, include_weights):
    specs = [kv_memory.PUBLISHED_CONFIGS[n] for n in names] or list(kv_memory.PUBLISHED_CONFIGS.values())
    rows = []
    for s in specs:
        total = (kv_memory.kv_bytes(s, context, batch, kv_memory.BYTES[kind])
                 + include_weights * kv_memory.weight_bytes(s)) / kv_memory.GB
        fits = [label.split(" (")[0] for label, cap in kv_memory.GPUS.items() if total * kv_memory.GB <= cap]
        rows.append(f"{s.name}\t\t{total:,.1f} GB\tfits on {', '.join(fits) or 'none of these GPUs'}")
    return rows


def test_ch4_memory_calculator(open_page):
    pg = open_page(CH[4])
    w = Widget(pg, "names")
    table = w.root.locator(".ii-bars")
    before = table.inner_text()
    for setting in [(["Llama-3-8B", "DeepSeek-V3"], 131072, 32, "fp8", True), ([], 1024, 1, "fp32", False),
                    (["SmolLM2-135M"], 65536, 128, "bf16", True)]:
        for name, value in zip(["names", "context", "batch", "kind", "include_weights"], setting):
            w.set(name, value)
        assert table.inner_text().strip().split("\n") == memory_rows(*setting), setting
        assert w.root.locator("svg.ii-chart polyline").count() == len(setting[0] or kv_memory.PUBLISHED_CONFIGS)
    w.set("names", list(kv_memory.PUBLISHED_CONFIGS))
    w.set("context", 32768), w.set("batch", 8), w.set("kind", "bf16"), w.set("include_weights", False)
    assert table.inner_text() == before
    shot(pg, "ch4-memory")


def test_ch6_speedup_curves(open_page):
    pg = open_page(CH[6])
    w = Widget(pg, "alpha")
    result = w.root.locator(".ii-result")
    for a, g, c in [(0.9, 8, 0.1), (0.3, 0, 0.0), (0.99, 16, 1.0), (0.7, 4, 0.05)]:
        w.set("alpha", a), w.set("gamma", g), w.set("c", c)
        best = best_gamma(a, c, 16)
        assert result.inner_text() == (
            f"γ = {g}: {expected_tokens_per_pass(a, g):,.2f} tokens per target pass, predicted speedup "
            f"{expected_speedup(a, g, c):,.2f}×; best γ = {best} ({expected_speedup(a, best, c):,.2f}×)")
        assert f"α = {a}, c = {c}" in w.output
    shot(pg, "ch6-speedup")


# --- frame viewers: the frame shown is the one Python computed for that setting ----------------

def test_ch1_generation_stepper(open_page):
    pg = open_page(CH[1])
    w = Widget(pg, "step")
    seen = set()
    for sample in (False, True):
        w.set("sample", sample)
        for step in (0, 5, 16):
            w.set("step", step)
            w.shows_stored_frame()
            assert f"step {step + 1}: the next token is one of" in w.output or "done" in w.output
            seen.add(w.output)
    w.step("step", -1)
    assert json.loads(w.root.get_attribute("data-ii-setting"))["step"] == 15
    w.shows_stored_frame()
    assert len(seen) == 5  # each step differs, and sampling differs from greedy after step 0


def test_ch2_tokenizer_examples(open_page, tokenizer):
    w = Widget(open_page(CH[2]), "name")
    shown = set()
    for name in w.controls["name"]["options"]:
        w.set("name", name)
        w.shows_stored_frame()
        text = w.root.locator(".ii-output pre").text_content().replace("↵\n", "\n")
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert f"{n} tokens, {len(text.encode())} bytes" in w.output, name
        shown.add(text)
    assert len(shown) == len(w.controls["name"]["options"])


def test_ch2_sampling_knobs(open_page):
    pg = open_page(CH[2])
    w = Widget(pg, "temperature")
    before = w.output
    w.set("temperature", 0)
    w.shows_stored_frame()
    assert w.output.startswith("1 tokens can be drawn")  # greedy: one token
    w.set("temperature", 2.0), w.set("top_p", 1.0), w.set("top_k", 0), w.set("min_p", 0)
    w.shows_stored_frame()
    assert w.output.startswith("49,152 tokens can be drawn")  # no filter: the whole vocabulary
    w.set("top_k", 5)
    assert w.output.startswith("5 tokens can be drawn")
    w.set("temperature", 0.8), w.set("top_k", 0), w.set("top_p", 0.9)
    assert w.output == before
    shot(pg, "ch2-knobs")


def test_ch5_scheduler_stepper(open_page):
    pg = open_page(CH[5])
    w = Widget(pg, "run")
    outputs = set()
    for run in w.controls["run"]["options"]:
        w.set("run", run)
        for step in (0, 12, w.controls["step"]["options"][-1]):
            w.set("step", step)
            w.shows_stored_frame()
            assert w.output.startswith(f"{run}, after step ")
            outputs.add(w.output)
    assert len(outputs) > len(w.controls["run"]["options"])
    shot(pg, "ch5-scheduler")


def test_ch5_load_widget(open_page):
    """The budget and the rate pick the simulation Python ran for them."""
    pg = open_page(CH[5])
    w = Widget(pg, "budget")
    outputs = set()
    for budget in (w.controls["budget"]["options"][0], w.controls["budget"]["options"][-1]):
        w.set("budget", budget)
        for rate in (w.controls["rate"]["options"][0], w.controls["rate"]["options"][-1]):
            w.set("rate", rate)
            w.shows_stored_frame()
            assert f"chunked, budget {budget}" in w.output and f"({rate:.0%} of continuous" in w.output
            outputs.add(w.output)
    assert len(outputs) == 4
    shot(pg, "ch5-load")


def test_ch5_load_table_fits_a_phone_without_wrapping_its_numbers(open_page):
    pg = open_page(CH[5], width=390)
    w = Widget(pg, "budget")
    w.set("budget", w.controls["budget"]["options"][-1])
    table = w.root.locator(".ii-output table")
    box = w.root.locator(".ii-output")
    assert table.evaluate("t => t.getBoundingClientRect().right") <= box.evaluate("b => b.getBoundingClientRect().right") + 1
    # every number cell on one line: its height is one line of its own font
    tall = table.evaluate("""t => [...t.querySelectorAll('td')].filter(td => {
        const st = getComputedStyle(td), line = parseFloat(st.lineHeight) || 1.3 * parseFloat(st.fontSize);
        return td.getBoundingClientRect().height > 1.8 * line; }).map(td => td.textContent)""")
    assert not tall, f"cells wrapped at 390 px: {tall}"
    table.scroll_into_view_if_needed()
    shot(pg, "ch5-load-phone")


def test_ch6_round_viewer(open_page):
    pg = open_page(CH[6])
    w = Widget(pg, "i")
    n = len(w.controls["i"]["options"])
    for i in (0, n // 2, n - 1):
        w.set("i", i)
        w.shows_stored_frame()
        # the slider and the text name the same round
        label = w.root.locator('[data-ii-name="i"] output').inner_text()
        assert label == str(i + 1) and w.output.startswith(f"round {i + 1} of {n}:")
    w.step("i", -1)
    assert w.output.startswith(f"round {n - 1} of {n}:")
    assert not pg.errors
    shot(pg, "ch6-rounds")
