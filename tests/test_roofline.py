"""The ceilings and the roofline formulas: exact arithmetic on the datasheet table, invariants on
random machines, sane (not fast) measurements, and clear errors."""
import time

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from inference_internals.analysis import roofline as hw
from inference_internals import timing

H100, A100, M2 = hw.GPUS["H100 SXM"], hw.GPUS["A100 80GB SXM"], hw.GPUS["Apple M2 Max (38-core GPU)"]

machines = st.builds(
    lambda bw, f32, ratio: hw.Machine("random", bw, {"fp32": f32, "bf16": f32 * ratio}),
    st.floats(1e9, 1e13), st.floats(1e9, 1e15), st.floats(0.1, 20))
dtypes = st.sampled_from(list(hw.WEIGHT_DTYPES))
params = st.floats(1e6, 1e12)


# --- the table and the formulas -----------------------------------------------------------------

def test_table_has_dense_figures_and_sources():
    assert {"A100 80GB SXM", "H100 SXM", "H200 SXM", "RTX 4090"} <= set(hw.GPUS)
    assert H100.bandwidth == 3.35e12 and H100.flops["bf16"] == 989e12  # dense: half the sparse 1979
    assert A100.bandwidth == 2039e9 and A100.flops["bf16"] == 312e12
    assert hw.GPUS["RTX 4090"].flops["bf16"] == pytest.approx(165.2e12)
    for gpu in hw.GPUS.values():
        assert gpu.bandwidth > 0 and gpu.flops and gpu.memory > 0
        assert gpu.source.startswith("https://")


def test_bandwidth_law_by_hand():
    # 70B parameters x 2 bytes read per token at 3.35 TB/s.
    assert hw.predict_decode_tok_s(H100, 70e9, "bf16") == pytest.approx(3.35e12 / 140e9)
    assert hw.predict_decode_tok_s(H100, 70e9, "int4") == pytest.approx(4 * 3.35e12 / 140e9)
    assert hw.critical_batch(H100, "bf16") == pytest.approx(989 / 3.35)
    assert hw.critical_batch(H100, "fp32") == pytest.approx(67e12 / 3.35e12 * 2)
    # 8B, 1000-token prompt on an A100: compute-bound, 2 FLOPs per weight per token.
    assert hw.predict_ttft(A100, 8e9, 1000, "bf16") == pytest.approx(2 * 8e9 * 1000 / 312e12)
    # One token cannot be faster than reading the weights once.
    assert hw.predict_ttft(A100, 8e9, 1, "bf16") == pytest.approx(16e9 / 2039e9)


def test_fits_in_memory():
    assert not hw.fits(H100, 70e9, "bf16")      # 140 GB > 80 GB
    assert hw.fits(hw.GPUS["H200 SXM"], 70e9, "int8")
    assert hw.fits(H100, 8e9, "bf16") and not hw.fits(H100, 8e9, "bf16", kv_bytes=70e9)


def test_machine_without_a_16_bit_rate_uses_fp32():
    assert M2.compute_flops("bf16") == M2.compute_flops("fp32") == M2.flops["fp32"]
    with pytest.raises(ValueError, match="lists no FLOP/s"):
        hw.Machine("empty", 1e9, {}).compute_flops("fp32")


@given(machines, params, dtypes)
def test_critical_batch_is_where_compute_meets_memory(machine, n_params, dtype):
    b = hw.critical_batch(machine, dtype)
    memory = n_params * hw.bytes_per_param(dtype) / machine.bandwidth
    compute = 2 * n_params * b / machine.compute_flops(dtype)
    assert compute == pytest.approx(memory, rel=1e-9)
    # Below it the step takes the batch-1 time (batching is free); above, time grows with the batch.
    assert hw.decode_step_time(machine, n_params, dtype, batch=b / 2) == pytest.approx(memory)
    assert hw.decode_step_time(machine, n_params, dtype, batch=2 * b) == pytest.approx(2 * memory)


