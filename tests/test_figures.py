"""The chapters' viewer helpers (inference_course.figures) draw what they are given."""
import re

import pytest

from inference_course.figures.ch02 import show_token, token_html
from inference_course.figures.ch05 import block_pool_html
from inference_internals.bpe import BPETokenizer


def test_token_html_shows_every_token_with_its_id():
    tok = BPETokenizer.from_pretrained()
    text = "Hi 😀<|im_end|>"
    ids = tok.encode(text)
    shown = token_html(tok, text)
    assert shown.startswith(f"<div>{len(ids)} tokens, {len(text.encode())} bytes</div>")
    assert re.findall(r"<small[^>]*>(\d+)</small>", shown) == [str(i) for i in ids]
    assert "#f4b6b6" in shown  # the special token stands out
    partial = [i for i in ids if i not in tok.added_ids and show_token(tok, i).startswith("<")]
    assert partial and all(re.fullmatch(r"<[0-9a-f]{2}( [0-9a-f]{2})*>", show_token(tok, i)) for i in partial)


def test_block_pool_html_counts_held_shared_and_cached_blocks():
    state = {"step": 3, "kind": "decode", "owners": [[7], [7, 8], [], [8]], "cached": [False, True, False, False],
             "fill": [4, 2, 0, 1], "running": [7, 8], "waiting": [9], "preempted": [],
             "seqs": {7: {"tokens": 6, "table": [0, 1]}, 8: {"tokens": 5, "table": [1, 3]}}}
    shown = block_pool_html("demo", state, base=7, block_size=4)
    assert "demo, after step 3 (decode)</b>: 3 of 4 blocks held" in shown
    assert ">2x<" in shown and shown.count("repeating-linear-gradient") == 1  # one shared block, hatched
    assert shown.count("border:1px solid #555") == 1  # one cached block outlined
    assert "width:100%" in shown and "width:25%" in shown  # filled in proportion to its tokens
    assert "seq  0:   6 tokens, blocks [0, 1]" in shown and "running 2, waiting 1" in shown


# --- chapter 3: the committed benchmark run read beside the live measurements -----------------------

def ch03_results():
    """A small committed run in benchmarks/results/latest.json's schema (json_schema: quantized, breakdown)."""
    eng = {"ours int8": {"median": 30.0, "min": 25.0, "max": 40.0, "n": 5, "format": "int8", "compiled": False},
           "ours int4 g32 compiled": {"median": 50.0, "min": 45.0, "max": 52.0, "n": 5, "format": "int4 g32",
                                      "compiled": True},
           "ours int8 compiled": {"median": 44.0, "min": 40.0, "max": 47.0, "n": 5, "format": "int8", "compiled": True},
           "ours bf16 compiled": {"median": 60.0, "min": 55.0, "max": 62.0, "n": 5, "format": "bf16", "compiled": True},
           "llama.cpp (Q4_1 GGUF)": {"median": 80.0, "min": 78.0, "max": 82.0, "n": 5, "format": "llama.cpp"},
           "Hugging Face generate() fp32": {"median": 14.0, "min": 13.0, "max": 15.0, "n": 5, "format": "fp32"}}
    return {"machine": {"cpu": "Test CPU", "cores": 2, "isa": ["avx2", "avx512f", "amx_int8"], "date": "2026-12-02"},
            "quantized": {"engines": eng, "best": "ours int4 g32 compiled",
                          "vs_llama_cpp": {"ours int4 g32 compiled": {"median": 0.62, "min": 0.58, "max": 0.66}},
                          "vs_hf": {"ours int4 g32 compiled": {"median": 3.5, "min": 2.9, "max": 3.9}},
                          "llama_cpp": {"version": "0.3", "threads": 2}},
            "breakdown": {"int8": {"step_ms": {"median": 23.0, "min": 21.0, "max": 26.0}, "weight_MB": 135.0,
                                   "law_ms": 8.0, "kernels_ms": {"qkv": 3.0, "o": 1.0, "gate_up": 6.0, "down": 3.0,
                                                                 "lm_head": 2.0},
                                   "outside_ms": 8.0, "compiled": True},
                          "int4 g32": {"step_ms": {"median": 20.0, "min": 19.0, "max": 22.0}, "weight_MB": 95.0,
                                       "law_ms": 5.5, "kernels_ms": {"qkv": 2.0, "o": 1.0, "gate_up": 4.0, "down": 2.0,
                                                                     "lm_head": 2.0},
                                       "outside_ms": 9.0, "compiled": True}}}


