"""The one clock: it synchronizes, counts its calls, sees the work it times; and the engine's
timers built on it (prefill, a decode step at a given context) do the work they claim to."""
import time

import pytest
import torch

from inference_internals import timing
from inference_internals.model import LlamaConfig, random_model

TINY = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def test_clock_timed_and_timer_agree_on_a_sleep():
    out, dt = timing.timed(lambda x: time.sleep(x) or "done", "cpu", 0.01)
    assert out == "done" and dt >= 0.01
    times = []
    with timing.timer("cpu", times):
        time.sleep(0.01)
    assert len(times) == 1 and times[0] >= 0.01
    assert timing.clock("cpu") <= timing.clock()


def test_time_call_counts_calls():
    calls = []
    times = timing.time_call(lambda: calls.append(1), budget_s=0.0, min_reps=3, warmup=2)
    assert len(times) == 3 and len(calls) == 5 and all(t >= 0 for t in times)
    times = timing.time_call(lambda: None, budget_s=10.0, min_reps=1, max_reps=7)
    assert len(times) == 7


def test_time_call_sees_the_work():
    short = min(timing.time_call(lambda: time.sleep(0.001), budget_s=0.0, min_reps=3))
    long = min(timing.time_call(lambda: time.sleep(0.02), budget_s=0.0, min_reps=3))
    assert short >= 0.001 and long >= 0.02 and long > short


def test_op_counts_counts_top_level_ops_exactly():
    x = torch.zeros(4)
    counts = timing.op_counts(lambda: (torch.add(x, 1), torch.add(x, 2), x.sum(), torch.matmul(x, x)))
    assert counts == {"aten::add": 2, "aten::sum": 1, "aten::matmul": 1}  # matmul's inner dot not recounted


def test_dispatched_op_counts_counts_every_kernel_that_runs():
    x = torch.zeros(4)
    counts = timing.dispatched_op_counts(lambda: (torch.add(x, 1), torch.add(x, 2), x.sum(), torch.matmul(x, x)))
    assert counts == {"aten::add": 2, "aten::sum": 1, "aten::dot": 1}  # matmul runs as a dot on vectors
    assert timing.dispatched_op_counts(lambda: None) == {}


# --- timing the engine ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return random_model(TINY, seed=0, device="cpu")


def test_engine_timers(tiny):
    assert len(timing.time_prefill(tiny, 16, batch=2, budget_s=0.0, min_reps=2)) == 2
    times = timing.time_decode_step(tiny, 40, batch=3, budget_s=0.0, min_reps=4)
    assert len(times) == 4 and all(t > 0 for t in times)
    # The deepest decode the context window allows: the cache holds 63 tokens, the step adds one.
    timing.time_decode_step(tiny, TINY.max_position_embeddings - 1, budget_s=0.0, min_reps=1)


def test_engine_timers_reject_bad_input(tiny):
    with pytest.raises(ValueError, match="prompt_len"):
        timing.time_prefill(tiny, 0)
    with pytest.raises(ValueError, match="context"):
        timing.time_decode_step(tiny, -1)
    with pytest.raises(ValueError, match="batch"):
        timing.time_decode_step(tiny, 4, batch=0)
    with pytest.raises(ValueError, match="context window"):
        timing.time_decode_step(tiny, TINY.max_position_embeddings)


