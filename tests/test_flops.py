import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from inference_internals.analysis.flops import (COMPONENTS, Op, flops_per_token, forward_ops, generation_flops,
                                       param_counts, sequence_flops, weight_bytes_per_token)
from inference_internals.kv_cache import KVCache
from inference_internals.model import Llama, LlamaConfig, count_parameters, random_model

SMOL = LlamaConfig()
SMALL = LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                    num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)


def component(name: str) -> str:
    for key, comp in (("embed_tokens", "embedding"), ("self_attn", "attention"), ("mlp", "mlp"),
                      ("norm", "norms"), ("lm_head", "lm_head")):
        if key in name:
            return comp
    raise KeyError(name)


def counted(model) -> dict[str, int]:
    """numel per component over the model's unique tensors (a tied head appears once)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        out[component(name)] += p.numel()
    return out


def meta_model(cfg):
    with torch.device("meta"):
        return Llama(cfg)


configs = st.builds(
    lambda heads, group, hd, d, inter, L, vocab, tied: LlamaConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=inter, num_hidden_layers=L,
        num_attention_heads=heads * group, num_key_value_heads=heads, head_dim=hd, tie_word_embeddings=tied),
    st.integers(1, 4), st.integers(1, 4), st.sampled_from([4, 8, 16]), st.integers(4, 96),
    st.integers(4, 200), st.integers(1, 4), st.integers(2, 500), st.booleans())


def test_smollm2_parameters_match_its_tensors_and_hugging_face():
    from transformers import AutoConfig, AutoModelForCausalLM

    from inference_internals.weights import model_dir

    ours = meta_model(SMOL)
    assert param_counts(SMOL) == counted(ours)
    assert param_counts(SMOL)["lm_head"] == 0  # tied: the head is the embedding
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir()))
    assert sum(param_counts(SMOL).values()) == count_parameters(ours) == hf.num_parameters() == 134_515_008


def test_llama3_8b_published_total():
    # Meta-Llama-3-8B config.json; the model card's total is 8.03B (8,030,261,248).
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
    assert sum(param_counts(cfg).values()) == 8_030_261_248


@settings(max_examples=40, deadline=None)
@given(cfg=configs)
def test_param_counts_match_tensors(cfg):
    model = meta_model(cfg)
    assert param_counts(cfg) == counted(model)
    assert sum(param_counts(cfg).values()) == count_parameters(model)


@pytest.fixture(scope="module")
def small():
    return random_model(SMALL, seed=0, device="cpu")  # the tests feed it CPU tensors


def mm_flops_by_component(counter: FlopCounterMode) -> dict[str, int]:
    """Matmul FLOPs torch counted, grouped like param_counts (module paths Llama.layers.i.<part>)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for path, ops in counter.get_flop_counts().items():
        parts = path.split(".")
        if path == "Llama.lm_head" or (len(parts) == 4 and parts[1] == "layers"):
            out[component(path)] += sum(ops.values())
    return out


def attention_core(cfg, pairs: int) -> int:
    """QK^T and softmax·V for ``pairs`` (query, key) pairs in every layer and head."""
    return cfg.num_hidden_layers * 2 * 2 * cfg.num_attention_heads * cfg.head_dim * pairs


@pytest.mark.parametrize("past", [0, 1, 17])
def test_flops_per_token_match_torch_counter_on_a_decode_step(small, past):
    cache = KVCache.for_model(small, 1, past + 1)
    with torch.no_grad():
        if past:
            small(torch.randint(0, SMALL.vocab_size, (1, past)), cache=cache)
        counter = FlopCounterMode(display=False)
        with counter:
            small(torch.randint(0, SMALL.vocab_size, (1, 1)), cache=cache)
    predicted = flops_per_token(SMALL, context=past + 1)
    measured = mm_flops_by_component(counter)
    # torch's counter does not see CPU SDPA: the attention core is checked separately below.
    assert measured["attention"] == predicted["attention"] - attention_core(SMALL, past + 1)
    for comp in ("embedding", "mlp", "norms", "lm_head"):
        assert measured[comp] == predicted[comp], comp
    assert counter.get_total_flops() == sum(measured.values())


def test_attention_core_formula_matches_explicit_matmuls():
    H, hd, n = 6, 8, 13
    q, k, v = torch.randn(1, H, 1, hd), torch.randn(1, H, n, hd), torch.randn(1, H, n, hd)
    counter = FlopCounterMode(display=False)
    with counter:
        (q @ k.transpose(-1, -2)).softmax(-1) @ v
    cfg = LlamaConfig(num_hidden_layers=1, num_attention_heads=H, head_dim=hd)
    assert counter.get_total_flops() == attention_core(cfg, n)


