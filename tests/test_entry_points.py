"""The engine's entry points refuse bad settings clearly, and a refusal changes nothing.

Dtypes and devices are parsed in one place (device.parse_dtype / get_device) at every entry:
``Llama.from_pretrained``, ``random_model``, ``optimize``, the KV caches. ``optimize`` checks
every setting and every weight it would quantize before it touches the model."""
import dataclasses
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from inference_internals import quant
from inference_internals.kv_cache import GrowingKVCache, KVCache
from inference_internals.model import Llama, LlamaConfig, random_model
from inference_internals.optimize import QuantProjection, optimize

SMALL = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
IDS = torch.tensor([[1, 5, 9, 200, 17]])


def small(seed=0):
    return random_model(SMALL, seed=seed, device="cpu", dtype=torch.float32)


def snapshot(model) -> tuple:
    """Everything a refused call must leave as it was: weights, modules, dtype, optimize's records."""
    return ({k: v.clone() for k, v in model.state_dict().items()}, [type(m).__name__ for m in model.modules()],
            model.dtype, {k: getattr(model, k, "unset") for k in ("weight_format", "kernels", "quant_kernels")})


def assert_unchanged(model, before) -> None:
    state, modules, dtype, records = snapshot(model)
    assert modules == before[1] and dtype == before[2] and records == before[3]
    assert state.keys() == before[0].keys() and all(torch.equal(state[k], before[0][k]) for k in state)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Hugging Face-format checkpoint folder: config.json and model.safetensors."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps({**dataclasses.asdict(SMALL), "model_type": "llama"}))
    state = {f"model.{k}": v.contiguous() for k, v in small().state_dict().items() if k != "lm_head.weight"}
    save_file(state, folder / "model.safetensors")
    return folder


# --- one way to name a dtype and a device ----------------------------------------------------------

@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("float16", torch.float16),
                                         (torch.float32, torch.float32), (None, torch.float32)])
def test_from_pretrained_takes_the_dtype_names_llm_takes(checkpoint, name, dtype):
    m = Llama.from_pretrained(checkpoint, device="cpu", dtype=name)
    assert m.dtype == dtype and m.device == torch.device("cpu")
    assert torch.equal(m.embed_tokens.weight, small().embed_tokens.weight.to(dtype))


@pytest.mark.parametrize("kw, match", [({"dtype": "bf-16"}, "unknown dtype 'bf-16'"),
                                       ({"dtype": torch.int8}, "floating-point precision"),
                                       ({"device": "gpu"}, "unknown device 'gpu'"),
                                       ({"device": 0}, "unknown device 0")])
