"""Paged KV cache, block pool and scheduler: invariants under random workloads, and clear errors.

The model-free tests drive the block pool and the K/V pool the way the engine does and keep
a shadow copy of every sequence's keys/values; the engine tests use a tiny random model so
hundreds of scheduling steps run in seconds. Real-model checks are in test_paged_model.py.
"""
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from inference_internals.generate import generate
from inference_internals.kv_cache import CacheFullError
from inference_internals.model import LlamaConfig, random_model
from inference_internals.engine import (BlockPool, LLMEngine, OutOfBlocksError, Scheduler, Sequence,
                                       StaticScheduler, block_hash)
from inference_internals.kv_cache import PagedKVCache
from inference_internals.params import SamplingParams
from inference_internals.analysis.trace import make_trace, replay

TINY = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=96,
                   eos_token_id=2)
MODEL = random_model(TINY, seed=0, device="cpu")  # the tests feed it CPU tensors
PARAMS = SamplingParams(temperature=0, max_tokens=4)


def kv_for(tokens: list[int], cfg=TINY) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in K/V of the last token: a fixed function of the whole prefix, as a model's is.
    [layers, kv_heads, head_dim] each."""
    rng = random.Random(hash(tuple(tokens)))
    shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    vals = torch.tensor([rng.random() for _ in range(2 * shape[0] * shape[1] * shape[2])])
    return vals[: vals.numel() // 2].view(shape), vals[vals.numel() // 2:].view(shape)


def write_new(cache: PagedKVCache, pool: BlockPool, seq: Sequence) -> None:
    """Compute the K/V of seq's uncached tokens through PagedBatch, as a forward pass would."""
    c, n = seq.num_cached, seq.num_new_tokens
    kv = [kv_for(seq.token_ids[: p + 1]) for p in range(c, c + n)]
    view = cache.batch([seq.block_table], [c], [n])
    view.begin(torch.arange(c, c + n)[None])
    for layer in range(TINY.num_hidden_layers):
        k = torch.stack([x[0][layer] for x in kv], dim=1)[None]  # [1, Hkv, n, hd]
        v = torch.stack([x[1][layer] for x in kv], dim=1)[None]
        view.update(layer, k, v)
    seq.num_cached += n
    pool.register(seq)