@settings(max_examples=50)
@given(machines, params, dtypes, st.integers(1, 4096), st.floats(0, 1e11))
def test_throughput_never_falls_with_batch_and_saturates(machine, n_params, dtype, batch, kv):
    one = hw.predict_decode_tok_s(machine, n_params, dtype, batch)
    more = hw.predict_decode_tok_s(machine, n_params, dtype, batch + 1)
    assert more >= one * (1 - 1e-12)
    assert one <= machine.compute_flops(dtype) / (2 * n_params) * (1 + 1e-9)  # the compute ceiling
    # KV-cache bytes only ever slow a step down.
    assert hw.predict_decode_tok_s(machine, n_params, dtype, batch, kv_bytes=kv) <= one * (1 + 1e-12)


@given(machines, dtypes, st.floats(1e-3, 1e5))
def test_roofline(machine, dtype, intensity):
    roof = hw.attainable_flops(machine, intensity, dtype)
    assert roof == pytest.approx(min(machine.compute_flops(dtype), intensity * machine.bandwidth))
    # at the corner itself, intensity * bandwidth and compute / bandwidth round differently
    assume(abs(intensity - machine.ridge(dtype)) > 1e-9 * machine.ridge(dtype))
    assert (roof < machine.compute_flops(dtype)) == (intensity < machine.ridge(dtype))


@pytest.mark.parametrize("call, match", [
    (lambda: hw.predict_decode_tok_s(H100, 7e9, "fp8"), "unknown weight dtype"),
    (lambda: hw.predict_decode_tok_s(H100, -7e9), "n_params"),
    (lambda: hw.predict_decode_tok_s(H100, 7e9, batch=0), "batch"),
    (lambda: hw.predict_decode_tok_s(H100, 7e9, kv_bytes=-1), "kv_bytes"),
    (lambda: hw.predict_ttft(H100, 7e9, 0), "prompt_len"),
    (lambda: hw.predict_ttft(H100, float("nan"), 10), "n_params"),
    (lambda: hw.attainable_flops(H100, 0.0), "intensity"),
    (lambda: hw.critical_batch(H100, "float32"), "unknown weight dtype"),
    (lambda: timing.time_call(lambda: None, min_reps=0), "min_reps"),
    (lambda: hw.measure_bandwidth("cpu", nbytes=1000), "1 MiB"),
    (lambda: hw.measure_matmul("cpu", budget_s=0), "budget_s"),
    (lambda: hw.measure_matvec("cpu", shape=(0, 4)), "shape"),
    (lambda: timing.measure_op_overhead("cpu", ops=0), "ops"),
])
def test_bad_input_is_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_table_is_not_modified_by_the_formulas():
    before = {name: (m.bandwidth, dict(m.flops)) for name, m in hw.GPUS.items()}
    for m in hw.GPUS.values():
        hw.predict_decode_tok_s(m, 8e9, "bf16", batch=64)
        with pytest.raises(ValueError):
            hw.predict_decode_tok_s(m, 8e9, "bogus")
    assert before == {name: (m.bandwidth, dict(m.flops)) for name, m in hw.GPUS.items()}


# --- measuring the ceilings ---------------------------------------------------------------------

def test_measurements_are_plausible_and_on_budget():
    t0 = time.perf_counter()
    machine = hw.measure_ceilings("cpu", budget_s=1.5)
    elapsed = time.perf_counter() - t0
    # Generous: the budget governs the timed loops; allocation and a slow shared machine add to it.
    assert elapsed < 15, elapsed
    assert set(machine.details["bandwidth"]) == {"read", "copy"}
    assert 1e7 < machine.bandwidth < 1e13
    assert 1e6 < machine.flops["fp32"] < 1e16          # sane, not fast: the machine may be busy
    assert machine.ridge("fp32") == machine.flops["fp32"] / machine.bandwidth
    # The measured machine works in the same formulas as the datasheet rows.
    assert hw.predict_decode_tok_s(machine, 135e6, "fp32") > 0


def test_matvec_and_op_overhead():
    bw = hw.measure_matvec("cpu", shape=(2048, 1024), budget_s=0.1)
    assert 1e6 < bw < 1e13
    overhead = timing.measure_op_overhead("cpu", ops=50, budget_s=0.05)
    assert 0 < overhead < 0.01
