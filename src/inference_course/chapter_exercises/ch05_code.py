"""Chapter 5's code exercises: the prefix cache's chained block hashes and the block pool's
append-slot with copy-on-write, graded against ``BlockPool.register`` and ``BlockPool.append_slot``."""
from __future__ import annotations

import random

from ..code_exercises import Case, CodeExercise
from inference_internals.engine.block_pool import BlockPool
from inference_internals.engine.sequence import Sequence
from inference_internals.params import SamplingParams


def _sequence(tokens, block_size: int) -> Sequence:
    return Sequence(list(tokens), SamplingParams(temperature=0, max_tokens=64), block_size)


# --- 1. Chained block hashes ------------------------------------------------------------------

def reference_block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """What the pool registers once all of a sequence's tokens are computed."""
    pool = BlockPool(-(-len(token_ids) // block_size), block_size)
    seq = _sequence(token_ids, block_size)
    pool.allocate(seq)
    seq.num_cached = len(seq)
    pool.register(seq)
    return list(seq.block_hashes)


def _hash_cases() -> list[Case]:
    def case(label, tokens, block_size):
        return Case(label, lambda: (list(tokens), block_size), inputs=f"token_ids={tokens}, block_size={block_size}")
    rng = random.Random(0)
    return [
        case("fewer tokens than a block: no full block", [5, 6, 7], 4),
        case("exactly one block", [5, 6, 7, 8], 4),
        case("two full blocks and a partial one", list(range(10, 20)), 4),
        case("exactly three blocks", list(range(12)), 4),
        case("the same block twice: different hashes (chained)", [1, 2, 1, 2, 1, 2], 2),
        case("block size 1", [3, 1, 4, 1, 5], 1),
        case("random ids, block size 16", [rng.randrange(49152) for _ in range(50)], 16),
    ]


block_hash_exercise = CodeExercise(
    title="Chain the block hashes",
    prompt=("The prefix cache finds a block by the hash of its tokens **and of everything before it**: "
            "block `i`'s hash is `block_hash(tokens of block i, hash of block i − 1)`, and the first "
            "block's prefix hash is `None`. Only full blocks are hashed (a partial one still changes). "
            "Return the hashes of the full blocks of `token_ids`, in order, using the library's "
            "`block_hash(token_ids, prefix_hash)`."),
    name="block_hashes",
    stub='''from inference_internals.engine.block_pool import block_hash

def block_hashes(token_ids, block_size):
    """Chained hashes of the full blocks of token_ids: a list of ints."""
    raise NotImplementedError("your code here")
''',
    solution='''from inference_internals.engine.block_pool import block_hash

def block_hashes(token_ids, block_size):
    hashes, prefix = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prefix = block_hash(token_ids[start:start + block_size], prefix)
        hashes.append(prefix)
    return hashes
''',
    hint=("There are len(token_ids) // block_size full blocks. Hash each block's slice with the "
          "previous block's hash (None for the first) and carry that hash on."),
    reference=reference_block_hashes,
    cases=_hash_cases,
)


# --- 2. Append a slot, with copy-on-write ---------------------------------------------------------

def reference_append_slot(pool: BlockPool, seq: Sequence):
    return pool.append_slot(seq)


def _state(args, result):
    """What append_slot changes: its answer, the table, every block's owners, the free list, copies."""
    pool, seq = args
    return {"returned": result, "block_table": list(seq.block_table),
            "ref_counts": [b.ref_count for b in pool.blocks], "free": list(pool.free), "copies": pool.copies}


def _slot_cases() -> list[Case]:
    def running(pool, n_tokens, computed=None):
        """A sequence of n_tokens whose first `computed` (all but the last) have their K/V stored."""
        seq = _sequence(range(100, 100 + n_tokens), pool.block_size)
        pool.allocate(seq)
        seq.num_cached = n_tokens - 1 if computed is None else computed
        return seq

    def own_block_has_room():
        pool = BlockPool(6, 4)
        return pool, running(pool, 3)

    def crossing():
        pool = BlockPool(6, 4)
        seq = running(pool, 4, computed=4)   # a full block computed, then a new token sampled
        seq.token_ids.append(7)
        return pool, seq

    def last_slot_of_block():
        pool = BlockPool(6, 4)
        seq = running(pool, 4, computed=3)   # the next write is slot 3, the block's last
        return pool, seq

    def forked(n_tokens, computed):
        pool = BlockPool(6, 4)
        parent = running(pool, n_tokens, computed)
        child = _sequence(parent.token_ids, 4)
        pool.fork(parent, child)
        return pool, child

    def shared_no_free_block():
        pool, child = forked(6, 5)
        while pool.free:               # the rest of the pool is held by others
            pool.take()
        return pool, child

    def last_owner():
        pool, child = forked(6, 5)
        for bid in child.block_table:   # the parent finished: its references are gone
            pool.release(bid)
        return pool, child

    def full_pool():
        pool = BlockPool(2, 4)
        seq = running(pool, 8, computed=8)
        seq.token_ids.append(7)
        return pool, seq

    def case(label, make):
        return Case(label, make, inputs=_describe(make))
    return [
        case("the next slot is in the sequence's own block", own_block_has_room),
        case("the next slot is the last one of its block", last_slot_of_block),
        case("a full block: the next token needs a new block", crossing),
        case("after a fork, the shared partial block is copied", lambda: forked(6, 5)),
        case("after a fork at a block boundary: a new block, no copy", lambda: forked(8, 8)),
        case("the only remaining owner writes in place", last_owner),
        case("a copy with no free block: an error, nothing changed", shared_no_free_block),
        case("a new block with no free block: an error, nothing changed", full_pool),
    ]


def _describe(make) -> str:
    pool, seq = make()
    owners = {bid: pool.blocks[bid].ref_count for bid in seq.block_table}
    return (f"pool of {pool.num_blocks} blocks of {pool.block_size} slots, free {list(pool.free)}; "
            f"seq with {len(seq)} tokens, num_cached={seq.num_cached}, block_table={seq.block_table}, "
            f"ref_count of its blocks {owners}")


append_slot_exercise = CodeExercise(
    title="Append a slot, with copy-on-write",
    prompt=("Before a decode step writes the K/V of `seq`'s next token (at position `seq.num_cached`), "
            "the pool makes that slot writable by `seq` alone. If the position falls past the blocks in "
            "`seq.block_table`, take a new block and append it. If its block is shared "
            "(`pool.blocks[bid].ref_count > 1`, e.g. after a fork), take a new block, release the shared "
            "one, put the new one in the table, count the copy (`pool.copies += 1`) and return "
            "`(src, dst)` for the K/V copy. Otherwise return None. Use `pool.take()` (a free block, "
            "owned once; raises `OutOfBlocksError` when none is free) and `pool.release(bid)`; when no "
            "block is free, nothing may change."),
    name="append_slot",
    stub='''def append_slot(pool, seq):
    """Make the slot at seq.num_cached writable by seq alone. Returns (src, dst) for a copy, or None."""
    raise NotImplementedError("your code here")
''',
    solution='''def append_slot(pool, seq):
    i = seq.num_cached // pool.block_size          # the block the next K/V goes into
    if i >= len(seq.block_table):
        seq.block_table.append(pool.take())
        return None
    src = seq.block_table[i]
    if pool.blocks[src].ref_count == 1:
        return None
    dst = pool.take()                             # first: it raises when none is free
    pool.release(src)
    seq.block_table[i] = dst
    pool.copies += 1
    return src, dst
''',
    hint=("The block index is `seq.num_cached // pool.block_size` (the stored tokens, not len(seq)). "
          "Take the new block before releasing the old one, so a full pool raises with nothing changed."),
    reference=reference_append_slot,
    cases=_slot_cases,
    observe=_state,
)

CODE_EXERCISES = [block_hash_exercise, append_slot_exercise]
