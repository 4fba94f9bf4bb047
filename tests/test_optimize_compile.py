"""optimize(model, compile=True): the compiled steps give the eager steps' tokens and logits. A file of
its own: these tests compile, and pytest-xdist hands out whole files, so beside the rest of test_optimize
they kept one worker busy long after the other had finished. Most run the door's kind of model (4-bit
blocks), whose graphs inductor's cache keeps between runs; one runs an fp32 model, whose graphs it
compiles every run (about two minutes, when every test here was fp32)."""
import contextlib

import pytest
import torch

from inference_internals.generate import generate
from inference_internals.kv_cache import KVCache
from inference_internals.model import random_model
from inference_internals.optimize import optimize
from test_optimize import SMALL, small


def _compiler():
    import os
    import shutil
    return any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if c)


def quantized(seed=0, compile=False, config=None):
    """A small random model of the door's kind: 4-bit codes with a scale and a minimum per 32 weights (the
    LM head 8-bit), through torch's int4 kernel on fp32 activations (the block kernels round activations
    to int8 codes, where the compiled graph's last-bit differences move a code). Its graphs come from
    inductor's cache on a second run: an fp32 model's frozen weights are packed for oneDNN, which the
    cache cannot store, so each of its graphs is compiled again every run."""
    k = "int4x2_mm_fp32"
    return optimize(random_model(config or SMALL, seed=seed, device="cpu", dtype=torch.float32), weights="int8_asym",
                    quant_kernel={"int8_asym": k, "q8_0": k}, compile=compile)


@pytest.fixture(scope="module")
def pair():
    """A small random model, eager and compiled, shared by this file's tests: each graph compiles once
    (compiling the real model takes a minute; the graph is the same layers)."""
    return quantized(), quantized(compile=True)


@pytest.fixture(scope="module")
def fp32_pair():
    """The same in fp32, where inductor picks its own C++ GEMM for each projection (max_autotune)."""
    return small(kernel="linear"), small(kernel="linear", compile=True)


@contextlib.contextmanager
def recording(comp):
    """Each compiled pass's (tokens fed, cached length seen) meanwhile; the step restored after."""
    seen, step = [], comp.forward.step
    comp.forward.step = lambda ids, *a, **kw: seen.append((ids.shape[1], a[1].k.shape[3])) or step(ids, *a, **kw)
    try:
        yield seen
    finally:
        comp.forward.step = step


