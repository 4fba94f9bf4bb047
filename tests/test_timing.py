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