def test_from_pretrained_refuses_a_bad_dtype_or_device_by_name(checkpoint, tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        Llama.from_pretrained(checkpoint, **kw)
    with pytest.raises(ValueError, match=match):  # before it looks for the checkpoint
        Llama.from_pretrained(tmp_path / "missing", **kw)
    with pytest.raises(ValueError, match=match):
        random_model(SMALL, **{"device": "cpu", **kw})


def test_optimize_takes_dtype_names():
    m = optimize(small(), dtype="bf16", kernel="linear")
    assert m.dtype == torch.bfloat16 and m(IDS).dtype == torch.bfloat16
    m = small()
    before = snapshot(m)
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        optimize(m, dtype="int8", kernel="linear")
    assert_unchanged(m, before)


@pytest.mark.parametrize("cache", [KVCache, GrowingKVCache])
def test_kv_caches_parse_device_dtype_and_sizes(cache):
    c = cache(SMALL, 1, 8, device="cpu", dtype="bf16")
    assert c.dtype == torch.bfloat16 and c.device == torch.device("cpu")
    for kw, err, match in [({"device": "gpu"}, ValueError, "unknown device 'gpu'"),
                           ({"dtype": "int8"}, ValueError, "unknown dtype"),
                           ({"batch_size": 2.5}, TypeError, "batch_size must be an integer"),
                           ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
                           ({"max_len": 8.0}, TypeError, "max_len must be an integer"),
                           ({"max_len": 65}, ValueError, "exceeds the context window")]:
        with pytest.raises(err, match=match):
            cache(SMALL, **{"batch_size": 1, "max_len": 8, "device": "cpu", **kw})


# --- optimize: every check before the first change ------------------------------------------------

@pytest.mark.parametrize("kw, err, match", [
    ({"slabs": 2.5}, TypeError, "slabs must be an integer, got 2.5"),
    ({"slabs": 0}, ValueError, "slabs must be >= 1"),
    ({"kernel": "split_n", "slabs": 3}, ValueError, "'split_n' needs >= 2 slabs that divide the 128 rows of qkv"),
    ({"kernel": "split_w", "slabs": 1}, ValueError, "needs >= 2 slabs"),
    ({"weights": "int4", "group": 7}, ValueError, "group size 7 does not divide the row of 64"),
    ({"weights": "int4", "group": 2.0}, ValueError, "group must be an integer"),
    ({"weights": "int4", "group": 32, "dtype": "bf16", "slabs": -1}, ValueError, "slabs must be >= 1"),
    ({"weights": "int8", "quant_kernel": "fast"}, ValueError, "quant_kernel must be"),
])
def test_a_refused_optimize_leaves_the_model_as_it_was(kw, err, match):
    m = small()
    before = snapshot(m)
    with pytest.raises(err, match=match):
        optimize(m, **{"kernel": "linear", **kw})
    assert_unchanged(m, before)
    assert not isinstance(m.layers[0].mlp.down_proj, QuantProjection)
    assert torch.equal(m(IDS), small()(IDS))  # and it still runs, as loaded


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_weight_the_quantizer_refuses_is_found_before_anything_changes(fmt):
    m = small()
    with torch.no_grad():
        m.layers[1].mlp.down_proj.weight[3, 5] = float("inf")  # the last layer: found before the first changes
    before = snapshot(m)
    with pytest.raises(ValueError, match="inf or nan"):
        optimize(m, weights=fmt, dtype="bf16", quant_kernel="dequant")
    assert_unchanged(m, before)
    with torch.no_grad():
        m.layers[1].mlp.down_proj.weight[3, 5] = 70000.0  # finite in fp32, inf once cast to fp16
    with pytest.raises(ValueError, match="inf or nan"):
        optimize(m, weights=fmt, dtype="fp16", quant_kernel="dequant")
    assert m.dtype == torch.float32 and getattr(m, "weight_format", None) is None


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from([None, "bf16", "fp32", "int8", 3]), slabs=st.sampled_from([None, 1, 2, 3, 2.5, -1]),
       kernel=st.sampled_from(["linear", "split_n", "split_w", "bogus"]),
       weights=st.sampled_from([None, "int8", "int4", "int3"]), group=st.sampled_from([16, 32, 7, 0]))
def test_optimize_either_succeeds_or_changes_nothing(dtype, slabs, kernel, weights, group):
    m = small()
    before = snapshot(m)
    try:
        optimize(m, dtype=dtype, slabs=slabs, kernel=kernel, weights=weights, group=group, quant_kernel="dequant")
    except (ValueError, TypeError):
        assert_unchanged(m, before)
    else:
        assert m.weight_format == weights and torch.isfinite(m(IDS)).all()


def test_a_quantized_model_optimized_again_keeps_its_codes_and_changes_kernel():
    m = optimize(small(), weights="int8", quant_kernel="dequant")
    codes = m.layers[0].self_attn.qkv_proj.qw.codes
    with torch.inference_mode():
        before = m(IDS)
    again = optimize(m, quant_kernel="int8_mm")
    assert again is m and m.weight_format == "int8" and m.quant_kernels == {"int8": "int8_mm"}
    assert m.layers[0].self_attn.qkv_proj.kernel == "int8_mm" and m.layers[0].self_attn.qkv_proj.qw.codes is codes
    with torch.inference_mode():
        assert (m(IDS) - before).abs().max() <= 0.02 * before.abs().max()  # the same codes, another kernel
    optimize(m, dtype="bf16")  # the rest of the model in bf16; the kernels are timed again
    assert m.dtype == torch.bfloat16 and m.weight_format == "int8" and torch.isfinite(m(IDS)).all()
    before = snapshot(m)
    with pytest.raises(ValueError, match="already quantized"):
        optimize(m, weights="int4")
    assert_unchanged(m, before)


# --- the quantizers on the whole float32 range --------------------------------------------------