def test_ch03_peers_markdown_states_the_best_compiled_engine_against_both_peers():
    from inference_course.figures.ch03 import peers_markdown

    text = peers_markdown(ch03_results())
    # the compiled int4 engine (50 tok/s), not the faster bf16 one (not quantized) nor an eager one
    assert "our fastest quantized engine, ours int4 g32 compiled, decoded 50.0 tok/s (45.0–52.0)" in text
    assert "Test CPU; 2 cores; amx_int8, on 2026-12-02" in text  # the kernel-relevant ISA flags only
    cells = [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", text)]
    assert cells == ["ours int4 g32 compiled", "50.0 (45.0–52.0)", "—",
                     "llama.cpp (Q4_1 GGUF)", "80.0 (78.0–82.0)", "0.62× (rounds 0.58–0.66×)",
                     "Hugging Face generate() fp32", "14.0 (13.0–15.0)", "3.50× (rounds 2.90–3.90×)"]
    assert "slower than llama.cpp in every round and faster than Hugging Face generate() in every round" in text
    assert "not measured" not in text
    assert "AMX" not in text
    r = ch03_results()
    r["quantized"]["llama_cpp"]["fallback"] = "with its extra buffer types (AMX, repacking) it crashed"
    assert "llama.cpp ran without its AMX buffers" in peers_markdown(r)


def test_ch03_headline_engine_is_never_a_lever_that_changes_the_tokens():
    from inference_course.figures.ch03 import best_compiled

    r = ch03_results()
    q = r["quantized"]
    q["engines"]["ours Q4_1, int4 LM head compiled"] = {"median": 70.0, "min": 65.0, "max": 72.0, "n": 5,
                                                        "format": "q4_1 int4-head", "compiled": True}
    assert best_compiled(q) == "ours int4 g32 compiled"  # the faster int4-head engine is a lever, not the headline
    del q["engines"]["ours int4 g32 compiled"]
    assert "int4-head" not in q["engines"][best_compiled(q)]["format"]
    # the file's own Q8_0 head is no lever: the block kernels' engine heads the table, and is explained
    q["engines"]["ours Q4_1, Q8_0 head, VNNI kernels compiled"] = {"median": 60.0, "min": 55.0, "max": 62.0, "n": 5,
                                                                  "format": "q4_1 q8_0-head vnni", "compiled": True}
    assert best_compiled(q) == "ours Q4_1, Q8_0 head, VNNI kernels compiled"
    from inference_course.figures.ch03 import peers_markdown
    assert "two int8 codes per block of 32, not one" in peers_markdown(r)


def test_ch03_peers_markdown_says_what_the_committed_run_lacks():
    from inference_course.figures.ch03 import NOT_MEASURED, peers_markdown

    r = ch03_results()
    del r["quantized"]["vs_llama_cpp"], r["quantized"]["engines"]["llama.cpp (Q4_1 GGUF)"]
    r["quantized"]["llama_cpp"] = "unmeasured: llama_cpp is not importable here"
    r["quantized"]["vs_hf"]["ours int4 g32 compiled"] = {"median": 1.05, "min": 0.9, "max": 1.2}
    text = peers_markdown(r)
    assert f"llama.cpp: {NOT_MEASURED} (llama_cpp is not importable here)." in text
    assert "level with Hugging Face generate() within the rounds' spread (0.90–1.20×)" in text
    assert peers_markdown({}) == f"Our quantized engines against llama.cpp and Hugging Face: {NOT_MEASURED}."
    del r["machine"]
    assert f"the machine it ran on is {NOT_MEASURED}" in peers_markdown(r)


def test_ch03_breakdown_figure_stacks_law_kernels_and_the_rest_to_the_step():
    import matplotlib

    matplotlib.use("Agg")
    from inference_course.figures.ch03 import breakdown_figure, breakdown_parts
    from inference_course.plotting import check_legible, use_book_style

    use_book_style()
    r = ch03_results()
    r["breakdown"]["q4_1 compiled"] = {"error": "FailOnRecompileLimitHit: ...", "compiled": True}  # drawn without it
    parts = breakdown_parts(r["breakdown"]["int8"])
    assert parts == {"law_ms": 8.0, "kernels_beyond": 7.0, "outside_ms": 8.0, "kernels_ms": 15.0}
    fig = breakdown_figure(r)
    check_legible(fig)
    ax = fig.axes[0]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == sorted([8.0, 7.0, 8.0, 5.5, 5.5, 9.0])  # three parts per format, each its own bar
    assert [t.get_text() for t in ax.get_yticklabels()] == ["int4 g32", "int8"] and "compiled" in ax.get_title()
    r["breakdown"]["int8 eager"] = dict(r["breakdown"]["int8"], compiled=False)  # beside compiled rows: left out
    assert len(breakdown_figure(r).axes[0].get_yticklabels()) == 2
    assert "ms per token" in ax.get_xlabel()
    assert fig.get_figwidth() <= 5  # narrow: a phone shows it at most ~1.4x smaller, its text still legible
    assert breakdown_figure({}) is None and breakdown_figure({"breakdown": {}}) is None


@pytest.mark.parametrize("section, said_as", [("breakdown", "The breakdown"), ("quality", "The quality table"),
                                              ("quantized", "The per-format comparison")])
def test_ch03_a_section_says_when_a_later_run_measured_it(section, said_as):
    from inference_course.figures.ch03 import section_run

    r = ch03_results()
    assert section_run(r, section) is None  # the committed run's own figures: nothing to say
    r[f"{section}_run"] = {"date": "2026-12-03 08:04 UTC", "commit": "a187798", "note": "the section alone"}
    said = section_run(r, section)
    assert said.startswith(said_as) and "2026-12-03 08:04 UTC" in said and "a187798" in said and "the section alone" in said
    assert all(section_run(r, other) is None for other in ("breakdown", "quality", "quantized") if other != section)
    if section == "quantized":  # chapter 3's sentence on the committed comparison says where it came from
        from inference_course.figures.ch03 import peers_markdown
        assert "this comparison run again on 2026-12-03 08:04 UTC, commit a187798" in peers_markdown(r)


def test_ch03_the_speculative_section_keeps_its_run_inside_itself():
    from inference_course.figures.ch03 import section_run

    r = ch03_results()
    r["speculative"] = {"pass_seconds": {}}
    assert section_run(r, "speculative") is None  # the committed run's own
    r["speculative"]["run"] = {"date": "2026-12-03 17:46 UTC", "commit": "6e8250d", "note": "some sections again"}
    assert section_run(r, "speculative") == ("The speculative figures are from a later run of some sections only, on "
                                             "the same machine (2026-12-03 17:46 UTC, commit 6e8250d: some sections again).")
    assert section_run(r, "breakdown") is None


def test_ch03_breakdown_source_names_the_run_once():
    from inference_course.figures.ch03 import breakdown_source, section_run

    r = ch03_results()
    assert breakdown_source(r) is None  # both the committed run's
    run = {"date": "2026-12-03 17:46 UTC", "commit": "6e8250d", "note": "some sections again"}
    r["breakdown_run"] = dict(run)
    assert breakdown_source(r) == section_run(r)  # a later run, the comparison not in it: said in full
    r["quantized_run"] = dict(run)
    assert breakdown_source(r) == "The breakdown below is from the same run as the comparison above."
    r["quantized_run"]["commit"] = "b06f0af"  # two different later runs: the breakdown's said in full
    assert breakdown_source(r) == section_run(r) and "6e8250d" in breakdown_source(r)


def test_ch03_find_results_walks_up_to_the_committed_run(tmp_path):
    import json

    from inference_course.figures.ch03 import find_results, load_results

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "latest.json").write_text(json.dumps({"note": "x"}))
    (tmp_path / "chapters").mkdir()
    assert find_results(tmp_path / "chapters") == tmp_path / "benchmarks" / "results" / "latest.json"
    assert load_results(find_results(tmp_path / "chapters")) == {"note": "x"}
    assert load_results(None) == {}


