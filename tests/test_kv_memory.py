"""KV-cache memory of published models: the configs as released, and the formula."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_internals.kv_cache import kv_cache_bytes
from inference_internals.analysis.kv_memory import (GB, PUBLISHED_CONFIGS, bytes_per_token, kv_bytes, max_batch,
                                           spec_from_config, values_per_token, weight_bytes)
from inference_internals.model import LlamaConfig
from inference_internals.weights import model_dir

# (layers, query heads, KV heads, head_dim, MLA latent, published parameter count) from each
# model's config.json / paper (links in kv_memory.PUBLISHED_CONFIGS).
PUBLISHED = {
    "SmolLM2-135M": (30, 9, 3, 64, 0, 134.5e6),
    "Llama-3-8B": (32, 32, 8, 128, 0, 8.03e9),
    "Llama-3-70B": (80, 64, 8, 128, 0, 70.6e9),
    "Mistral-7B-v0.1": (32, 32, 8, 128, 0, 7.24e9),
    "Qwen2.5-7B": (28, 28, 4, 128, 0, 7.61e9),
    "DeepSeek-V3": (61, 128, 128, 128, 576, 671e9),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_numbers(name):
    spec = PUBLISHED_CONFIGS[name]
    layers, q, kv, hd, latent, params = PUBLISHED[name]
    assert (spec.layers, spec.q_heads, spec.kv_heads, spec.head_dim, spec.latent) == (layers, q, kv, hd, latent)
    assert spec.params == pytest.approx(params, rel=0.005)
    assert spec.source.startswith("https://huggingface.co/")


def test_well_known_sizes():
    # Llama-3-8B: 128 KiB per token in bf16; DeepSeek-V3's MLA: 576 values per token per layer.
    assert bytes_per_token(PUBLISHED_CONFIGS["Llama-3-8B"], 2) == 128 * 1024
    assert values_per_token(PUBLISHED_CONFIGS["DeepSeek-V3"]) == 61 * (512 + 64)
    assert PUBLISHED_CONFIGS["DeepSeek-V3"].attention == "MLA"
    assert PUBLISHED_CONFIGS["Llama-3-70B"].attention == "GQA"


def test_our_model_matches_its_config_file():
    cfg = LlamaConfig.from_json(model_dir() / "config.json")
    ours = spec_from_config(cfg, "SmolLM2-135M", "")
    table = PUBLISHED_CONFIGS["SmolLM2-135M"]
    assert (ours.layers, ours.q_heads, ours.kv_heads, ours.head_dim, ours.params) == \
        (table.layers, table.q_heads, table.kv_heads, table.head_dim, table.params)
    for n, b in [(1, 1), (100, 3), (8192, 2)]:
        assert kv_bytes(table, n, b, 2) == kv_cache_bytes(cfg, n, b, 2)


def test_mha_mqa_variants():
    spec = PUBLISHED_CONFIGS["Llama-3-70B"]
    mha, mqa = spec.with_kv_heads(64), spec.with_kv_heads(1)
    assert (mha.attention, mqa.attention) == ("MHA", "MQA")
    assert bytes_per_token(mha) == 8 * bytes_per_token(spec) == 64 * bytes_per_token(mqa)
    ds = PUBLISHED_CONFIGS["DeepSeek-V3"]
    assert bytes_per_token(ds.with_kv_heads(128)) == 2 * 61 * 128 * 128 * 2
    with pytest.raises(ValueError, match="divide"):
        spec.with_kv_heads(7)
    with pytest.raises(ValueError, match="divide"):
        spec.with_kv_heads(0)


def test_max_batch():
    spec = PUBLISHED_CONFIGS["Llama-3-8B"]
    assert max_batch(spec, 32768, 80 * GB) == 14
    assert max_batch(spec, 32768, 80 * GB, bytes_per_param=None) == 18
    assert max_batch(PUBLISHED_CONFIGS["Llama-3-70B"], 8192, 80 * GB) == 0  # bf16 weights alone: 141 GB
    with pytest.raises(ValueError, match="context"):
        max_batch(spec, 0, 80 * GB)
    with pytest.raises(ValueError, match=">= 0"):
        kv_bytes(spec, -1)


@given(name=st.sampled_from(sorted(PUBLISHED_CONFIGS)), context=st.integers(1, 200_000),
       gpu_gb=st.integers(1, 300), bytes_per_value=st.sampled_from([1, 2, 4]))
def test_max_batch_is_the_largest_that_fits(name, context, gpu_gb, bytes_per_value):
    spec = PUBLISHED_CONFIGS[name]
    gpu = gpu_gb * GB
    b = max_batch(spec, context, gpu, bytes_per_value)
    used = lambda n: weight_bytes(spec) + kv_bytes(spec, context, n, bytes_per_value)  # noqa: E731
    if b > 0:
        assert used(b) <= gpu
    assert used(b + 1) > gpu
    assert kv_bytes(spec, context, 3, bytes_per_value) == 3 * kv_bytes(spec, context, 1, bytes_per_value)
    assert math.isclose(kv_bytes(spec, 2 * context, 1), 2 * kv_bytes(spec, context, 1))
