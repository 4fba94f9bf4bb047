"""The decode step's attention kernel (optimize/decode_attention.cpp) equals attention computed the plain
way: each row's stored keys gathered through its block table, the new ones after them under the causal
rule, softmax, values. Random shapes, tables, lengths and storage dtypes (hypothesis); bad inputs refused."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals.optimize import blockdot, decode_attention

pytestmark = pytest.mark.skipif(blockdot.available() is not None, reason=str(blockdot.available()))


def reference(q, k_new, v_new, k_store, v_store, table, S, lengths):
    """Gather, join, mask, softmax: in float64."""
    B, Hq, T, D = q.shape
    Hkv, bs = k_store.shape[1], k_store.shape[2]
    out = torch.empty(B, Hq, T, D, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b]) if lengths is not None else S
        rows = table[b] if table is not None and table.dim() == 2 else table
        slots = torch.arange(n)
        blocks = rows[slots // bs] if rows is not None else slots // bs
        ks = k_store[blocks, :, slots % bs].double().transpose(0, 1)  # [Hkv, n, D]
        vs = v_store[blocks, :, slots % bs].double().transpose(0, 1)
        ks = torch.cat([ks, k_new[b].double()], 1)
        vs = torch.cat([vs, v_new[b].double()], 1)
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            scores = q[b, h].double() @ ks[kv].T / D ** 0.5  # [T, n + T]
            later = torch.arange(T)[None, :] > torch.arange(T)[:, None]
            scores[:, n:] = scores[:, n:].masked_fill(later, float("-inf"))
            out[b, h] = scores.softmax(-1) @ vs[kv]
    return out


@st.composite
def cases(draw):
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    G = draw(st.integers(1, 4))
    T = 1 if B > 1 else draw(st.integers(1, 5))
    D = draw(st.sampled_from([16, 64, 80, 256]))
    bs = draw(st.sampled_from([1, 4, 16]))
    nb = draw(st.integers(1, 40))
    S = draw(st.integers(1, nb * bs))
    paged = draw(st.booleans()) or B > 1
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    seed = draw(st.integers(0, 2**16))
    return B, Hkv, G, T, D, bs, nb, S, paged, dtype, seed


@settings(max_examples=60, deadline=None)
@given(cases())
def test_equals_gathered_attention(case):
    B, Hkv, G, T, D, bs, nb, S, paged, dtype, seed = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g)
    k_new, v_new = torch.randn(2, B, Hkv, T, D, generator=g)
    pool = nb * B + 3
    k_store, v_store = (3 * torch.randn(2, pool, Hkv, bs, D, generator=g)).to(dtype)
    if paged:
        table = torch.randperm(pool, generator=g)[:B * nb].reshape(B, nb)
        table = table[0] if B == 1 and seed % 2 else table   # one row's table may be 1-D
    else:
        table = None   # the storage's own blocks 0, 1, ... in order
    lengths = torch.randint(1, S + 1, (B,), generator=g) if B > 1 else None
    span = torch.empty(S, 0)
    got = decode_attention.decode(q, k_new, v_new, k_store, v_store, table, span, lengths)
    want = reference(q, k_new, v_new, k_store, v_store, table, S, lengths)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


def test_reads_a_contiguous_cache_through_its_strides():
    """A contiguous cache's buffer, cut to the tokens it holds: one block as long as they are, its rows
    a longer buffer's (strides the kernel follows, no copy)."""
    g = torch.Generator().manual_seed(0)
    buffer_k, buffer_v = torch.randn(2, 1, 3, 100, 64, generator=g)
    k_store, v_store = buffer_k[:, :, :37], buffer_v[:, :, :37]
    q, k_new, v_new = torch.randn(1, 9, 1, 64, generator=g), *torch.randn(2, 1, 3, 1, 64, generator=g)
    got = decode_attention.decode(q, k_new, v_new, k_store, v_store, None, torch.empty(37, 0))
    torch.testing.assert_close(got.double(), reference(q, k_new, v_new, k_store, v_store, None, 37, None),
                               rtol=2e-5, atol=2e-5)


def test_long_cache_past_many_chunks_and_scores_far_apart():
    """8,000 stored tokens (32 chunks of 256) whose scores differ by hundreds: each chunk's maximum is
    another, and the merge rescales them exactly."""
    g = torch.Generator().manual_seed(1)
    k_store, v_store = torch.randn(2, 500, 3, 16, 64, generator=g)
    k_store[7, 1, 3] *= 40   # one key far above the rest
    table = torch.randperm(500, generator=g)
    q, k_new, v_new = 3 * torch.randn(1, 9, 1, 64, generator=g), *torch.randn(2, 1, 3, 1, 64, generator=g)
    got = decode_attention.decode(q, k_new, v_new, k_store, v_store, table, torch.empty(8000, 0))
    torch.testing.assert_close(got.double(), reference(q, k_new, v_new, k_store, v_store, table, 8000, None),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(q=a["q"].double()), "must be fp32"),
    (lambda a: a.update(k_new=a["k_new"][:, :2]), "kv_heads"),
    (lambda a: a.update(table=a["table"][:1]), "fewer slots"),
    (lambda a: a.update(table=a["table"].int()), "int64"),
    (lambda a: a.update(lengths=torch.tensor([21])), "outside 0..20"),
    (lambda a: a.update(k_store=a["k_store"].to(torch.int8), v_store=a["v_store"].to(torch.int8)), "fp32, bf16 or fp16"),
    (lambda a: a.update(q=torch.randn(1, 3, 1, 24), k_new=torch.randn(1, 3, 1, 24), v_new=torch.randn(1, 3, 1, 24)),
     "multiple of 16"),
])
def test_bad_inputs_are_refused(change, message):
    args = dict(q=torch.randn(1, 3, 1, 64), k_new=torch.randn(1, 3, 1, 64), v_new=torch.randn(1, 3, 1, 64),
                k_store=torch.randn(4, 3, 16, 64), v_store=torch.randn(4, 3, 16, 64), table=torch.tensor([2, 0]),
                span=torch.empty(20, 0))
    change(args)
    with pytest.raises(RuntimeError, match=message):
        decode_attention.decode(**args)


@pytest.mark.parametrize("layout", ["contiguous", "paged", "paged batch"])
def test_the_compiled_steps_loops_give_the_kernels_answer(layout):
    """Where the kernel does not run (a GPU, a CPU without AVX-512) the compiled step's attention is
    AppendingView's products and sums: the same function, run here without the kernel."""
    from inference_internals.kv_cache.appending import AppendingView
    from inference_internals.kv_cache.base import Stored

    g = torch.Generator().manual_seed(2)
    L, B = 2, 1 if layout != "paged batch" else 3
    k_store, v_store = torch.randn(2, L, 100, 3, 16, 64, generator=g).to(torch.bfloat16)
    table = torch.randperm(100, generator=g)[:20 * B].reshape(B, 20) if layout != "contiguous" else None
    if layout == "paged":
        table = table[0]
    lengths = torch.tensor([300, 17, 160]) if B > 1 else None
    T = 1 if B > 1 else 3
    q, k_new, v_new = torch.randn(B, 9, T, 64, generator=g), *torch.randn(2, B, 3, T, 64, generator=g)
    stored = Stored(k_store, v_store, table, torch.empty(300, 0), None, (), layout, lengths)
    kernel = [AppendingView(stored, decode_attention).attend(layer, q, k_new, v_new) for layer in range(L)]
    loops = [AppendingView(stored).attend(layer, q, k_new, v_new) for layer in range(L)]
    for a, b in zip(kernel, loops):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