def test_ch03_table_html_has_one_cell_per_column():
    import pytest

    from inference_course.figures.ch03 import table_html

    html = table_html(["a", "b"], [["x", "1"], ["y", "2"]])
    assert html.count("<th ") == 2 and html.count("<td ") == 4 and "text-align:right" in html
    with pytest.raises(ValueError):
        table_html(["a", "b"], [["x"]])


# --- chapter 3 and Benchmarks: one bandwidth (the median sample), sentences that follow the run -------

def test_bandwidth_is_the_median_sample_and_restates_every_law_at_it():
    from inference_course.figures.ch03 import at_median_bandwidth, bandwidth, bandwidth_words, ridge_range

    r = {"bandwidth_GB_s": 80.0, "bandwidth_samples_GB_s": [40.0, 50.0, 80.0], "matmul_fp32_GFLOP_s": 200.0,
         "decode": {"float32": {"bound_tok_s": 100.0, "engines": {"x": {"median": 20.0, "pct_of_bound": 20.0}}}},
         "breakdown": {"q4_1": {"bandwidth_GB_s": 80.0, "law_ms": 8.0, "step_ms": {"median": 20.0}}}}
    bw = bandwidth(r)
    assert (bw["median"], bw["best"], bw["min"], bw["n"]) == (50.0, 80.0, 40.0, 3)
    assert bandwidth_words(bw) == "50.0 GB/s, the median of 3 samples (40.0–80.0)"
    m = at_median_bandwidth(r)
    assert m["bandwidth_GB_s"] == 50.0 and m["breakdown"]["q4_1"]["bandwidth_GB_s"] == 50.0
    assert m["decode"]["float32"]["bound_tok_s"] == pytest.approx(62.5)        # bandwidth ÷ bytes
    assert m["decode"]["float32"]["engines"]["x"]["pct_of_bound"] == pytest.approx(32.0)
    assert m["breakdown"]["q4_1"]["law_ms"] == pytest.approx(12.8)             # bytes ÷ bandwidth
    assert m["breakdown"]["q4_1"]["step_ms"] == {"median": 20.0}               # a measured time stays
    assert r["breakdown"]["q4_1"]["law_ms"] == 8.0 and r["bandwidth_GB_s"] == 80.0  # the input is untouched
    assert at_median_bandwidth(m) == m                                           # once is enough
    assert ridge_range(r) == (2.5, 4.0)
    assert bandwidth({"note": "x"}) is None and ridge_range({"bandwidth_GB_s": 80.0}) is None
    old = bandwidth({"bandwidth_GB_s": 70.0})  # a run from before the samples: its one value
    assert old["median"] == old["best"] == 70.0 and "its one sample" in bandwidth_words(old)


