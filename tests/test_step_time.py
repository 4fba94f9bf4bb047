"""step_time.breakdown: a decode step's time split into the weights' kernels and the rest, on a tiny model."""
import os
import shutil

import pytest
import torch

from inference_internals.model import LlamaConfig, random_model
from inference_internals.optimize import QuantProjection, optimize, weight_bytes_read
from inference_internals.analysis.step_time import ROLES, breakdown, kernels_fn, kv_bytes_read, part_bytes, projections

TINY = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
BW = 1e10  # bytes/s: given, so the law's time is exact arithmetic


def check_parts(m, r):
    assert set(r["kernels_ms"]) == set(ROLES)
    assert r["weight_bytes"] == weight_bytes_read(m)  # the bytes are weight_bytes_read's
    assert r["law_ms"] == pytest.approx(1e3 * weight_bytes_read(m) / BW)
    kv_dtype = getattr(torch, r["kv_dtype"])
    assert r["law_kv_ms"] == pytest.approx(1e3 * (weight_bytes_read(m) + kv_bytes_read(m, r["context"], kv_dtype)) / BW)
    # each part's bytes: the roles' and the rest's add up to the weights, attention's are the cache's
    b = r["part_bytes"]
    assert set(b) == {*ROLES, "attention", "outside"} and min(b.values()) > 0
    assert sum(b[k] for k in (*ROLES, "outside")) == pytest.approx(r["weight_bytes"])
    assert b["attention"] == kv_bytes_read(m, r["context"], kv_dtype) == pytest.approx(r["kv_MB"] * 1e6)
    s = r["step_ms"]
    assert s["n"] == r["rounds"] and 0 < s["min"] <= s["median"] <= s["max"]
    for role, k in r["kernels_spread_ms"].items():
        assert k["n"] == r["rounds"] and 0 < k["min"] <= k["median"] <= k["max"]
        assert r["kernels_ms"][role] == k["median"]
    a = r["attention_ms"]
    assert a["n"] == r["rounds"] and 0 < a["min"] <= a["median"] <= a["max"]
    assert r["outside_ms"] == pytest.approx(s["median"] - sum(r["kernels_ms"].values()) - a["median"])
    # the step runs every one of these kernels and more: their fastest rounds fit in its slowest
    assert sum(k["min"] for k in r["kernels_spread_ms"].values()) + a["min"] <= s["max"]


@pytest.mark.parametrize("kw", [{}, {"kernel": "split_w", "slabs": 2},
                                {"dtype": "bf16", "weights": "int4"}, {"dtype": "bf16", "weights": "q8_0"}])
def test_breakdown_parts_add_up(kw):
    m = optimize(random_model(TINY, seed=0, device="cpu"), **kw)
    r = breakdown(m, context=8, rounds=3, bandwidth=BW, warmup=1)
    check_parts(m, r)
    assert r["compiled"] is False and "eagerly" in r["kernels_are"]


def test_a_cache_kept_in_f16_is_read_as_f16(monkeypatch):
    """kv_dtype: the step and the attention part run over a cache of that dtype, whose bytes are half fp32's."""
    from inference_internals.kv_cache import KVCache

    m, seen, real = random_model(TINY, seed=0, device="cpu"), [], KVCache.__init__
    monkeypatch.setattr(KVCache, "__init__", lambda self, *a, **kw: real(self, *a, **kw) or seen.append(self.dtype))
    r = breakdown(m, context=8, rounds=2, bandwidth=BW, warmup=1, kv_dtype=torch.float16)
    check_parts(m, r)
    assert seen == [torch.float16] and r["kv_dtype"] == "float16"
    assert part_bytes(m, 8, torch.float16)["attention"] * 2 == part_bytes(m, 8)["attention"] == kv_bytes_read(m, 8)


def test_a_plain_model_is_broken_down_too():
    m = random_model(TINY, seed=0, device="cpu")  # q, k, v (gate, up) as separate projections
    check_parts(m, breakdown(m, context=4, rounds=2, bandwidth=BW, warmup=1))


def test_each_role_runs_every_layers_weights_once():
    for m in (random_model(TINY, seed=0, device="cpu"),
              optimize(random_model(TINY, seed=0, device="cpu"), dtype="bf16", weights="int4")):
        roles = projections(m)
        assert [len(roles[r]) for r in ROLES] == [2, 2, 2, 2, 1]
        for role, mods in roles.items():
            calls = []
            hooks = [mod.register_forward_hook(lambda mod, i, o: calls.append(mod)) for mod in mods]
            kernels_fn(mods, m.dtype, m.device)()
            for h in hooks:
                h.remove()
            assert calls == mods, role
    q = optimize(random_model(TINY, seed=0, device="cpu"), dtype="bf16", weights="q8_0")
    assert all(isinstance(p, QuantProjection) for ps in projections(q).values() for p in ps)
    # every byte weight_bytes_read counts for projections is in a role: the rest is the norms
    norms = sum(p.numel() * p.element_size() for n, p in q.named_parameters() if "norm" in n)
    assert sum(p.nbytes for ps in projections(q).values() for p in ps) + norms == weight_bytes_read(q)


def test_several_models_share_the_same_rounds(monkeypatch):
    """A dict of models: one set of interleaved rounds over every model's step and kernels, and
    each model's breakdown as if alone."""
    from inference_internals.analysis import step_time

    models = {"fp32": random_model(TINY, seed=0, device="cpu"),
              "int4": optimize(random_model(TINY, seed=0, device="cpu"), dtype="bf16", weights="int4")}
    calls = []
    real = step_time.interleaved
    monkeypatch.setattr(step_time, "interleaved", lambda runs, *a, **k: calls.append(list(runs)) or real(runs, *a, **k))
    out = breakdown(models, context=8, rounds=3, bandwidth=BW, warmup=1)
    assert len(calls) == 1 and calls[0] == [(n, part) for n in models for part in ("step", "attention", *ROLES)]
    assert set(out) == set(models)
    for name, m in models.items():
        check_parts(m, out[name])
    assert out["int4"]["weight_bytes"] < out["fp32"]["weight_bytes"]


def test_clear_errors():
    m = random_model(TINY, seed=0, device="cpu")
    with pytest.raises(ValueError, match="context >= 2"):
        breakdown(m, context=1)
    with pytest.raises(TypeError, match="Llama"):
        breakdown(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="Llama"):
        breakdown({"a": m, "b": torch.nn.Linear(2, 2)})
    with pytest.raises(ValueError, match="need a model"):
        breakdown({})


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if c),
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_breakdown_of_a_compiled_quantized_step():
    m = optimize(random_model(TINY, seed=0, device="cpu"), dtype="bf16", weights="int4", compile=True)
    calls = []
    step = m.forward.step
    m.forward.step = lambda *a, **kw: calls.append(1) or step(*a, **kw)
    r = breakdown(m, context=8, rounds=2, bandwidth=BW, warmup=1)
    check_parts(m, r)
    assert len(calls) == 3  # every timed step (and the warm-up) ran the compiled graph
    assert r["compiled"] is True and "compiled graph calls each quantized kernel" in r["kernels_are"]
    from inference_internals.optimize import decode_attention
    # the attention timed is the compiled step's: the kernel where it runs here (head_dim 16 fits it)
    assert ("kernel" in r["attention_is"]) == decode_attention.runs_here(torch.empty(1, 2, 1, 16))
