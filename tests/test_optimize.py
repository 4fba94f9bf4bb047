"""optimize(model): the same tokens and logits as the plain model, with fewer ops, for every caller."""
import pytest
import torch

from inference_internals.generate import generate
from inference_internals.kv_cache import GrowingKVCache, KVCache
from inference_internals.model import Llama, LlamaConfig, random_model
from inference_internals.optimize import KERNELS, Projection, optimize

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]
SMALL = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


@pytest.fixture(scope="module")
def fast(model):
    return optimize(Llama.from_pretrained(device="cpu", dtype=torch.float32), kernel="split_w", slabs=3)


def small(seed=0, **kw):
    return optimize(random_model(SMALL, seed=seed, device="cpu", dtype=torch.float32), **kw)


def test_token_identical_to_the_plain_model_fp32(model, fast, tokenizer):
    assert fast.kernels == dict.fromkeys(("qkv", "o", "gate_up", "down", "lm_head"), "split_w")
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        assert generate(fast, ids, 12) == generate(model, ids, 12), text


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "split_w"])
def test_other_kernels_token_identical(model, tokenizer, kernel):
    m = optimize(Llama.from_pretrained(device="cpu", dtype=torch.float32), kernel=kernel, slabs=3)
    assert set(m.kernels.values()) == {kernel}  # 3 divides every output size here
    ids = tokenizer.encode(PROMPTS[1])
    assert generate(m, ids, 12) == generate(model, ids, 12)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (2, 5), (3, 7)])  # 4, 10 rows: verify passes; 21: a prefill
def test_every_kernel_is_the_same_linear_map(kernel, shape):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(12, 7, generator=g), torch.randn(*shape, 7, generator=g)
    torch.testing.assert_close(Projection(w, kernel, slabs=4)(x), x @ w.T)


def test_split_needs_slabs_that_divide_the_rows():
    with pytest.raises(ValueError, match="slabs"):
        Projection(torch.zeros(10, 4), "split_n", slabs=3)
    with pytest.raises(ValueError, match="slabs"):
        Projection(torch.zeros(10, 4), "split_t", slabs=1)


def test_auto_logits_close_through_every_cache():
    plain, m = random_model(SMALL, seed=0, device="cpu"), small(kernel="auto")
    assert set(m.kernels) == {"qkv", "o", "gate_up", "down", "lm_head"} and set(m.kernels.values()) <= set(KERNELS)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    for make in (KVCache.for_model, GrowingKVCache.for_model):
        a, b = make(plain, 2, 32), make(m, 2, 32)
        with torch.inference_mode():
            torch.testing.assert_close(m(ids, cache=b), plain(ids, cache=a), rtol=1e-4, atol=1e-4)
            nxt = ids[:, -1:]
            for _ in range(3):  # decode steps, one token each, and a two-token verify-like pass
                torch.testing.assert_close(m(nxt, cache=b), plain(nxt, cache=a), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(m(ids[:, :2], cache=b), plain(ids[:, :2], cache=a), rtol=1e-4, atol=1e-4)


def test_hidden_states_are_the_plain_models(model, fast, tokenizer):
    """What MTP heads draft from: the last output_hidden_states entry, at every position."""
    ids = torch.tensor([tokenizer.encode("Once upon a time")])
    with torch.inference_mode():
        logits, hidden = fast(ids, output_hidden_states=True)
        ref_logits, ref_hidden = model(ids, output_hidden_states=True)
    assert len(hidden) == len(ref_hidden)
    for a, b in zip(hidden, ref_hidden):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=5e-4)  # logits of size ~10-20


def test_batch_matches_the_plain_model(model, fast, tokenizer):
    ids = [tokenizer.encode("Hello, my name is"), tokenizer.encode("The weather today is")]
    n = min(map(len, ids))
    batch = [row[:n] for row in ids]
    assert generate(fast, batch, 6) == generate(model, batch, 6)


@pytest.mark.parametrize("kernel", KERNELS)
def test_state_dict_keeps_its_names_and_loads(kernel):
    plain, m = random_model(SMALL, seed=0, device="cpu"), small(kernel=kernel, slabs=2)
    sd, ref = m.state_dict(), plain.state_dict()
    assert sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref)
    attn = m.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == attn.qkv_proj.weight.data_ptr()  # a view, not a copy
    assert m.lm_head.weight is m.embed_tokens.weight  # still tied
    # the checkpoint's names load into the optimized model, kernels' layouts included
    other = random_model(SMALL, seed=1, device="cpu")
    m.load_state_dict(other.state_dict())
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        torch.testing.assert_close(m(ids), other(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_move_after_optimize_moves_every_layout(kernel):
    # .to(dtype) after optimize: the kernels' layouts (copies for matmul_t and split_t) follow the weights
    moved = small(kernel=kernel, slabs=2).to(torch.bfloat16)
    direct = small(dtype=torch.bfloat16, kernel=kernel, slabs=2)
    assert all(p.w.dtype == torch.bfloat16 for p in moved.modules() if isinstance(p, Projection))
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        assert torch.equal(moved(ids), direct(ids))


def test_bf16_runs_and_mostly_agrees():
    ref = random_model(SMALL, seed=0, device="cpu")
    m = small(dtype=torch.bfloat16, kernel="linear")
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours, want = m(ids).float(), ref(ids)
    assert m.dtype == torch.bfloat16 and m.rotary.cos.dtype == torch.bfloat16
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
    torch.testing.assert_close(ours, want, rtol=0.1, atol=0.15)


def test_every_caller_gets_the_optimized_model(model, fast, tokenizer):
    """The paged engine (padded and packed), speculative decoding and the drafts run the
    optimized modules through their own caches, with the plain model's tokens."""
    from inference_internals.drafts import EarlyExitDraft, PromptLookupDraft
    from inference_internals.engine.llm_engine import LLMEngine
    from inference_internals.params import SamplingParams
    from inference_internals.speculative import speculative_generate

    prompts = [tokenizer.encode(t) for t in PROMPTS[:3]]
    want = [generate(model, p, 8, stop_ids=[]) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for packed in (False, True):
        outs = LLMEngine(fast, num_blocks=16, block_size=8, packed=packed).generate(prompts, params)
        assert [o.outputs[0].token_ids for o in outs] == want
    for draft in (PromptLookupDraft(), EarlyExitDraft(fast, 4)):
        assert speculative_generate(fast, prompts[0], draft, 8, gamma=3, stop_ids=[]).tokens == want[0]
    assert isinstance(EarlyExitDraft(fast, 4).model.layers[0].self_attn.qkv_proj, Projection)


def test_clear_errors():
    with pytest.raises(TypeError):
        from inference_internals.optimize import optimize
        optimize(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="kernel"):
        small(kernel="magic")
    with pytest.raises(ValueError, match="kernel"):
        Projection(torch.zeros(4, 4), "magic")
