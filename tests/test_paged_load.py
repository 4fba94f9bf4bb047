"""The load simulator: Poisson arrivals, the step-cost fit, and the virtual-clock replay."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals.engine import BlockPool, Scheduler, StaticScheduler
from inference_internals.analysis.load import StepCost, poisson_arrivals, simulate, summarize
from inference_internals.analysis.trace import make_trace


def test_poisson_arrivals_have_the_asked_rate_and_are_seeded():
    a = poisson_arrivals(20_000, 4.0, seed=1)
    assert a == poisson_arrivals(20_000, 4.0, seed=1) and a != poisson_arrivals(20_000, 4.0, seed=2)
    assert all(x < y for x, y in zip(a, a[1:]))
    assert abs(len(a) / a[-1] - 4.0) < 0.1
    with pytest.raises(ValueError):
        poisson_arrivals(5, 0.0)


def test_step_cost_fit_recovers_a_known_model_and_keeps_coefficients_nonnegative():
    rng = np.random.default_rng(0)
    feats = rng.integers(1, 500, size=(60, 3)) * [1, 1, 100]
    true = StepCost(0.01, 2e-4, 1e-3, 0.0)
    secs = [true(*f) for f in feats]
    fit = StepCost.fit(feats, secs)
    assert fit.base == pytest.approx(0.01, rel=1e-6) and fit.per_token == pytest.approx(2e-4, rel=1e-6)
    noisy = StepCost.fit(feats, [s - 1e-9 * f[2] for s, f in zip(secs, feats)])  # a negative slope is not a cost
    assert min(noisy.base, noisy.per_token, noisy.per_seq, noisy.per_score) >= 0
    with pytest.raises(ValueError):
        StepCost.fit(feats[:2], secs[:2])
    with pytest.raises(ValueError, match="positive"):
        StepCost.fit(feats, [0.0] + secs[1:])


def test_step_cost_fit_weighs_errors_relative_to_each_steps_time():
    """Short steps and long steps count alike: one slow 1 s outlier among 10 ms steps moves the
    fit by a fraction of a short step, where an absolute fit would move it by far more."""
    feats = [(t, 1, 0) for t in range(1, 41)]
    secs = [0.01 + 1e-4 * t for t, *_ in feats]
    secs[-1] = 1.0
    fit = StepCost.fit(feats, secs)
    assert abs(fit(1, 1, 0) - secs[0]) / secs[0] < 0.2
    X = np.column_stack([np.ones(len(feats)), [f[0] for f in feats]])
    absolute = np.linalg.lstsq(X, secs, rcond=None)[0]
    assert abs(absolute[0] + absolute[1] - secs[0]) / secs[0] > 0.5  # what relative weighting avoids


COST = StepCost(0.01, 1e-3, 2e-3, 1e-7)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), rate=st.floats(0.5, 200), policy=st.sampled_from(["static", "continuous", "chunked"]),
       budget=st.integers(16, 64), seed=st.integers(0, 100))
def test_every_request_finishes_in_order_of_its_events(n, rate, policy, budget, seed):
    trace = make_trace(n, (1, 60), (1, 20), seed=seed)
    arrivals = poisson_arrivals(n, rate, seed=seed)
    pool = BlockPool(64, 4, enable_prefix_caching=False)
    sched = (StaticScheduler(pool, 80, 8) if policy == "static" else
             Scheduler(pool, 8, budget, watermark=0, mixed=True, chunked=policy == "chunked"))
    timed = simulate(sched, trace, arrivals, COST, seed=seed)
    assert pool.num_free == 64 and not sched.has_unfinished()
    for t, r, a in zip(timed, trace, arrivals):
        assert t.arrival == a < t.first_token <= t.finish and t.output_tokens == r.output_len
    s = summarize(timed)
    assert s["ttft_p50"] <= s["ttft_p99"] and s["throughput"] > 0


def test_an_idle_server_answers_at_the_cost_of_the_steps_alone():
    """Requests far apart never queue: TTFT is one prefill step, TPOT one decode step."""
    trace = make_trace(5, (10, 10), (4, 4), seed=0)
    arrivals = [100.0 * (i + 1) for i in range(5)]
    timed = simulate(Scheduler(BlockPool(32, 4), 4, 64, mixed=True), trace, arrivals, COST)
    for t in timed:
        assert t.ttft == pytest.approx(COST(10, 1, 10 * 12))
        assert t.tpot == pytest.approx(np.mean([COST(1, 1, 12), COST(1, 1, 12), COST(1, 1, 16)]))
    with pytest.raises(ValueError, match="arrival"):
        simulate(Scheduler(BlockPool(32, 4)), trace, arrivals[::-1], COST)