def test_decode_step_attends_to_the_whole_context(tiny, monkeypatch):
    """The cache-length shortcut does real work: every step's queries see context + 1 keys."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[2], k.shape[2]))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    timing.time_decode_step(tiny, 50, budget_s=0.0, min_reps=2, warmup=1)
    assert seen == [(1, 51)] * (3 * TINY.num_hidden_layers)


# --- honest comparisons ---------------------------------------------------------------------------

def test_spread_decides_only_outside_its_band():
    s = timing.Spread([1.2, 1.4, 1.3])
    assert (s.median, s.lo, s.hi) == (1.3, 1.2, 1.4)
    assert s.above(1.0) is True and s.below(1.0) is False      # every round says "more"
    assert s.above(1.5) is False and s.below(1.5) is True      # every round says "less"
    assert s.above(1.3) is None and s.below(1.3) is None       # inside the band: cannot tell
    assert f"{s:.1f}" == "1.3 (rounds 1.2–1.4)" and f"{s:.1fx}" == "1.3× (rounds 1.2–1.4×)"
    assert s.map(lambda v: 2 * v).median == 2.6


def test_spread_of_many_rounds_ignores_one_stall():
    s = timing.Spread([1.0] * 9 + [0.9] + [50.0])  # one stalled round out of 11
    assert s.hi == 1.0 and s.above(2.0) is False
    assert timing.Spread([1.0] * 4 + [50.0]).above(2.0) is None  # with 5 rounds, every round counts


def test_spread_refuses_nothing_to_spread():
    with pytest.raises(ValueError):
        timing.Spread([])


def test_says_picks_the_sentence_the_rounds_support():
    faster, mixed = timing.Spread([0.5, 0.6, 0.55]), timing.Spread([0.8, 1.1, 0.95])
    assert timing.says(faster, 1, "slower", "faster") == "faster"
    assert timing.says(faster, 0.4, "slower", "faster") == "slower"
    assert timing.says(mixed, 1, "slower", "faster").startswith(timing.COULD_NOT_TELL)
    assert timing.says(mixed, 1, "slower", "faster", unsure="a tie") == "a tie"


def test_interleaved_alternates_and_ratio_pairs_rounds():
    order = []
    times = timing.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                               rounds=3, warmup=1)
    assert order == ["a", "b"] + ["a", "b"] * 3 and all(len(v) == 3 for v in times.values())
    r = timing.ratio([2.0, 4.0, 6.0], [1.0, 2.0, 2.0])  # a machine slowing down hits both sides
    assert r.values == (2.0, 2.0, 3.0) and r.above(1.5) is True
    with pytest.raises(ValueError):
        timing.ratio([1.0], [1.0, 2.0])


def test_ratio_of_stats_is_the_widest_band_the_summaries_allow():
    r = timing.ratio_of_stats({"median": 20.0, "min": 18.0, "max": 24.0}, {"median": 10.0, "min": 9.0, "max": 12.0})
    assert (r.lo, r.median, r.hi) == (1.5, 2.0, 24.0 / 9.0)
    assert r.above(1.4) is True and r.above(1.6) is None


def test_interleaved_sees_a_real_difference():
    times = timing.interleaved({"short": lambda: time.sleep(0.001), "long": lambda: time.sleep(0.01)}, rounds=3)
    assert timing.ratio(times["long"], times["short"]).above(2) is True


def test_rerun_if_off_reruns_once_and_says_so():
    results = iter([30.0, 1.2, 99.0])
    value, note = timing.rerun_if_off(lambda: next(results), predicted=1.0)
    assert value == 1.2 and "Noisy run" in note and "30.00×" in note and "still off" not in note
    calls = []
    value, note = timing.rerun_if_off(lambda: calls.append(1) or {"x": 2.0}, 1.0, of=lambda r: r["x"])
    assert value == {"x": 2.0} and note == "" and len(calls) == 1  # within 3x: measured once
    value, note = timing.rerun_if_off(lambda: 2.5, 1.0, first=9.0)  # measured already: rerun once
    assert value == 2.5 and "9.00×" in note
    value, note = timing.rerun_if_off(lambda: 0.1, 1.0)
    assert value == 0.1 and "still off" in note
    with pytest.raises(ValueError):
        timing.rerun_if_off(lambda: 1.0, 0.0)


def test_load_sees_a_busy_program():
    import subprocess
    import sys

    if timing.cpu_times() is None:
        pytest.skip("no /proc/stat here")
    with timing.Load() as quiet_here:
        time.sleep(0.3)  # this process sleeps: whatever runs is someone else
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        with timing.Load() as busy:
            time.sleep(0.5)
    finally:
        hog.kill()
        hog.wait()
    assert busy.others > 0.6 and busy.others > quiet_here.others - 0.3  # a looping program is ~one core
    assert "cores busy" in str(busy)


def test_busy_during_says_every_run_in_one_phrase(monkeypatch):
    monkeypatch.setattr(timing, "cpu_cores", lambda: 2)

    def load(others, seconds):
        x = timing.Load()
        x.others, x.seconds = others, seconds
        return x

    assert timing.busy_during({"this run": load(1.6, 3)}) == "other programs kept 1.6 of 2 cores busy during this run"
    # a list is one run, weighted by seconds: (1.0 * 1 + 2.0 * 3) / 4 = 1.75
    assert timing.busy_during({"this run": load(0.2, 1), "the others": [load(1.0, 1), load(2.0, 3)],
                               "a third": load(0.0, 1)}) == (
        "other programs kept 0.2 of 2 cores busy during this run, 1.8 during the others and 0.0 during a third")
    assert "unknown" in timing.busy_during({"a": load(None, 1), "b": load(1.0, 1)})
    with pytest.raises(ValueError):
        timing.busy_during({})