def _gpu():
    return {"name": "H100 SXM", "b_crit": 295.0, "dtype": "bf16", "bandwidth": 3.35e12, "flops": 989e12,
            2: 1.0, 4: 1.0, 16: 1.01}


def _grow(lo, hi):
    from inference_internals.timing import Spread

    return {2: Spread((lo, (lo + hi) / 2, hi)), 4: Spread((lo, (lo + hi) / 2, hi)), 16: Spread((1.8, 2.0, 2.4))}


@pytest.mark.parametrize("lo, hi, said, summary", [
    (1.0, 1.1, "nearly free, as the roofline says", "This run agreed"),
    (1.4, 1.7, "batching is not nearly free on this CPU", "On this CPU it was not"),
    (1.1, 1.5, "this run could not tell", "On this CPU this run could not tell")])
def test_section_6_says_flat_only_where_the_rounds_show_it(lo, hi, said, summary):
    from inference_course.figures.ch03 import batching_markdown, summary_batching

    roof = {2: 1.0, 4: 1.0, 16: 1.5}
    text = batching_markdown(_grow(lo, hi), roof, _gpu(), 9.0, 12.0, 5.0, "live on cpu", 5)
    assert said in text
    assert ("nearly free" in text.split("On a GPU")[0]) == (lo < 1.25 and hi < 1.25) or "not nearly free" in text
    # the GPU's numbers are the roofline's, and the page says so
    assert "H100 SXM" in text and "295" in text and "not a measurement" in text
    if "not nearly free" in text:
        assert "5.0× the time its" in text  # the reason, measured: not waiting on the weight reads
    s = summary_batching(_grow(lo, hi), roof, _gpu(), 9.0)
    assert summary in s and "B_crit 295" in s


def test_section_6_says_when_the_roofline_itself_expected_the_cost():
    from inference_course.figures.ch03 import batching_markdown

    text = batching_markdown(_grow(1.4, 1.7), {2: 1.4, 4: 1.9, 16: 7.0}, _gpu(), 1.2, 1.5, 1.1, "live", 5)
    assert "the roofline expected that too" in text and "not nearly free" not in text


@pytest.mark.parametrize("ridge, fp32, four", [(3.0, "left of", "near"), (20.0, "left of", "left of"),
                                               (0.5, "near", "right of")])
def test_summary_places_decode_against_this_machines_ridge_and_a_gpus(ridge, fp32, four):
    from inference_course.figures.ch03 import summary_intensity

    text = summary_intensity(ridge, 295.0, "H100 SXM", (2.6, 4.5))
    assert (f"both {four} it" if fp32 == four else f"fp32 {fp32} it, 4-bit {four} it") in text
    assert "H100 SXM: 295" in text and f"is {ridge:.1f} FLOPs per byte" in text
    assert "has 2.6–4.5" in text and "4-bit decode is near it" in text
    assert "committed" not in summary_intensity(ridge, 295.0, "H100 SXM", None)


def test_moved_words_counts_positions():
    from inference_course.figures.ch03 import moved_words

    assert moved_words(1.0, 202) == "all 202 positions keep fp32's top token"
    assert moved_words(1 - 1 / 202, 202) == "1 of 202 positions moves"
    assert moved_words(0.9, 200) == "20 of 200 positions move"


