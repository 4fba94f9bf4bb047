"""Our from-scratch Llama against Hugging Face's LlamaForCausalLM on the same weights."""
import pytest
import torch

from inference_internals.generate import generate
from inference_internals.model import Llama, LlamaConfig, apply_rope, count_parameters, random_model, rope_cos_sin

PROMPTS = [
    "What is RAG?",
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Translate to French: the cat sleeps on the warm windowsill.",
    "1 + 1 = 2, 2 + 2 = 4, 4 + 4 =",
]


def long_prompt(tokenizer, n=520):
    text = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(200))
    ids = tokenizer(text).input_ids[:n]
    assert len(ids) == n
    return ids


def tol(device):
    # fp32 everywhere; on CUDA matmuls may use TF32-free but differently ordered kernels.
    return 1e-4 if torch.device(device).type == "cpu" else 2e-3


@pytest.fixture(scope="module")
def on_device(model, device):
    return model if device == "cpu" else Llama.from_pretrained(device=device, dtype=torch.float32)


@torch.inference_mode()
def test_logits_and_hidden_states_match_reference(on_device, reference, tokenizer, device):
    prompts = [tokenizer(p).input_ids for p in PROMPTS] + [long_prompt(tokenizer)]
    assert any(len(p) >= 500 for p in prompts)
    for ids in prompts:
        x = torch.tensor([ids])
        ours, hidden = on_device(x.to(device), output_hidden_states=True)
        ref = reference(x, output_hidden_states=True)
        torch.testing.assert_close(ours.cpu(), ref.logits, atol=tol(device), rtol=tol(device))
        assert len(hidden) == len(ref.hidden_states) == on_device.config.num_hidden_layers + 1
        for layer, (a, b) in enumerate(zip(hidden, ref.hidden_states)):
            torch.testing.assert_close(a.cpu(), b, atol=tol(device), rtol=tol(device),
                                       msg=lambda m: f"hidden state {layer}: {m}")


def test_greedy_64_tokens_identical_to_hf_generate(on_device, reference, tokenizer):
    for text in PROMPTS[:2]:
        ids = tokenizer(text).input_ids
        ours = generate(on_device, ids, max_new_tokens=64, stop_ids=[])
        with torch.inference_mode():
            ref = reference.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert len(ours) == 64
        assert ours == ref


def test_config_and_parameter_count(model, reference):
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.vocab_size, cfg.rope_theta, cfg.tie_word_embeddings) == (30, 576, 9, 3, 49152, 100000.0, True)
    assert count_parameters(model) == reference.num_parameters()
    assert model.lm_head.weight is model.embed_tokens.weight


def test_rope_is_a_rotation_that_depends_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64)
    def rotated(x, pos):
        cos, sin = rope_cos_sin(torch.tensor([[pos]]), 64, 10000.0, torch.float32)
        return apply_rope(x, cos, sin)
    assert torch.allclose(rotated(q, 7).norm(), q.norm(), atol=1e-5)
    # q·k depends only on the distance between the two positions.
    a = (rotated(q, 10) * rotated(k, 3)).sum()
    b = (rotated(q, 107) * rotated(k, 100)).sum()
    assert torch.allclose(a, b, atol=1e-4)


def test_random_model_has_the_same_shapes():
    cfg = LlamaConfig(num_hidden_layers=2)
    m = random_model(cfg, device="cpu")
    out = m(torch.tensor([[1, 2, 3]]))
    assert out.shape == (1, 3, cfg.vocab_size)


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([[]], dtype=torch.long), "empty"),
    (torch.tensor([[1, 49152]]), "token ids must be in"),
    (torch.tensor([[-1, 5]]), "token ids must be in"),
    (torch.tensor([1, 2, 3]), "batch, seq"),
    (torch.tensor([[1.0, 2.0]]), "integer tensor"),
])
def test_bad_input_is_rejected(model, bad, message):
    with pytest.raises(ValueError, match=message):
        model(bad)


def test_positions_past_the_context_window_are_rejected(model):
    ctx = model.config.max_position_embeddings
    with pytest.raises(ValueError, match="context window"):
        model(torch.tensor([[1, 2]]), positions=torch.tensor([[ctx - 1, ctx]]))


def test_generate_rejects_empty_and_too_long_prompts(model):
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [], max_new_tokens=4)
    too_long = [1] * model.config.max_position_embeddings
    with pytest.raises(ValueError, match="context window"):
        generate(model, too_long, max_new_tokens=4)


def test_generation_stops_at_the_context_window(model):
    from inference_internals.kv_cache import KVCache

    cache = KVCache.for_model(model, 1, 8)
    from inference_internals.generate import generate_stream

    steps = list(generate_stream(model, [1, 2, 3, 4, 5, 6], max_new_tokens=10, stop_ids=[], cache=cache))
    assert len(steps) == 3 and cache.length == 8  # 6 prompt + 2 fed back; the 3rd needs no slot
