"""The KV caches: same tokens and logits as recomputing everything, exact sizes, safe rollback."""
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_internals.analysis.flops import generation_flops
from inference_internals.generate import generate, generate_stream
from inference_internals.kv_cache import CacheFullError, GrowingKVCache, KVCache, kv_cache_bytes
from inference_internals.analysis.kv_memory import spec_from_config, kv_bytes
from inference_internals.model import Llama, LlamaConfig

CACHES = [KVCache, GrowingKVCache]
SMALL = LlamaConfig(num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, head_dim=4,
                    max_position_embeddings=64)
PROMPT = [1, 504, 3458, 314, 4649, 282, 260, 1345, 30]  # any ids; the model need not read well


def uncached_decode(model, ids, steps):
    """Re-run the whole sequence every step: the reference every cache must match."""
    seq, tokens, logits = torch.tensor([ids]), [], []
    with torch.inference_mode():
        for _ in range(steps):
            last = model(seq)[:, -1]
            nxt = last.argmax(-1)
            tokens.append(int(nxt))
            logits.append(last)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    return tokens, torch.cat(logits)


def cached_decode(model, ids, steps, cache):
    x, tokens, logits = torch.tensor([ids]), [], []
    with torch.inference_mode():
        for _ in range(steps):
            last = model(x, cache=cache, last_only=True)[:, -1]
            nxt = last.argmax(-1)
            tokens.append(int(nxt))
            logits.append(last)
            x = nxt[:, None]
    return tokens, torch.cat(logits)


@pytest.fixture(scope="module")
def reference_run(model):
    return uncached_decode(model, PROMPT, 10)


@pytest.mark.parametrize("Cache", CACHES)
def test_cached_decode_equals_recomputing(model, reference_run, Cache):
    cache = Cache.for_model(model, 1, 32)
    tokens, logits = cached_decode(model, PROMPT, 10, cache)
    assert tokens == reference_run[0]
    torch.testing.assert_close(logits, reference_run[1], atol=1e-4, rtol=1e-4)
    assert cache.length == len(PROMPT) + 9  # the last token was sampled, never fed


@pytest.mark.parametrize("Cache", CACHES)
def test_chunk_after_a_prefix_matches_full_forward(model, Cache):
    """Several new tokens after cached ones (what chapter 6 verifies drafts with) need the mask."""
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        full = model(ids)
        cache = Cache.for_model(model, 1, 16)
        model(ids[:, :4], cache=cache)
        part = model(ids[:, 4:], cache=cache)
    torch.testing.assert_close(part, full[:, 4:], atol=1e-4, rtol=1e-4)


def test_generate_with_growing_cache_equals_default(model):
    default = generate(model, PROMPT, max_new_tokens=6, stop_ids=[])
    steps = generate_stream(model, PROMPT, 6, stop_ids=[], cache=GrowingKVCache.for_model(model, 1))
    assert [int(t) for t in steps] == default