def test_benchmarks_headline_leads_with_ours_llama_cpp_and_hugging_face():
    from inference_course.figures import bench

    r = ch03_results() | {"bandwidth_GB_s": 80.0, "bandwidth_samples_GB_s": [40.0, 50.0, 80.0],
                          "matmul_fp32_GFLOP_s": 200.0}
    text = bench.headline(r)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| batch-1 decode |")
    assert rows[1].startswith("| **ours int4 g32 compiled** | 50.0")  # the fastest compiled quantized engine
    assert "| llama.cpp (Q4_1 GGUF) | 80.0" in text and "| Hugging Face generate() fp32 | 14.0" in text
    assert "0.62× <small>(0.58–0.66)</small>" in text and "3.50× <small>(2.90–3.90)</small>" in text
    assert "slower than llama.cpp on the same GGUF in every round" in text
    assert "faster than Hugging Face at fp32 in every round" in text
    assert f"Prefill: {bench.NOT_MEASURED}." in text  # this small run has no prefill section
    assert "{" not in text  # sentences and tables, no Python dicts
    r["prefill"] = {"prompt_tokens": 256, "dtype": "float32", "engines": {
        "ours (optimized)": {"median": 600.0, "min": 590.0, "max": 610.0},
        "Hugging Face forward": {"median": 500.0, "min": 490.0, "max": 510.0}}}
    text = bench.headline(r)
    assert "| ours (optimized) | 600" in text and "faster than Hugging Face's forward" in text
    table = bench.machine_table(r)
    assert "50.0 GB/s, the median of 3 samples (40.0–80.0)" in table and "4.0 at the median bandwidth" in table


def test_benchmarks_pages_show_no_code_and_lead_with_the_headline():
    import json
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    pages = {name: json.loads((book / f"{name}.ipynb").read_text()) for name in ("benchmarks", "benchmarks_more")}
    for name, nb in pages.items():
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert code and all("remove-input" in c["metadata"].get("tags", []) for c in code), name
        assert all(c.get("id") for c in nb["cells"]), name  # ids kept: the cache and the reviewers' links
    first = pages["benchmarks"]["cells"]
    # the title, then the cell that renders the headline table: on the first screen
    assert first[0]["cell_type"] == "markdown" and first[1]["cell_type"] == "code"
    assert "bench.headline(r)" in "".join(first[1]["source"])
    assert "benchmarks_more" in "".join(first[0]["source"])


# --- chapter 7: the committed Gemma run beside Hugging Face and llama.cpp ---------------------------

def gemma_run(cpp_rounds, hf_rounds=(4.0, 4.2, 3.9), tokens_equal=True):
    from inference_course.figures.ch07 import HF32, LLAMA_CPP

    def e(m, mb):
        return {"median": m, "min": m * 0.9, "max": m * 1.1, "n": 3, "weight_MB": mb}
    return {"machine": {"cpu": "Test CPU", "cores": 2, "date": "2026-12-05 17:00 UTC", "commit": "abc1234"},
            "bandwidth_samples_GB_s": [10.0, 20.0, 30.0],
            "gemma": {"engines": {"ours fp32": e(10.0, 1070), "ours int4 g32": e(40.0, 200),
                                  "ours int4 g32, 4-bit head": e(60.0, 120), LLAMA_CPP: e(50.0, 253), HF32: e(10.0, 1070)},
                      "vs_llama_cpp": {"ours int4 g32": {"median": sorted(cpp_rounds)[1], "min": min(cpp_rounds),
                                                         "max": max(cpp_rounds), "rounds": list(cpp_rounds)}},
                      "vs_hf": {"ours int4 g32": {"median": sorted(hf_rounds)[1], "min": min(hf_rounds),
                                                  "max": max(hf_rounds), "rounds": list(hf_rounds)}},
                      "tokens": {"n": 32, "hf_equals_ours_fp32": tokens_equal,
                                 "same_prefix_as_fp32": {"ours int4 g32": 9, LLAMA_CPP: 7}},
                      "rounds": 3, "new_tokens": 32, "prompt_tokens": 8}}


@pytest.mark.parametrize("rounds, said", [((0.7, 0.8, 0.75), "slower than llama.cpp on the same file in every round (0.75×)"),
                                          ((1.2, 1.3, 1.4), "faster than llama.cpp on the same file in every round (1.30×)"),
                                          ((0.9, 1.1, 1.0), "level with llama.cpp on the same file within the rounds' spread (0.90–1.10×)")])
def test_ch07_gemma_comparison_says_what_the_rounds_show(rounds, said):
    from inference_course.figures.ch07 import gemma_comparison

    table, text = gemma_comparison(gemma_run(rounds))
    # the fastest format with an 8-bit head, never the 4-bit head (shown apart)
    assert "Our fastest format with an 8-bit LM head, ours int4 g32, was " + said in text
    assert "faster than Hugging Face at fp32 in every round (4.00×)" in text
    assert "equal ours at fp32" in text and "first 7 of 32, and ours int4 g32 for its first 9" in text
    assert "not its best path" not in text
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == 5 and all(row.count("|") == 7 for row in rows)
    # % of the law at the median bandwidth sample (20 GB/s): 40 tok/s x 200 MB = 8 GB/s = 40%
    assert "| ours int4 g32 | 200 | 40.0 <small>(36.0–44.0)</small> | 40% |" in table