@pytest.fixture
def passes(pair):
    with recording(pair[1]) as seen:
        yield seen


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
@pytest.mark.parametrize("models", ["quantized", "fp32"])
def test_compiled_step_matches_eager(models, request):
    eager, comp = request.getfixturevalue("pair" if models == "quantized" else "fp32_pair")
    with recording(comp) as calls:
        ids = [5, 9, 13, 2, 7]
        assert generate(comp, ids, 12) == generate(eager, ids, 12)
        # every decode step compiled (one per new token after the first), the prefill not
        assert len(calls) >= 11 and [c for _, c in calls] == list(range(len(ids), len(ids) + len(calls)))
        calls.clear()
        assert generate(comp, [[5, 9], [13, 2]], 4) == generate(eager, [[5, 9], [13, 2]], 4)
        assert calls == []  # a batch runs eager
        caches = [KVCache.for_model(m, 1, 10) for m in (eager, comp)]
        with torch.inference_mode():
            for m, c in zip((eager, comp), caches):
                m(torch.tensor([ids]), cache=c)
            for t in (3, 200, 17):  # logits and the K/V written, step by step
                a, b = (m(torch.tensor([[t]]), cache=c) for m, c in zip((eager, comp), caches))
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
            e, c = caches
            assert c.length == e.length == len(ids) + 3
            torch.testing.assert_close(c.k[:, :, :, :c.length], e.k[:, :, :, :e.length], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(c.v[:, :, :, :c.length], e.v[:, :, :, :e.length], rtol=1e-5, atol=1e-5)
            for _ in range(2):  # 8 -> 10 tokens: the cache is full
                comp(torch.tensor([[3]]), cache=c)
            from inference_internals.kv_cache import CacheFullError
            with pytest.raises(CacheFullError):
                comp(torch.tensor([[3]]), cache=c)
            assert c.length == 10  # the failed step stored nothing


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_verify_passes_match_eager_and_keep_speculative_exact(pair, passes):
    from inference_internals.drafts import PromptLookupDraft
    from inference_internals.speculative import speculative_generate

    eager, comp = pair
    ids = [5, 9, 13, 2, 7]
    caches = [KVCache.for_model(m, 1, 20) for m in (eager, comp)]
    with torch.inference_mode():
        for m, c in zip((eager, comp), caches):
            m(torch.tensor([ids]), cache=c)
        for x in ([3, 200, 17], [8, 1], [4, 4, 4, 4, 9], [6]):  # passes of 3, 2, 5 and 1 token
            (a, ha), (b, hb) = (m(torch.tensor([x]), cache=c, output_hidden_states=True)
                                for m, c in zip((eager, comp), caches))
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)  # every position's logits, causal
            torch.testing.assert_close(hb[-1], ha[-1], rtol=1e-4, atol=1e-4)
        e, c = caches
        assert c.length == e.length == len(ids) + 11
        torch.testing.assert_close(c.k[:, :, :, :c.length], e.k[:, :, :, :e.length], rtol=1e-5, atol=1e-5)
    assert [t for t, _ in passes] == [3, 2, 5, 1]  # all compiled, not the prefill
    # prompt lookup's guesses verified by the compiled passes: the plain model's greedy tokens
    prompt = [5, 9, 13, 2, 7, 5, 9, 13, 2, 7, 5, 9]
    want = generate(eager, prompt, 16, stop_ids=[])
    passes.clear()
    assert speculative_generate(comp, prompt, PromptLookupDraft(), 16, gamma=4, stop_ids=[]).tokens == want
    assert any(t > 1 for t, _ in passes)


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_models_side_by_side_each_run_their_own_graph(pair):
    # Warm passes skip dynamo's guards but for those that tell graphs apart: two compiled models of
    # the same shape (their graphs share one code cache), each called in turn with one-token steps,
    # verify passes and hidden states, must each still give its own eager twin's logits.
    pairs = [pair, (quantized(seed=1), quantized(seed=1, compile=True))]
    ids = [5, 9, 13, 2, 7]
    caches = [[KVCache.for_model(m, 1, 24) for m in pair] for pair in pairs]
    with torch.inference_mode():
        for pair, cs in zip(pairs, caches):
            for m, c in zip(pair, cs):
                m(torch.tensor([ids]), cache=c)
        for x in ([3], [8, 1], [4], [6, 2, 9], [11], [12]):  # twice each kind once the other model has run
            hidden = len(x) > 1  # a verify pass with the hidden states a draft reads
            for (eager, comp), (ce, cc) in zip(pairs, caches):
                want, got = (m(torch.tensor([x]), cache=c, output_hidden_states=hidden) for m, c in ((eager, ce), (comp, cc)))
                torch.testing.assert_close(got[0] if hidden else got, want[0] if hidden else want, rtol=1e-4, atol=1e-4)
        assert all(kind[:3] in {k[:3] for k in comp.forward.warm} for _, comp in pairs
                   for kind in [(True, False, True), (False, True, False)])
        one, two = (comp(torch.tensor([[3]]), cache=cc) for (_, comp), (_, cc) in zip(pairs, caches))
        assert not torch.allclose(one, two)  # the two models differ: a shared graph would have been caught
        for (eager, _), (ce, _) in zip(pairs, caches):
            eager(torch.tensor([[3]]), cache=ce)  # the eager twins' caches keep up
    with torch.no_grad():  # another grad mode: compiled again, not refused
        eager, comp = pairs[0]
        torch.testing.assert_close(comp(torch.tensor([[4]]), cache=caches[0][1]), eager(torch.tensor([[4]]), cache=caches[0][0]),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
@pytest.mark.parametrize("quant_kernel", ["int4x2_mm_fp32", "int4x2_mm"])
def test_compiled_quantized_step_matches_its_eager_step(quant_kernel):
    # q8_0 codes through the int4 kernel, fp32 and bf16 activations: the compiled graph calls the same op
    fp32 = quant_kernel.endswith("_fp32")
    kw = dict(dtype=torch.float32 if fp32 else torch.bfloat16, weights="q8_0", quant_kernel=quant_kernel)
    eager, comp = small(**kw), small(**kw, compile=True)
    assert comp.quant_kernels == eager.quant_kernels == {"q8_0": quant_kernel}
    ids = [5, 9, 13, 2, 7]
    caches = [KVCache.for_model(m, 1, 12) for m in (eager, comp)]
    with torch.inference_mode():
        for m, c in zip((eager, comp), caches):
            m(torch.tensor([ids]), cache=c)
        for t in (3, 200, 17):
            a, b = (m(torch.tensor([[t]]), cache=c) for m, c in zip((eager, comp), caches))
            # bf16: one step of bf16 at these logits' size (2-4) is 0.016; compiled and eager round at
            # different places (the compiled attention sums in fp32), two steps apart at most
            torch.testing.assert_close(b, a, rtol=1e-4 if fp32 else 2e-2, atol=1e-4 if fp32 else 4e-2)
    assert generate(comp, ids, 6) == generate(eager, ids, 6)


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_batched_decode_reads_each_rows_blocks_and_matches_eager(pair):
    # A continuous-batching decode step: rows of their own lengths, each one new token, each reading its
    # own blocks (scattered through the pool) where they lie, keys past a row's length masked.
    from inference_internals.engine import LLMEngine
    from inference_internals.kv_cache.paged import PagedBatch, PagedKVCache
    from inference_internals.params import SamplingParams

    eager, comp = pair
    prompts = [[5, 9, 13, 2, 7], [3, 8], [4, 4, 6, 1, 2, 9, 11, 12, 3]]
    tables = [[7, 2, 6], [0, 11, 5], [9, 1, 4, 10]]  # blocks of 4: the rows cross into new blocks as they grow
    pools = [PagedKVCache.for_model(m, 12, 4) for m in (eager, comp)]  # (block 3 and 8 never used)
    rows = []
    step = comp.forward.step
    comp.forward.step = lambda ids, *a, **kw: rows.append(ids.shape[0]) or step(ids, *a, **kw)
    try:
        with torch.inference_mode():
            for m, pool in zip((eager, comp), pools):
                for table, p in zip(tables, prompts):
                    m(torch.tensor([p]), cache=PagedBatch(pool, [table], [0], [len(p)]))
            cached = [len(p) for p in prompts]
            for x in ([3], [200], [17], [8]):
                ids = torch.tensor([x] * 3) + torch.arange(3)[:, None]
                a, b = (m(ids, cache=PagedBatch(pool, tables, cached, [1] * 3), last_only=True)
                        for m, pool in zip((eager, comp), pools))
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
                cached = [c + 1 for c in cached]
            used = sorted(set(sum(tables, [])))
            for s in ("k", "v"):
                torch.testing.assert_close(getattr(pools[1], s)[:, used], getattr(pools[0], s)[:, used],
                                           rtol=1e-5, atol=1e-5)
        assert rows == [3] * 4, "every batched step ran the compiled graph"
        rows.clear()
        # through the engine: greedy tokens of rows that join and leave equal the eager engine's
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (6, 3, 6)]
        outs = [[o.outputs[0].token_ids for o in LLMEngine(m, num_blocks=16, block_size=4).generate(prompts, params)]
                for m in (eager, comp)]
        assert outs[1] == outs[0]
        assert set(rows) == {3, 2}, "batches of three and of two compiled (one graph for every B >= 2)"
    finally:
        comp.forward.step = step


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_a_growing_pool_compiles_no_graph_again(pair):
    """An engine that sizes its pool per generate() grows it when a call needs more blocks. The pool's
    number of blocks is dynamic in the graphs, so a lone row's step and a batch's compile once, not again
    at every new size (the door's fast engine compiled for ~40 s at each: 0.5 tok/s through a benchmark
    that alternated 1 and 4 requests)."""
    from torch._dynamo.utils import counters

    from inference_internals.engine import LLMEngine
    from inference_internals.params import SamplingParams

    eager, comp = pair
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 9, 13, 2, 7], [3, 8, 1], [4, 4, 6, 1, 2, 9, 11]]
    engine = LLMEngine(comp, block_size=4)  # num_blocks None: the pool sized for each call's requests
    engine.generate(prompts[:1], greedy)
    engine.generate(prompts, greedy)  # a lone row's and a batch's graphs, compiled here if not before
    blocks, graphs = engine.pool.num_blocks, counters["stats"]["unique_graphs"]
    longer = [[t + 20 for t in p] * 3 for p in prompts]  # more blocks each (and no prefix cached): the pool grows
    outs = engine.generate(longer[:1], greedy) + engine.generate(longer, greedy)
    assert engine.pool.num_blocks > blocks
    assert counters["stats"]["unique_graphs"] == graphs, "a grown pool compiled a graph again"
    plain = LLMEngine(eager, block_size=4)
    expect = plain.generate(longer[:1], greedy) + plain.generate(longer, greedy)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expect]


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_what_prefix_caching_leaves_of_a_prompt_runs_eagerly(pair, passes):
    """A prompt whose first blocks the prefix cache holds is fed only its remainder, a few tokens: a pass
    like a verify pass's in shape, but wanting only the last token's logits. It runs eagerly; compiled,
    each first remainder compiled a graph in the middle of a request (19 s for 8 tokens, 47 s more for 29,
    on a 2-core EPYC: one round of make bench's batches at 36 tok/s instead of ~330)."""
    from inference_internals.engine import LLMEngine
    from inference_internals.params import SamplingParams

    eager, comp = pair
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    shared = [5, 9, 13, 2, 7, 3, 8, 1]  # two full blocks of 4
    prompts = [shared + [11], shared + [12, 6, 4], shared + [10, 14, 15, 16, 17, 18, 19]]
    engine, plain = (LLMEngine(m, block_size=4, num_blocks=16) for m in (comp, eager))  # one pool: its cache kept
    outs, expect = [], []
    for p in prompts:  # one at a time: each a lone row, its remainder 1, 3 and 7 tokens
        outs += engine.generate([p], greedy)
        expect += plain.generate([p], greedy)
    assert engine.pool.prefix_hits == 4, "the second and third prompts found the two shared blocks"
    assert {t for t, _ in passes} == {1}, "only decode steps ran compiled, no prompt or its remainder"
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expect]


@pytest.mark.skipif(not _compiler(), reason="torch.compile on a CPU needs a C++ compiler")
def test_the_compiled_step_goes_on_past_4096_stored_tokens():
    """Inductor's C++ sums switch to chunked accumulation past 4,096 terms and guard the graph on the side it
    is on. The step's attention once summed over S + 1 and over S stored keys, so at S = 4,096 the guards met
    in one length, and the step failed there (a dynamic length specialized, refused). Now it recompiles once
    when it crosses, and gives eager's tokens on both sides."""
    import dataclasses

    cfg = dataclasses.replace(SMALL, max_position_embeddings=4200)
    eager, comp = (quantized(seed=1, compile=c, config=cfg) for c in (False, True))
    ids = [(i * 7) % 250 + 3 for i in range(4088)]  # the decode steps store 4,088 ... 4,103 tokens
    assert generate(comp, ids, 16, stop_ids=[]) == generate(eager, ids, 16, stop_ids=[])