@pytest.mark.parametrize("Cache", CACHES)
def test_batch_rows_match_single_runs(model, Cache):
    a, b = PROMPT, [1, 1204, 281, 1345, 30, 7, 19, 253, 42]
    x = torch.tensor([a, b])
    cache = Cache.for_model(model, 2, 20)
    with torch.inference_mode():
        batched = [model(x, cache=cache, last_only=True)[:, -1]]
        for _ in range(2):
            x = batched[-1].argmax(-1)[:, None]
            batched.append(model(x, cache=cache, last_only=True)[:, -1])
    batched = torch.stack(batched, dim=1)  # [2, steps, vocab]
    for row, ids in enumerate([a, b]):
        _, single = cached_decode(model, ids, 3, Cache.for_model(model, 1, 20))
        torch.testing.assert_close(batched[row], single, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("Cache", CACHES)
def test_crop_then_redecode_is_as_if_the_wrong_path_never_happened(model, Cache):
    clean_tokens, clean_logits = cached_decode(model, PROMPT, 6, Cache.for_model(model, 1, 32))
    cache = Cache.for_model(model, 1, 32)
    first, _ = cached_decode(model, PROMPT, 2, cache)
    keep = cache.length
    with torch.inference_mode():  # a rejected draft: 5 wrong tokens, fed at once
        model(torch.tensor([[first[-1], 999, 1000, 1001, 1002]]), cache=cache)
    assert cache.length == keep + 5
    cache.crop(keep)
    rest, rest_logits = cached_decode(model, [first[-1]], 4, cache)
    assert first + rest == clean_tokens
    torch.testing.assert_close(rest_logits, clean_logits[2:], atol=1e-5, rtol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_heads(model):
    """Copy each K/V head to the query heads that share it: an MHA model with the same outputs."""
    cfg = model.config
    mha_cfg = replace(cfg, num_key_value_heads=cfg.num_attention_heads)
    with torch.device("meta"):
        mha = Llama(mha_cfg)
    state = dict(model.state_dict())
    for name, w in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = w.view(cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size)
            state[name] = heads.repeat_interleave(cfg.n_rep, dim=0).reshape(-1, cfg.hidden_size)
    mha.load_state_dict(state, assign=True)
    mha.lm_head.weight = mha.embed_tokens.weight
    c_gqa, c_mha = KVCache.for_model(model, 1, 16), KVCache.for_model(mha.eval(), 1, 16)
    with torch.inference_mode():
        a = model(torch.tensor([PROMPT]), cache=c_gqa)
        b = mha(torch.tensor([PROMPT]), cache=c_mha)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert c_mha.nbytes == cfg.n_rep * c_gqa.nbytes
    # and the cached K of an MHA head is exactly its GQA group's K
    k_gqa, _ = c_gqa.kv(0)
    k_mha, _ = c_mha.kv(0)
    torch.testing.assert_close(k_mha, k_gqa.repeat_interleave(cfg.n_rep, dim=1), atol=1e-5, rtol=1e-5)


# --- memory ---

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("length, batch", [(1, 1), (17, 3), (256, 2)])
def test_nbytes_equal_the_formula(length, batch, dtype):
    cfg = LlamaConfig()
    cache = KVCache(cfg, batch, length, dtype=dtype)
    expected = kv_cache_bytes(cfg, length, batch, dtype.itemsize)
    assert cache.nbytes == expected == kv_bytes(spec_from_config(cfg, "", ""), length, batch, dtype.itemsize)
    assert expected == 2 * 30 * 3 * 64 * length * batch * dtype.itemsize
    assert cache.k.untyped_storage().nbytes() + cache.v.untyped_storage().nbytes() == expected
    grow = GrowingKVCache(cfg, batch, dtype=dtype)
    grow.append(*(torch.zeros(2, cfg.num_hidden_layers, batch, 3, length, 64, dtype=dtype)))
    assert grow.nbytes == expected
    assert sum(grow.k[i].nbytes + grow.v[i].nbytes for i in range(30)) == expected


def test_gqa_saves_exactly_n_rep():
    cfg = LlamaConfig()
    gqa = kv_cache_bytes(cfg, 1000)
    assert kv_cache_bytes(replace(cfg, num_key_value_heads=9), 1000) == 3 * gqa
    assert 3 * kv_cache_bytes(replace(cfg, num_key_value_heads=1), 1000) == gqa


def test_bytes_copied_static_linear_growing_quadratic():
    cfg, B, n = SMALL, 2, 20
    per_token = kv_cache_bytes(cfg, 1, B, 4)
    static, growing = KVCache(cfg, B, n), GrowingKVCache(cfg, B)
    kv = torch.randn(2, cfg.num_hidden_layers, B, 3, 1, 4)
    for _ in range(n):
        static.append(*kv)
        growing.append(*kv)
    assert static.bytes_copied == n * per_token
    assert growing.bytes_copied == per_token * n * (n + 1) // 2


def test_generation_flops_last_only_drops_the_unused_lm_head():
    cfg = LlamaConfig()
    full = generation_flops(cfg, 10, 5, cached=False)
    last = generation_flops(cfg, 10, 5, cached=False, last_only=True)
    head = 2 * cfg.hidden_size * cfg.vocab_size
    assert [f - l for f, l in zip(full, last)] == [head * (10 + i - 1) for i in range(5)]
    assert generation_flops(cfg, 10, 5, cached=True, last_only=True)[1:] == \
        generation_flops(cfg, 10, 5, cached=True)[1:]


# --- errors leave the cache as it was ---

def _filled(Cache, n=5):
    cache = Cache(SMALL, 2, 8)
    torch.manual_seed(0)
    cache.append(*torch.randn(2, SMALL.num_hidden_layers, 2, 3, n, 4))
    return cache


def _snapshot(cache):
    return cache.length, [tuple(t.clone() for t in cache.kv(i)) for i in range(SMALL.num_hidden_layers)]


def _assert_unchanged(cache, snap):
    length, kvs = snap
    assert cache.length == length
    for i, (k, v) in enumerate(kvs):
        assert torch.equal(cache.kv(i)[0], k) and torch.equal(cache.kv(i)[1], v)


@pytest.mark.parametrize("Cache", CACHES)
@pytest.mark.parametrize("bad, error, message", [
    (lambda c: c.append(*torch.randn(2, 2, 2, 3, 4, 4)), CacheFullError, "do not fit"),
    (lambda c: c.begin(torch.zeros(2, 4, dtype=torch.long)), CacheFullError, "do not fit"),
    (lambda c: c.append(*torch.randn(2, 2, 1, 3, 1, 4)), ValueError, "batch"),
    (lambda c: c.begin(torch.zeros(3, 1, dtype=torch.long)), ValueError, "batch of 3 rows"),
    (lambda c: c.append(*torch.randn(2, 2, 2, 1, 1, 4)), ValueError, "kv_heads=3"),
    (lambda c: c.append(*torch.randn(2, 3, 2, 3, 1, 4)), ValueError, "append wants"),
    (lambda c: c.update(0, torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)), ValueError, "batch=2"),
    (lambda c: c.crop(6), ValueError, "cannot crop"),
    (lambda c: c.crop(-1), ValueError, "cannot crop"),
])
def test_bad_calls_raise_and_corrupt_nothing(Cache, bad, error, message):
    cache = _filled(Cache)
    snap = _snapshot(cache)
    with pytest.raises(error, match=message):
        bad(cache)
    _assert_unchanged(cache, snap)


@pytest.mark.parametrize("Cache", CACHES)
def test_model_step_that_does_not_fit_changes_nothing(model, Cache):
    cache = Cache.for_model(model, 1, 10)
    with torch.inference_mode():
        model(torch.tensor([PROMPT]), cache=cache)
        before = [t.clone() for t in cache.kv(7)]
        with pytest.raises(CacheFullError):
            model(torch.tensor([[5, 6]]), cache=cache)
        with pytest.raises(ValueError, match="batch"):
            model(torch.tensor([[5], [6]]), cache=cache)
    assert cache.length == len(PROMPT)
    assert all(torch.equal(a, b) for a, b in zip(cache.kv(7), before))


@pytest.mark.parametrize("Cache", CACHES)
def test_bad_construction(Cache):
    with pytest.raises(ValueError, match="context window"):
        Cache(SMALL, 1, SMALL.max_position_embeddings + 1)
    with pytest.raises(ValueError, match=">= 1"):
        Cache(SMALL, 0, 8)


def test_reset_empties():
    for Cache in CACHES:
        cache = _filled(Cache)
        cache.reset()
        assert cache.length == 0 and cache.kv(0)[0].shape[2] == 0


# --- random appends and crops against a plain list ---

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 6)),
    st.tuples(st.just("crop"), st.floats(0, 1)),
    st.tuples(st.just("reset"), st.just(0)),
), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, which=st.sampled_from(CACHES))
def test_random_appends_and_crops_match_a_shadow(ops, which):
    max_len = 12
    cache = which(SMALL, 2, max_len)
    shadow_k = [torch.empty(2, 3, 0, 4) for _ in range(SMALL.num_hidden_layers)]
    shadow_v = [torch.empty(2, 3, 0, 4) for _ in range(SMALL.num_hidden_layers)]
    gen = torch.Generator().manual_seed(len(ops))
    for op, arg in ops:
        if op == "append":
            k = torch.randn(SMALL.num_hidden_layers, 2, 3, arg, 4, generator=gen)
            v = torch.randn(SMALL.num_hidden_layers, 2, 3, arg, 4, generator=gen)
            if cache.length + arg > max_len:
                with pytest.raises(CacheFullError):
                    cache.append(k, v)
            else:
                cache.append(k, v)
                shadow_k = [torch.cat([s, k[i]], 2) for i, s in enumerate(shadow_k)]
                shadow_v = [torch.cat([s, v[i]], 2) for i, s in enumerate(shadow_v)]
        elif op == "crop":
            n = int(arg * cache.length)
            cache.crop(n)
            shadow_k = [s[:, :, :n] for s in shadow_k]
            shadow_v = [s[:, :, :n] for s in shadow_v]
        else:
            cache.reset()
            shadow_k = [s[:, :, :0] for s in shadow_k]
            shadow_v = [s[:, :, :0] for s in shadow_v]
        assert cache.length == shadow_k[0].shape[2]
        for i in range(SMALL.num_hidden_layers):
            k, v = cache.kv(i)
            assert torch.equal(k, shadow_k[i]) and torch.equal(v, shadow_v[i])