def test_ch07_gemma_comparison_says_what_the_run_lacks():
    from inference_course.figures.ch07 import gemma_comparison

    assert gemma_comparison({}) == ("", "Gemma 3 beside Hugging Face and llama.cpp: not measured in the committed run.")
    _, text = gemma_comparison(gemma_run((1.2, 1.3, 1.4), tokens_equal=False))
    assert "differ from ours at fp32" in text
    crashed = gemma_run((1.2, 1.3, 1.4))
    crashed["gemma"]["llama_cpp"] = {"fallback": "with its extra buffer types (AMX, repacking) it crashed at the first "
                                                 "prefill (the llama.cpp peer exited (-11)); run with use_extra_bufts=false"}
    _, text = gemma_comparison(crashed)
    assert "extra buffer types off" in text and "this is not its best path" in text
    del crashed["gemma"]["engines"]["llama.cpp (Q4_K_M GGUF)"]
    crashed["gemma"]["llama_cpp"] = "unmeasured: no llama.cpp peer here"
    assert "llama.cpp: unmeasured: no llama.cpp peer here." in gemma_comparison(crashed)[1]


def _best_run(ours_over_cpp: list[float]) -> dict:
    """A planted llama_cpp_best section: two contexts, ours at the given per-round ratios to llama.cpp Q4_0."""
    ours, cpp = "ours Q4_0 (the door, compiled)", "llama.cpp Q4_0 (repacked)"
    rate = {"median": 100.0, "min": 90.0, "max": 110.0, "n": 3}
    rounds = {"median": sorted(ours_over_cpp)[1], "min": min(ours_over_cpp), "max": max(ours_over_cpp),
              "rounds": ours_over_cpp}
    side = {c: {ours: rate | {"pct_of_law": 40.0, f"vs {cpp}": rounds}, cpp: rate | {"pct_of_law": 50.0}}
            for c in ("512", "4096")}
    pre = {c: {ours: dict(rate, **{f"vs {cpp}": rounds}), cpp: dict(rate)} for c in ("512", "4096")}
    return {"contexts": [512, 4096], "decode": side, "prefill": pre}


def test_the_llama_cpp_best_sentences_follow_the_rounds():
    from inference_course.figures import bench

    behind = bench.llama_cpp_best(_best_run([0.8, 0.85, 0.9]))
    assert "at 512 tokens behind in every round (0.85×)" in behind and "ahead" not in behind
    assert "prefills 512 tokens at 0.85× its rate (slower in every round)" in behind
    ahead = bench.llama_cpp_best(_best_run([1.1, 1.2, 1.3]))
    assert "at 4096 tokens ahead in every round (1.20×)" in ahead and "behind" not in ahead
    level = bench.llama_cpp_best(_best_run([0.9, 1.0, 1.1]))
    assert "level within the rounds' spread" in level and "every round" not in level
    assert bench.llama_cpp_best({"unmeasured": "no peer"}) == "*Not measured in this run: no peer.*"
    # on an AMX CPU where llama.cpp was built without its AMX kernels, the page says which of ours used them
    run = _best_run([1.1, 1.2, 1.3]) | {"llama_cpp": {"version": "0.3.36", "system_info": "CPU : AVX512 = 1 | REPACK = 1 |"}}
    assert "#20824" not in bench.llama_cpp_best(run)  # no CPU flags: nothing said
    assert "ours took its prefills' integer sums" in bench.llama_cpp_best(run, ["avx512f", "amx_int8"])
    assert "#20824" not in bench.llama_cpp_best(run, ["avx512f", "avx512_vnni"])


