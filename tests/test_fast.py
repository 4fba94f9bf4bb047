"""fast.FastLlama: the same tokens and logits as the legible model, with fewer ops."""
import pytest
import torch

from inference_internals.fast import KERNELS, FastLlama, Projection, fast
from inference_internals.generate import generate
from inference_internals.kv_cache import KVCache
from inference_internals.model import Llama, LlamaConfig, random_model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def model():
    return Llama.from_pretrained(device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def tok():
    from inference_internals.model import load_tokenizer
    return load_tokenizer()


def test_token_identical_to_generate_fp32(model, tok):
    f = FastLlama(model, kernel="linear", max_len=64)
    for text in PROMPTS:
        ids = tok.encode(text)
        assert f.generate(ids, 12) == generate(model, ids, 12), text


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "linear"])
def test_other_kernels_token_identical(model, tok, kernel):
    f = FastLlama(model, kernel=kernel, max_len=64, slabs=3)  # 3 divides every output size here
    assert set(f.kernels.values()) == {kernel}
    ids = tok.encode(PROMPTS[1])
    assert f.generate(ids, 12) == generate(model, ids, 12)


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


def test_logits_close_prefill_and_decode(model, tok):
    f = fast(model, kernel="auto", max_len=64)
    assert set(f.kernels) == {"qkv", "o", "gate_up", "down", "lm_head"} and set(f.kernels.values()) <= set(KERNELS)
    ids = torch.tensor([tok.encode("The quick brown fox jumps over")])
    cache = KVCache.for_model(model, 1, 64)
    with torch.inference_mode():
        f.reset(1)
        ours = f(ids, last_only=False)
        ref = model(ids, cache=cache)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        nxt = ref[:, -1:].argmax(-1)
        for _ in range(3):  # decode steps, one token each, against the growing cache
            a, b = f(nxt), model(nxt, cache=cache)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            nxt = b.argmax(-1)


def test_hidden_is_model_final_normed_hidden_state(model, tok):
    """What MTP heads draft from: model.py's last output_hidden_states entry, at every position."""
    f = FastLlama(model, kernel="split_w", max_len=64)
    ids = torch.tensor([tok.encode("Once upon a time")])
    with torch.inference_mode():
        f.reset(1)
        logits, h = f(ids, last_only=False, return_hidden=True)
        ref_logits, ref_hidden = model(ids, output_hidden_states=True)
    assert h.shape == ref_hidden[-1].shape
    torch.testing.assert_close(h, ref_hidden[-1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=5e-4)  # logits of size ~10-20


def test_batch_matches_generate(model, tok):
    f = FastLlama(model, max_len=64)
    ids = [tok.encode("Hello, my name is"), tok.encode("The weather today is")]
    n = min(map(len, ids))
    batch = [row[:n] for row in ids]
    assert f.generate(batch, 6) == generate(model, batch, 6)


def test_stop_ids_and_zero_tokens(model, tok):
    f = FastLlama(model, max_len=64)
    ids = tok.encode("The capital of France is")
    first = generate(model, ids, 1)[0]
    assert f.generate(ids, 10, stop_ids=[first]) == [first]
    assert f.generate(ids, 10, stop_ids=[first], include_stop=False) == []
    assert f.generate(ids, 0) == []


def test_shares_unfused_weights_and_keeps_model_intact(model):
    before = {k: v.clone() for k, v in list(model.state_dict().items())[:6]}
    f = FastLlama(model, kernel="linear", max_len=16)
    assert f.embed.data_ptr() == model.embed_tokens.weight.data_ptr()  # no copy at the same dtype
    assert f.layers[0]["o"].w.data_ptr() == model.layers[0].self_attn.o_proj.weight.data_ptr()
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v)


def test_bf16_runs_and_mostly_agrees():
    # random weights: fast, no checkpoint needed; bf16 rounds, so compare loosely
    cfg = LlamaConfig(num_hidden_layers=2, vocab_size=512, max_position_embeddings=64)
    m = random_model(cfg, seed=0, device="cpu", dtype=torch.float32)
    f = FastLlama(m, dtype=torch.bfloat16, max_len=32)
    ids = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    f.reset(1)
    with torch.inference_mode():
        ours = f(ids, last_only=False).float()
        ref = m(ids)
    assert ours.dtype == torch.float32 and m.dtype == torch.float32  # the model stays fp32
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.75
    torch.testing.assert_close(ours, ref, rtol=0.1, atol=0.15)


def _compiler():
    import os
    import shutil
    return any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if c)


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_step_matches_eager():
    # a small random model: compiling the real one takes a minute; the graph is the same code
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    m = random_model(cfg, seed=0, device="cpu", dtype=torch.float32)
    eager, comp = FastLlama(m, max_len=32), FastLlama(m, max_len=32, compile=True)
    calls = []
    step = comp.step
    comp.step = lambda *a: calls.append(a[1].shape[3]) or step(*a)  # the cached length of each call
    ids = [5, 9, 13, 2, 7]
    assert comp.generate(ids, 12) == generate(m, ids, 12) == eager.generate(ids, 12)
    # every decode step compiled (one per new token after the first), the prefill not
    assert len(calls) >= 11 and calls == list(range(len(ids), len(ids) + len(calls)))
    assert comp.generate([[5, 9], [13, 2]], 4) == generate(m, [[5, 9], [13, 2]], 4)  # a batch runs eager
    with torch.inference_mode():
        for f in (eager, comp):
            f.reset(1)
            f(torch.tensor([ids]))
        for t in (3, 200, 17):  # logits, hidden state and the K/V written, step by step
            a, b = eager(torch.tensor([[t]]), return_hidden=True), comp(torch.tensor([[t]]), return_hidden=True)
            for x, y in zip(a, b):
                torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-4)
        assert comp.length == eager.length == len(ids) + 3
        torch.testing.assert_close(comp.k[:, :, :, :comp.length], eager.k[:, :, :, :eager.length], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(comp.v[:, :, :, :comp.length], eager.v[:, :, :, :eager.length], rtol=1e-5, atol=1e-5)
        comp.length = 32
        with pytest.raises(ValueError, match="max_len"):
            comp(torch.tensor([[3]]))


def test_clear_errors(model):
    with pytest.raises(TypeError):
        FastLlama(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_len"):
        FastLlama(model, max_len=0)
    with pytest.raises(ValueError, match="kernel"):
        FastLlama(model, kernel="magic", max_len=8)
    f = FastLlama(model, max_len=8)
    with pytest.raises(ValueError, match="no room"):
        f.generate(list(range(3, 11)), 4)
    with pytest.raises(ValueError, match="token ids"):
        f.generate([1, 10**6], 2)
    with pytest.raises(ValueError, match="at least one"):
        f.generate([], 2)
    with pytest.raises(ValueError, match="reset"):
        FastLlama(model, max_len=8)(torch.tensor([[1, 2]]))
    f.reset(1)
    with pytest.raises(ValueError, match="max_len"):
        f(torch.ones(1, 9, dtype=torch.long))
    assert f.length == 0  # the failed call stored nothing