@pytest.mark.parametrize("T", [1, 5, 12])
def test_sequence_flops_match_torch_counter(small, T):
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        small(torch.randint(0, SMALL.vocab_size, (1, T)))
    causal_pairs = T * (T + 1) // 2
    assert counter.get_total_flops() == sequence_flops(SMALL, T) - attention_core(SMALL, causal_pairs)


@settings(max_examples=30, deadline=None)
@given(cfg=configs, n=st.integers(1, 40), past=st.integers(0, 40), batch=st.integers(1, 4))
def test_forward_ops_add_up(cfg, n, past, batch):
    ops = forward_ops(cfg, n, past, batch)
    total = sum(op.flops for op in ops)
    assert total == batch * sum(sum(flops_per_token(cfg, past + t + 1).values()) for t in range(n))
    if past == 0:
        assert sum(op.flops for op in forward_ops(cfg, n)) == sequence_flops(cfg, n)
    for comp in COMPONENTS:
        by_ops = sum(op.flops for op in ops if op.component == comp)
        assert by_ops == batch * sum(flops_per_token(cfg, past + t + 1)[comp] for t in range(n))
    assert all(op.flops > 0 and op.bytes > 0 and op.intensity == op.flops / op.bytes for op in ops)


def test_forward_op_bytes_and_intensity():
    ops = {op.name: op for op in forward_ops(SMOL, new_tokens=1, weight_bytes=2, act_bytes=2)}
    d, L = SMOL.hidden_size, SMOL.num_hidden_layers
    assert ops["q_proj"].bytes == L * (2 * d * d + 2 * (d + d))
    # A batch-1 decode step is about one FLOP per weight byte: far below any GPU's ridge point.
    assert 0.9 < ops["gate_proj"].intensity < 1.0
    prefill = {op.name: op for op in forward_ops(SMOL, new_tokens=512, weight_bytes=2, act_bytes=2)}
    assert prefill["gate_proj"].intensity > 100 * ops["gate_proj"].intensity
    assert Op("x", "mlp", 10, 4).intensity == 2.5


@pytest.mark.parametrize("kwargs", [dict(new_tokens=0), dict(new_tokens=1, past=-1), dict(new_tokens=1, batch=0)])
def test_forward_ops_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        forward_ops(SMOL, **kwargs)


def test_generation_flops_cached_is_linear_uncached_quadratic():
    cached = generation_flops(SMOL, prompt_len=10, new_tokens=6, cached=True)
    uncached = generation_flops(SMOL, prompt_len=10, new_tokens=6, cached=False)
    assert cached[0] == uncached[0] == sequence_flops(SMOL, 10)
    assert uncached == [sequence_flops(SMOL, 10 + i) for i in range(6)]
    steps = cached[1:]
    diffs = [b - a for a, b in zip(steps, steps[1:])]
    assert len(set(diffs)) == 1 and diffs[0] == attention_core(SMOL, 1)   # one more key per step
    assert all(c < u for c, u in zip(cached[1:], uncached[1:]))
    assert generation_flops(SMOL, 3, 0, cached=True) == []


@pytest.mark.parametrize("args", [(0, 3), (5, -1)])
def test_generation_flops_rejects_bad_input(args):
    with pytest.raises(ValueError):
        generation_flops(SMOL, *args, cached=True)


def test_weight_bytes_per_token():
    p = param_counts(SMOL)
    # Tied head: the embedding matrix is read once, as the LM head (the row lookup is free).
    assert weight_bytes_per_token(SMOL, 2) == 2 * sum(p.values())
    untied = LlamaConfig(tie_word_embeddings=False)
    assert weight_bytes_per_token(untied, 1) == sum(param_counts(untied).values()) - untied.vocab_size * 576


@pytest.mark.parametrize("cached", [True, False])
def test_generation_flops_last_only_matches_torch_counter(small, cached):
    P, N = 6, 4
    predicted = generation_flops(SMALL, P, N, cached=cached, last_only=True)
    ids = torch.randint(0, SMALL.vocab_size, (1, P + N))
    cache = KVCache.for_model(small, 1, P + N) if cached else None
    with torch.no_grad():
        for i in range(N):
            n = P + i
            counter = FlopCounterMode(display=False)
            with counter:
                if cached and i > 0:
                    small(ids[:, n - 1:n], cache=cache, last_only=True)
                else:
                    small(ids[:, :n], cache=cache, last_only=True)
            pairs = n if cached and i > 0 else n * (n + 1) // 2
            assert counter.get_total_flops() == predicted[i] - attention_core(SMALL, pairs), i