def _step_parts(rest_ms: dict[str, float]) -> dict:
    """A step_parts section: each context's step of 10 ms (range 9.5-10.5) plus ``rest_ms[context]``."""
    def at(context, attention_ms, kv_mb, rest):
        kernels = {"qkv": 1.0, "o": 0.5, "gate_up": 2.0, "down": 1.0, "lm_head": 1.5}
        step = sum(kernels.values()) + attention_ms + rest
        weights = {"qkv": 10e6, "o": 5e6, "gate_up": 30e6, "down": 15e6, "lm_head": 30e6}
        return {"kernels_ms": kernels, "attention_ms": {"median": attention_ms, "min": attention_ms, "max": attention_ms},
                "part_bytes": weights | {"attention": kv_mb * 1e6, "outside": 1e5}, "outside_ms": rest,
                "step_ms": {"median": step, "min": step - 0.5, "max": step + 0.5, "n": 7}, "rounds": 7,
                "law_kv_ms": (90.1 + kv_mb) / 50.0, "weight_bytes": 90.1e6, "kv_MB": kv_mb}
    return {"step_parts": {"engine": "LLM(quantization='q4_1')", "bandwidth_GB_s": 50.0,
                           "bandwidth_samples_GB_s": [40.0, 50.0, 60.0],
                           "contexts": {"128": at(128, 0.5, 2.0, rest_ms["128"]), "8128": at(8128, 12.0, 180.0, rest_ms["8128"])}},
            "step_parts_run": {"date": "2026-12-06 21:51 UTC", "cpu": "AMD EPYC", "cores": 2, "commit": "abc", "note": ""}}


def test_ch03_step_parts_split_the_door_step_and_say_only_what_the_rounds_show():
    from inference_course.figures.ch03 import NOT_MEASURED, step_parts_markdown

    text = step_parts_markdown(_step_parts({"128": 0.2, "8128": -0.3}))
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", text)]
    # projections (q k v, o, gate·up, down), the head, attention: ms and the MB each reads, per context
    assert cells[:9] == ["projections (q k v, o, gate·up, down)", "4.5 (60.0 MB)", "4.5 (60.0 MB)",
                         "LM head", "1.5 (30.0 MB)", "1.5 (30.0 MB)",
                         "attention over the cache", "0.5 (2.0 MB)", "12.0 (180.0 MB)"]
    assert "AMD EPYC, 2 cores, 2026-12-06 21:51 UTC; 50.0 GB/s, the median of 3 samples" in text
    assert "attention takes 12.0 of 17.7 ms (68%)" in text
    assert "kernels read at 15.0 GB/s, attention at 15.0 GB/s, against the law's 50.0" in text
    assert "within the step's range over its rounds after 128 and 8,128 tokens" in text
    # a rest beyond the rounds' range is named for what it is, either way
    text = step_parts_markdown(_step_parts({"128": 2.0, "8128": -3.0}))
    assert "within the step's range" not in text
    assert "After 128 tokens 2.0 ms of the step runs outside the parts" in text
    assert "After 8,128 tokens the parts, each timed on its own, add up to 3.0 ms more than the step" in text
    assert step_parts_markdown({}) == f"Where a step goes at a short and a long context: {NOT_MEASURED}."
    assert "(RuntimeError: no compiler)" in step_parts_markdown({"step_parts": {"error": "RuntimeError: no compiler"}})