class PoolMachine(RuleBasedStateMachine):
    """Random add / append / fork / free / preempt / readmit against a shadow of every K/V."""

    @initialize(num_blocks=st.integers(3, 12), block_size=st.integers(1, 4), prefix=st.booleans())
    def setup(self, num_blocks, block_size, prefix):
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=prefix)
        self.cache = PagedKVCache(TINY, num_blocks, block_size)
        self.running: list[Sequence] = []
        self.preempted: list[Sequence] = []
        self.out_of_blocks = 0

    def _state(self):
        return ([b.ref_count for b in self.pool.blocks], list(self.pool.free), dict(self.pool.cached))

    # A tiny alphabet makes shared prefixes (and prefix-cache hits) common.
    @rule(prompt=st.lists(st.integers(3, 5), min_size=1, max_size=10))
    def add(self, prompt):
        self._admit(Sequence(prompt, PARAMS, self.pool.block_size))

    def _admit(self, seq):
        if self.pool.can_allocate(seq):
            self.pool.allocate(seq)
            write_new(self.cache, self.pool, seq)
            self.running.append(seq)
            return True
        before = self._state()
        with pytest.raises(OutOfBlocksError):
            self.pool.allocate(seq)
        assert self._state() == before and not seq.block_table  # a refusal changes nothing
        self.out_of_blocks += 1
        return False

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=st.integers(3, 5))
    def append(self, i, token):
        seq = self.running[i % len(self.running)]
        seq.token_ids.append(token)
        if not self.pool.can_append(seq):
            before = self._state()
            with pytest.raises(OutOfBlocksError):
                self.pool.append_slot(seq)
            assert self._state() == before
            seq.token_ids.pop()
            self.out_of_blocks += 1
            return
        copy = self.pool.append_slot(seq)
        if copy:
            self.cache.copy_blocks([copy])
        write_new(self.cache, self.pool, seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.running[i % len(self.running)]
        child = parent.fork(sample_index=1)
        self.pool.fork(parent, child)
        self.running.append(child)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        self.pool.free_seq(self.running.pop(i % len(self.running)))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def preempt(self, i):
        seq = self.running.pop(i % len(self.running))
        self.pool.free_seq(seq)
        self.preempted.append(seq)

    @precondition(lambda self: self.preempted)
    @rule()
    def readmit(self):
        if self._admit(self.preempted[0]):  # recompute: the same tokens, written again
            self.preempted.pop(0)

    @invariant()
    def ref_counts_match_owners(self):
        self.pool.check(self.running + self.preempted)
        assert all(not s.block_table for s in self.preempted)

    @invariant()
    def cache_matches_shadow(self):
        for seq in self.running:
            assert seq.num_cached == len(seq)
            want = [kv_for(seq.token_ids[: p + 1]) for p in range(len(seq))]
            for layer in range(TINY.num_hidden_layers):
                k, v = self.cache.read(layer, seq.block_table, len(seq))
                assert torch.equal(k, torch.stack([w[0][layer] for w in want], dim=1))
                assert torch.equal(v, torch.stack([w[1][layer] for w in want], dim=1))

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for seq in self.running:
            self.pool.free_seq(seq)
        assert self.pool.num_free == self.pool.num_blocks, "a block leaked"
        self.pool.check([])


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase


def test_block_hash_is_chained():
    a = block_hash([5, 6, 7, 8])
    assert block_hash([5, 6, 7, 8]) == a
    assert block_hash([5, 6, 7, 8], prefix_hash=a) != a  # same block after a different prefix
    assert block_hash([5, 6, 7, 9]) != a


def test_prefix_cache_hits_full_blocks_only_and_never_the_last_token():
    pool = BlockPool(8, block_size=4)
    cache = PagedKVCache(TINY, 8, 4)
    first = Sequence(list(range(3, 13)), PARAMS, 4)  # 10 tokens: blocks [4, 4, 2]
    pool.allocate(first)
    write_new(cache, pool, first)
    assert len(pool.cached) == 2
    same = Sequence(list(range(3, 13)), PARAMS, 4)
    pool.allocate(same)
    assert same.num_cached == 8 and same.block_table[:2] == first.block_table[:2]
    exact = Sequence(list(range(3, 11)), PARAMS, 4)  # 8 tokens: the second block holds its last token
    pool.allocate(exact)
    assert exact.num_cached == 4 and exact.block_table[0] == first.block_table[0]
    assert exact.block_table[1] != first.block_table[1]
    pool.check([first, same, exact])


def test_freed_cached_blocks_are_revived_then_evicted_when_reused():
    pool = BlockPool(3, block_size=2)
    cache = PagedKVCache(TINY, 3, 2)
    a = Sequence([3, 4, 5], PARAMS, 2)
    pool.allocate(a)
    write_new(cache, pool, a)
    pool.free_seq(a)
    assert pool.num_free == 3 and len(pool.cached) == 1  # free, but still cached
    b = Sequence([3, 4, 9], PARAMS, 2)
    pool.allocate(b)
    assert b.num_cached == 2 and pool.prefix_hits == 1
    pool.free_seq(b)
    c = Sequence([7, 7, 7, 7, 7, 7], PARAMS, 2)  # needs all 3 blocks: the cached one is reused
    pool.allocate(c)
    assert not pool.cached
    pool.check([c])


def test_fork_shares_blocks_and_copies_on_write():
    pool = BlockPool(6, block_size=4)
    cache = PagedKVCache(TINY, 6, 4)
    parent = Sequence([3, 4, 5, 6, 7, 8], PARAMS, 4)  # a full block and a half-full one
    pool.allocate(parent)
    write_new(cache, pool, parent)
    child = parent.fork(1)
    pool.fork(parent, child)
    assert [pool.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    child.token_ids.append(9)
    src, dst = pool.append_slot(child)  # writing into the shared half block: copy first
    cache.copy_blocks([(src, dst)])
    assert src == parent.block_table[1] and child.block_table == [parent.block_table[0], dst]
    write_new(cache, pool, child)
    parent.token_ids.append(10)
    assert pool.append_slot(parent) is None  # now the only owner: no copy
    write_new(cache, pool, parent)
    assert pool.copies == 1
    k_parent, _ = cache.read(0, parent.block_table, 7)
    k_child, _ = cache.read(0, child.block_table, 7)
    assert torch.equal(k_parent[:, :6], k_child[:, :6]) and not torch.equal(k_parent[:, 6], k_child[:, 6])
    pool.check([parent, child])


def test_paged_batch_rejects_bad_input_and_writes_nothing():
    cache = PagedKVCache(TINY, 4, 2)
    with pytest.raises(CacheFullError, match="blocks"):
        cache.batch([[0]], [1], [2])  # 3 tokens in one 2-slot block
    with pytest.raises(ValueError, match="outside"):
        cache.batch([[7]], [0], [1])
    with pytest.raises(ValueError, match="one block table"):
        cache.batch([[0], [1]], [0], [1])
    view = cache.batch([[0, 1], [2]], [2, 0], [1, 2])
    with pytest.raises(ValueError, match="positions"):
        view.begin(torch.tensor([[2, 2], [0, 2]]))  # row 1's pad looks past its last token
    with pytest.raises(ValueError, match="positions"):
        view.begin(torch.tensor([[3, 3], [0, 1]]))  # row 0 skips a position
    view.begin(torch.tensor([[2, 2], [0, 1]]))
    mask = view.mask
    assert mask.shape == (2, 1, 2, 4)
    assert mask[1, 0].tolist() == [[True, False, False, False], [True, True, False, False]]
    with pytest.raises(ValueError, match="k, v must be"):
        view.update(0, torch.ones(2, 3, 2, 4), torch.ones(2, 3, 2, 4))
    assert not cache.k.any() and not cache.v.any()


def test_errors_out_of_blocks_and_too_long():
    pool = BlockPool(2, block_size=4)
    with pytest.raises(OutOfBlocksError, match="needs 3 blocks"):
        Scheduler(pool).add(Sequence([3] * 10, SamplingParams(temperature=0, max_tokens=2), 4))
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
    engine = LLMEngine(MODEL, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="context window"):
        engine.add_request([3] * TINY.max_position_embeddings)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([3, 99])
    with pytest.raises(ValueError, match="at least one"):
        engine.add_request([])
    with pytest.raises(OutOfBlocksError, match="the pool has 4"):
        engine.add_request([3] * 10, SamplingParams(temperature=0, max_tokens=10))
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(temperature=0, max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    assert not engine.has_unfinished()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.integers(1, 20), min_size=1, max_size=6), new=st.integers(1, 8),
       num_blocks=st.integers(6, 24), block_size=st.sampled_from([1, 2, 4, 8]), prefix=st.booleans(),
       packed=st.booleans(), seed=st.integers(0, 1000))
def test_engine_matches_generate_even_when_out_of_blocks(lens, new, num_blocks, block_size, prefix, packed, seed):
    """Greedy output equals one-prompt-at-a-time generate(); too few blocks means preemption.
    Packed steps (prompts and decode tokens mixed in one row) give the same tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 8) for _ in range(n)] for n in lens]  # repetitive: prefix hits
    if max(BlockPool(1, block_size).blocks_needed(n + new) for n in lens) > num_blocks:
        num_blocks = BlockPool(1, block_size).blocks_needed(max(lens) + new)
    engine = LLMEngine(MODEL, num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=prefix, packed=packed)
    reqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=new)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        engine.pool.check(engine.scheduler.sequences)
    assert engine.pool.num_free == num_blocks  # nothing leaked
    assert [r.outputs[0] for r in reqs] == [generate(MODEL, p, new) for p in prompts]


def test_preemption_recomputes_the_newest_and_everyone_finishes():
    engine = LLMEngine(MODEL, num_blocks=6, block_size=2, enable_prefix_caching=False)
    prompts = [[3, 4, 5], [6, 7, 3], [4, 4, 4]]
    reqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)) for p in prompts]
    engine.run()
    assert engine.scheduler.num_preemptions > 0
    assert reqs[0].seqs[0].num_preemptions == 0  # the oldest is never the victim
    assert [r.outputs[0] for r in reqs] == [generate(MODEL, p, 6, stop_ids=[]) for p in prompts]


@pytest.mark.parametrize("packed", [False, True])
def test_parallel_sampling_shares_blocks_and_matches_separate_requests(packed):
    prompt = [3, 4, 5, 6, 7, 3, 4]
    shared = LLMEngine(MODEL, num_blocks=16, block_size=2, packed=packed)
    req = shared.add_request(prompt, SamplingParams(max_tokens=5, temperature=1.0, seed=7, n=3))
    shared.step()  # prefill once, then fork
    assert len(req.seqs) == 3 and shared.pool.num_used == shared.pool.blocks_needed(len(prompt))
    shared.run()
    alone = LLMEngine(MODEL, num_blocks=16, block_size=2, packed=packed)
    outs = [alone.generate([prompt], SamplingParams(max_tokens=5, temperature=1.0, seed=7 + i))[0].outputs[0].token_ids
            for i in range(3)]
    assert req.outputs == outs
    assert shared.pool.copies >= 2  # the half-full last prompt block, copied before writing
    if packed:  # arriving while another request decodes: prefilled in a mixed step, then forked
        busy = LLMEngine(MODEL, num_blocks=16, block_size=2, packed=True)
        busy.add_request([5, 6], SamplingParams(max_tokens=5, temperature=1.0, seed=1))
        busy.step()
        late = busy.add_request(prompt, SamplingParams(max_tokens=5, temperature=1.0, seed=7, n=3))
        busy.run()
        assert busy.stats[1].kind == "mixed" and late.outputs == outs


def test_static_batching_reserves_max_length_and_waits_for_the_batch():
    engine = LLMEngine(MODEL, num_blocks=8, block_size=4, static_reserve_tokens=16)
    assert isinstance(engine.scheduler, StaticScheduler) and engine.scheduler.batch_size == 2
    prompts = [[3, 4], [5, 6, 7], [3, 3, 3, 3, 3]]
    lengths = [2, 8, 3]
    reqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            for p, n in zip(prompts, lengths)]
    engine.step()
    assert engine.pool.num_used == 8  # two reservations of 16 tokens = the whole pool
    engine.run()
    first_batch_end = max(reqs[0].finish_time, reqs[1].finish_time)
    assert reqs[2].seqs[0].first_token_time > first_batch_end
    assert [r.outputs[0] for r in reqs] == [generate(MODEL, p, n, stop_ids=[]) for p, n in zip(prompts, lengths)]
    with pytest.raises(ValueError, match="reservation"):
        engine.add_request([3] * 10, SamplingParams(temperature=0, max_tokens=10))


def test_replay_reproduces_the_engine_schedule():
    """The model-free replay makes the same decisions as the engine on the same trace."""
    trace = make_trace(12, (2, 9), (1, 6), max_new_tokens=8, seed=3)
    engine = LLMEngine(MODEL, num_blocks=10, block_size=2, enable_prefix_caching=False)
    for r in trace:
        engine.add_request([3] * r.prompt_len, SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True))
    engine.run()
    records = replay(Scheduler(BlockPool(10, 2, enable_prefix_caching=False)), trace)
    assert [(r["running"], r["waiting"], r["reserved"] // 2, r["filled"]) for r in records] == \
        [(s.num_running, s.num_waiting, s.used_blocks, s.filled_slots) for s in engine.stats]
    assert sum(r["preempted"] for r in records) == engine.scheduler.num_preemptions > 0
    # A step's own time (what load.StepCost is fitted on) fits inside the gap since the last step.
    ends = [0.0] + [s.time for s in engine.stats]
    assert all(0 < s.seconds <= b - a + 1e-6 for s, a, b in zip(engine.stats, ends, ends[1:]))


def test_reservations_hold_whole_lengths_and_paged_waste_is_under_a_block_per_sequence():
    trace = make_trace(40, (1, 20), (1, 12), max_new_tokens=12, seed=0)
    paged = replay(Scheduler(BlockPool(30, 4, False)), trace)
    assert all(r["reserved"] - r["filled"] <= r["running"] * 3 for r in paged)
    contiguous = replay(Scheduler(BlockPool(30, 4, False), reserve=lambda s: 32), trace)
    assert all(r["reserved"] == r["running"] * 32 for r in contiguous)
    assert sum(r["preempted"] for r in contiguous) == 0


def test_more_bad_input():
    with pytest.raises(ValueError, match="static batching"):
        LLMEngine(MODEL, num_blocks=8, block_size=4, static_reserve_tokens=16).add_request([3], SamplingParams(n=2))
    with pytest.raises(ValueError, match="watermark"):
        Scheduler(BlockPool(4), watermark=1.0)
    with pytest.raises(ValueError, match="reservation"):
        Scheduler(BlockPool(8, 4), reserve=lambda s: 4).add(Sequence([3] * 3, PARAMS, 4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        make_trace(4, (1, 4), (1, 8), max_new_tokens=4)
    pool = BlockPool(2, 2)
    seq = Sequence([3, 4, 5], PARAMS, 2)
    pool.allocate(seq)
    with pytest.raises(ValueError, match="already holds"):
        pool.allocate(seq)
    seq.num_cached = 4
    with pytest.raises(OutOfBlocksError):
        pool.append_slot(seq)
    pool.check([seq])


def test_watermark_keeps_headroom_but_never_blocks_an_idle_engine():
    pool = BlockPool(20, 2, enable_prefix_caching=False)
    sched = Scheduler(pool, watermark=0.5)  # keep 10 blocks free while anything runs
    big, small = Sequence([3] * 30, PARAMS, 2), Sequence([3] * 2, PARAMS, 2)
    sched.add(big)
    sched.add(small)
    assert sched.schedule().seqs == [big]  # 15 blocks: more than the headroom allows, but nothing runs
    assert pool.num_free == 5 and not sched._admit().seqs  # now the headroom holds back the small one


def test_packed_batch_rejects_bad_input_and_writes_nothing():
    cache = PagedKVCache(TINY, 4, 2)
    with pytest.raises(CacheFullError, match="blocks"):
        cache.packed([[0]], [1], [2])
    view = cache.packed([[0, 1], [2]], [2, 0], [1, 2])  # row: [seq 0 @ 2, seq 1 @ 0, seq 1 @ 1]
    with pytest.raises(ValueError, match="positions"):
        view.begin(torch.tensor([[2, 2], [0, 1]]))  # padded rows: a packed batch is one row
    with pytest.raises(ValueError, match="positions"):
        view.begin(torch.tensor([[3, 0, 1]]))  # seq 0 skips a position
    view.begin(torch.tensor([[2, 0, 1]]))
    mask = view.mask
    # keys: seq 0's blocks 0, 1 (slots 0-3), then seq 1's block 2 (slots 4-5)
    assert mask[0, 0].tolist() == [[True, True, True, False, False, False],
                                   [False, False, False, False, True, False],
                                   [False, False, False, False, True, True]]
    assert view.last.tolist() == [0, 2]
    with pytest.raises(ValueError, match="k, v must"):
        view.update(0, torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4))  # 2 tokens, the row has 3
    with pytest.raises(ValueError, match="k, v must"):
        view.update(0, torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4))  # one row per sequence
    assert not cache.k.any() and not cache.v.any()
    with pytest.raises(ValueError, match="one layout"):
        LLMEngine(MODEL, num_blocks=8, block_size=4, packed=True, padded_prefill=True)


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 6)), min_size=1, max_size=4),
       block_size=st.sampled_from([1, 2, 4]), seed=st.integers(0, 1000))
def test_packed_logits_equal_padded_batch_logits(lens, block_size, seed):
    """The same ragged batch (cached c, new n per sequence) through both layouts: equal logits."""
    rng = random.Random(seed)
    seqs = [[rng.randrange(3, 60) for _ in range(c + n)] for c, n in lens]
    need = [BlockPool(1, block_size).blocks_needed(len(t)) for t in seqs]
    tables = [list(range(sum(need[:i]), sum(need[:i + 1]))) for i in range(len(seqs))]
    out = []
    for layout in ("batch", "packed"):
        cache = PagedKVCache(TINY, sum(need), block_size)
        with torch.inference_mode():
            for t, table, (c, _) in zip(seqs, tables, lens):  # the cached part, one sequence at a time
                if c:
                    MODEL(torch.tensor([t[:c]]), positions=torch.arange(c)[None], cache=cache.batch([table], [0], [c]))
            cached, new = [c for c, _ in lens], [n for _, n in lens]
            view = getattr(cache, layout)(tables, cached, new)
            if layout == "packed":
                ids = torch.tensor([[x for t, c in zip(seqs, cached) for x in t[c:]]])
                pos = torch.tensor([[p for t, c in zip(seqs, cached) for p in range(c, len(t))]])
                out.append(MODEL(ids, positions=pos, cache=view, logits_at=view.last)[0])
            else:
                T = max(new)
                ids = torch.tensor([t[c:] + [t[-1]] * (T - n) for t, c, n in zip(seqs, cached, new)])
                pos = torch.tensor([list(range(c, len(t))) + [len(t) - 1] * (T - n)
                                    for t, c, n in zip(seqs, cached, new)])
                out.append(MODEL(ids, positions=pos, cache=view, last_only=True)[:, -1])
    torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-5)


def test_mixed_steps_admit_alongside_decode_but_not_after_a_preemption():
    pool = BlockPool(7, 2, enable_prefix_caching=False)
    sched = Scheduler(pool, watermark=0, mixed=True)
    a, b, c = (Sequence([3] * 3, PARAMS, 2) for _ in range(3))
    sched.add(a)
    first = sched.schedule()
    assert first.seqs == [a] and first.kind == "prefill"
    a.num_cached = 3
    a.token_ids.append(4)
    sched.add(b)
    second = sched.schedule()  # a decodes, b is admitted: one mixed step
    assert second.seqs == [a, b] and second.num_decode == 1 and second.kind == "mixed"
    for s in (a, b):
        s.num_cached = len(s)
        s.token_ids.append(4)
    # 3 blocks free; a's 5th token takes one, c's prompt the other two: the pool is full.
    sched.add(c)
    third = sched.schedule()
    assert third.seqs == [a, b, c] and third.kind == "mixed" and pool.num_free == 0
    for s in (a, b, c):
        s.num_cached = len(s)
        s.token_ids.append(4)
    d = Sequence([3], PARAMS, 2)
    sched.add(d)
    fourth = sched.schedule()  # b's 5th token needs a block: c (the newest) gives its blocks up
    assert fourth.preempted == [c] and fourth.seqs == [a, b] and fourth.kind == "decode"
    assert list(sched.waiting) == [c, d] and pool.num_free == 1  # d is not admitted in this step