def test_quantize_refuses_weights_whose_grid_would_overflow():
    w = torch.tensor([[3e38, -3e38] * 16])
    for fn in (quant.quantize_int8, quant.quantize_int4):
        with pytest.raises(ValueError, match="scale · q \\+ zero overflows"):
            fn(w)
    with pytest.raises(ValueError, match="overflows"):  # finite in float64, beyond float32
        quant.quantize_int8(torch.full((2, 32), 1e300, dtype=torch.float64))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, (3, 64), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       st.sampled_from(["int8", "int4"]))
def test_quantize_on_any_finite_weights_is_bounded_or_refused(w, fmt):
    """Anywhere in float32's range: a finite result within half a step of each weight, or one clear refusal."""
    w = torch.from_numpy(w)
    try:
        qw = quant.quantize(w, fmt, 32)
    except ValueError as e:
        assert "overflows" in str(e) and w.abs().max() > quant.MAX_ABS
        return
    back = qw.dequantize()
    assert torch.isfinite(back).all() and torch.isfinite(qw.scale).all()
    step = qw.scale.repeat_interleave(qw.group, dim=1)
    tiny = torch.finfo(torch.float32).tiny
    assert ((w - back).abs() <= step / 2 * (1 + 1e-5) + 1e-6 * w.abs().amax() + tiny).all()


@pytest.mark.parametrize("length", [2.5, True, "2", -1, 4])
def test_crop_refuses_a_length_it_cannot_hold(length):
    c = KVCache(SMALL, 1, 8)
    c.append(torch.zeros(2, 1, 2, 3, 16), torch.zeros(2, 1, 2, 3, 16))
    with pytest.raises(ValueError, match="cannot crop a cache of 3 tokens"):
        c.crop(length)
    assert c.length == 3 and type(c.length) is int
    c.crop(np.int64(1))
    assert c.length == 1 and type(c.length) is int


# --- files an entry point reads: config.json, the cache's manifest -----------------------------

GOOD_CONFIG = {**dataclasses.asdict(SMALL), "model_type": "llama"}


@pytest.mark.parametrize("change, err, match", [
    ({"num_attention_heads": 0}, ValueError, "num_attention_heads must be >= 1, got 0"),
    ({"hidden_size": 64.5}, TypeError, "hidden_size must be an integer"),
    ({"num_key_value_heads": 3}, ValueError, "4 attention heads do not share 3 key/value heads"),
    ({"rms_norm_eps": -1e-5}, ValueError, "rms_norm_eps must be a positive number"),
    ({"vocab_size": None}, ValueError, r"lacks \['vocab_size'\]"),
])
def test_a_bad_config_is_refused_by_field(checkpoint, tmp_path, change, err, match):
    config = {k: v for k, v in {**GOOD_CONFIG, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    with pytest.raises(err, match=match):
        Llama.from_pretrained(tmp_path, device="cpu")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="a config is a JSON object"):
        Llama.from_pretrained(tmp_path, device="cpu")


@pytest.mark.parametrize("manifest", ['{"files": [1]}', '{"files": {"a": 5}}', '{"files": {"a": {"size": 1}}}',
                                      '{"files": {"../config.json": {"size": 1, "sha256": "x"}}}', "{", "[]"])
def test_a_damaged_cache_manifest_means_rebuild_not_a_crash(tmp_path, manifest):
    from inference_internals.weights import MANIFEST, verify_cache

    (tmp_path / MANIFEST).write_text(manifest)
    assert verify_cache(tmp_path) is False


def test_the_paged_pool_parses_device_dtype_and_sizes():
    from inference_internals.kv_cache.paged import PagedKVCache

    assert PagedKVCache(SMALL, 4, 8, dtype="bf16").k.dtype == torch.bfloat16
    for kw, err, match in [({"device": "gpu"}, ValueError, "unknown device 'gpu'"),
                           ({"dtype": "int8"}, ValueError, "unknown dtype"),
                           ({"num_blocks": 2.5}, TypeError, "num_blocks must be an integer"),
                           ({"block_size": 0}, ValueError, "block_size must be >= 1")]:
        with pytest.raises(err, match=match):
            PagedKVCache(SMALL, **{"num_blocks": 4, "block_size": 8, **kw})