def _door_batches(ours_over_cpp: list[float]) -> dict:
    def st(xs):
        return {"median": sorted(xs)[len(xs) // 2], "min": min(xs), "max": max(xs), "n": len(xs)}
    return {"batches": [1, 4], "new_tokens": 32, "rounds": 3,
            "engines": {"ours: the door": {"1": {"tok_s": st([100.0, 110.0, 90.0])}, "4": {"tok_s": st([300.0, 320.0, 280.0])}},
                        "llama.cpp Q4_0": {"1": {"tok_s": st([150.0, 160.0, 140.0])}, "4": {"tok_s": st([200.0, 210.0, 190.0])}}},
            "over_batch_1": {"ours: the door": {"4": st([3.0, 2.9, 3.1])}, "llama.cpp Q4_0": {"4": st([1.3, 1.4, 1.2])}},
            "ours_over": {"llama.cpp Q4_0": {"1": st([0.6, 0.7, 0.65]), "4": st(ours_over_cpp)}},
            "tokens": {"ours: the door": {"1": {"same_as_ours_alone": 1, "of": 1}, "4": {"same_as_ours_alone": 4, "of": 4}},
                       "llama.cpp Q4_0": {"1": {"same_as_ours_alone": 0, "of": 1}, "4": {"same_as_ours_alone": 1, "of": 4}}}}


@pytest.mark.parametrize("rounds, said", [([1.4, 1.5, 1.6], "at 4 ahead in every round (1.50×)"),
                                          ([0.9, 1.1, 1.2], "at 4 level within the rounds' spread (1.10×)"),
                                          ([0.7, 0.8, 0.9], "at 4 behind in every round (0.80×)")])
def test_door_batches_say_what_the_rounds_show(rounds, said):
    from inference_course.figures.bench import door_batches

    text = door_batches(_door_batches(rounds))
    assert "| requests at once | ours: the door, tok/s | llama.cpp Q4_0, tok/s |" in text
    assert "| 4 | 300 <small>(280–320)</small> | 200 <small>(190–210)</small> |" in text
    assert "times 4 requests 3.0× <small>(2.9–3.1)</small> (per round)" in text
    assert "at 1 behind in every round (0.65×); " + said in text
    assert "Requests whose tokens equal ours alone: llama.cpp Q4_0 1 of 5" in text
    assert "ours gave every request, in every batch and round, the 32 greedy tokens" in text
    run = _door_batches(rounds) | {"ours_near_ties": {"tol": 0.005, "changed": {"4": [
        {"round": 0, "request": 2, "index": 6, "margin": 0.0018}]}}}
    run["tokens"]["ours: the door"]["4"]["same_as_ours_alone"] = 3
    assert ("ours gave 4 of 5 requests (the last round's) the 32 greedy tokens it gives that prompt alone; over all "
            "rounds, request 2 of the batch of 4 (round 1) first differed at token 6, where our plain forward's top two "
            "logits are 0.0018 apart") in door_batches(run)
    assert door_batches({"unmeasured": "no peers"}) == "*Not measured in this run: no peers.*"


def test_door_batches_say_where_only_ours_had_amx():
    """A run where ours used AMX and llama.cpp was built without it says so; a run without AMX says nothing."""
    from inference_course.figures.bench import door_batches

    run = _door_batches([1.4, 1.5, 1.6])
    assert "AMX" not in door_batches(run)
    run["engines"]["ours with AMX off"] = run["engines"]["ours: the door"]
    run["llama_cpp"] = {"version": "0.3.36", "system_info": "CPU : AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 |"}
    assert "llama.cpp 0.3.36 was built without its AMX kernels, which crash here (llama.cpp issue #20824)" in door_batches(run)
    run["llama_cpp"]["system_info"] += " AMX_INT8 = 1 |"
    assert "#20824" not in door_batches(run)


def _spec_schedule(constant: list[float], heuristic: list[float]) -> dict:
    def st(xs, rounds=False):
        d = {"median": sorted(xs)[len(xs) // 2], "min": min(xs), "max": max(xs), "n": len(xs)}
        return d | {"rounds": xs} if rounds else d

    def entry(over, kept):
        return {"tok_s": st([100 * x for x in over]), "over_plain": st(over, rounds=True),
                "guesses": {"proposed": 100, "accepted": kept, "verify_passes": 40}}
    return {"prompts": {"open-ended": 3}, "new_tokens": 64, "rounds": 3,
            "engines": {"plain decoding": {"open-ended": {"tok_s": st([100.0, 110.0, 90.0])}},
                        "prompt lookup, γ 4, constant": {"open-ended": entry(constant, 20)},
                        "prompt lookup, γ 4, heuristic": {"open-ended": entry(heuristic, 30)}}}


@pytest.mark.parametrize("constant, heuristic, said", [
    ([0.7, 0.75, 0.8], [0.85, 0.9, 0.95], "constant γ loses in every round (0.75×), the heuristic loses in every round "
                                          "(0.90×), faster than constant γ in every round (1.20×)"),
    ([1.1, 1.2, 1.3], [0.9, 1.25, 1.4], "constant γ pays in every round (1.20×), the heuristic is level with plain decoding within the "
                                        "rounds' spread (1.25×), "
                                        "level with constant γ within the rounds' spread (1.04×)")])
def test_spec_schedule_says_what_the_rounds_show(constant, heuristic, said):
    from inference_course.figures.bench import spec_schedule

    text = spec_schedule(_spec_schedule(constant, heuristic))
    assert "| engine | open-ended prompts, tok/s | × plain | guesses kept |" in text
    assert "| prompt lookup, γ 4, heuristic |" in text and "| 30 of 100, 1.75 a pass |" in text
    assert f"- **prompt lookup, γ 4**: on the open-ended prompts {said}." in text, text
    assert spec_schedule({"error": "RuntimeError: no compiler"}) == "*Not measured in this run: RuntimeError: no compiler.*"


def test_spec_schedule_says_what_sampling_did():
    from inference_course.figures.bench import spec_schedule

    run = _spec_schedule([0.7, 0.75, 0.8], [0.85, 0.9, 0.95])
    hot = _spec_schedule([1.1, 1.2, 1.3], [1.0, 1.0, 1.0])["engines"]["prompt lookup, γ 4, constant"]
    run["engines"]["plain decoding, T 0.7"] = run["engines"]["plain decoding"]
    run["engines"]["prompt lookup, γ 4, constant, T 0.7"] = hot
    run["sampled_temperature"] = 0.7
    text = spec_schedule(run)
    assert "- **Sampling at T 0.7**, constant γ: prompt lookup on the open-ended prompts pays in every round (1.20×)." in text
    assert "- **prompt lookup, γ 4**: on the open-ended prompts constant γ loses in every round (0.75×)" in text
