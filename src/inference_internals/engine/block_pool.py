"""Fixed-size KV blocks: a free list, reference counts, and a prefix cache of chained hashes.

The KV memory is cut into ``num_blocks`` blocks of ``block_size`` token slots. A sequence
holds a block table: the physical block of each of its logical blocks (tokens
``i*block_size .. (i+1)*block_size-1`` live in ``block_table[i]``). Nothing needs to be
contiguous, so memory is taken one block at a time as a sequence grows, and at most
``block_size - 1`` slots per sequence are ever empty.

A block may sit in several tables at once (parallel samples of one prompt, requests that
start with the same text). Its ``ref_count`` says in how many; it returns to the free list
when that reaches 0. A block that is shared and only partly filled is copied before anyone
writes into it (copy-on-write), so sharing never lets one sequence change another's cache.

Prefix cache: a full block is named by a hash of its tokens chained with the hash of the
block before it, so equal hashes mean equal prefixes, not just equal blocks. A freed block
keeps its hash until it is handed out again, so a later request with the same prefix can
revive it instead of recomputing it. Free blocks are reused oldest-freed first.
"""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from .sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than asked for; nothing was changed."""


def block_hash(token_ids, prefix_hash: int | None = None) -> int:
    """64-bit hash of one full block's tokens, chained with the hash of the block before it."""
    h = hashlib.blake2b(digest_size=8)
    if prefix_hash is not None:
        h.update(prefix_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None      # set once the block is full and its K/V computed
    token_ids: tuple = ()        # the tokens behind the hash, to rule out a collision


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: dict[int, None] = dict.fromkeys(range(num_blocks))  # an ordered set: oldest first
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.prefix_hits = 0  # blocks found in the prefix cache instead of computed
        self.copies = 0       # copy-on-write copies made

    # --- counting ---
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- single blocks ---
    def take(self) -> int:
        """A free block, now owned once; it forgets whatever prefix it cached."""
        if not self.free:
            raise OutOfBlocksError(f"all {self.num_blocks} blocks are in use")
        bid = next(iter(self.free))
        del self.free[bid]
        block = self.blocks[bid]
        if block.hash is not None and self.cached.get(block.hash) == bid:
            del self.cached[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return bid

    def _share(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:  # a cached block back from the free list
            del self.free[bid]
        block.ref_count += 1

    def release(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {bid} released more often than it was taken")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[bid] = None

    # --- the prefix cache ---
    def _lookup(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold ``seq``'s leading full blocks (stops at the first miss).

        The block holding the last token is never looked up: its logits are needed, so at
        least that token is computed, into a block this sequence owns alone.
        """
        if not self.enable_prefix_caching:
            return []
        hits, h = [], None
        for i in range((len(seq) - 1) // self.block_size):
            tokens = tuple(seq.block_tokens(i))
            h = block_hash(tokens, h)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != tokens:
                break
            hits.append(bid)
        return hits

    def register(self, seq: Sequence) -> None:
        """Hash the blocks of ``seq`` that became full and computed, so others can reuse them."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_cached // self.block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            tokens = tuple(seq.block_tokens(i))
            h = block_hash(tokens, seq.block_hashes[-1] if seq.block_hashes else None)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, tokens
                self.cached[h] = block.id

    # --- what the scheduler calls, one sequence at a time ---
    def _plan(self, seq: Sequence, reserve_tokens: int) -> tuple[list[int], int, int]:
        """Prefix-cache hits, blocks needed in all, and how many come off the free list."""
        hits = self._lookup(seq)
        need = self.blocks_needed(max(len(seq), reserve_tokens))
        revived = sum(self.blocks[b].ref_count == 0 for b in hits)  # cached but free: they leave the free list
        return hits, need, need - len(hits) + revived

    def blocks_to_allocate(self, seq: Sequence, reserve_tokens: int = 0) -> int:
        """Free blocks that ``allocate(seq)`` would take off the free list."""
        return self._plan(seq, reserve_tokens)[2]

    def can_allocate(self, seq: Sequence, reserve_tokens: int = 0) -> bool:
        return self.blocks_to_allocate(seq, reserve_tokens) <= self.num_free

    def allocate(self, seq: Sequence, reserve_tokens: int = 0) -> None:
        """Give a waiting sequence blocks for all its tokens (or for ``reserve_tokens``, if
        more: a contiguous-style reservation), reusing cached prefix blocks."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.id} already holds {len(seq.block_table)} blocks")
        hits, need, from_free = self._plan(seq, reserve_tokens)
        if from_free > self.num_free:
            raise OutOfBlocksError(f"sequence {seq.id} needs {from_free} free blocks, "
                                   f"{self.num_free} of {self.num_blocks} are free")
        for bid in hits:
            self._share(bid)
        self.prefix_hits += len(hits)
        seq.block_table = hits + [self.take() for _ in range(need - len(hits))]
        seq.num_cached = len(hits) * self.block_size
        seq.block_hashes = [self.blocks[b].hash for b in hits]

    def free_seq(self, seq: Sequence) -> None:
        """Return a sequence's blocks. The tail goes to the free list first, so it is evicted
        before the prefix it extends (the prefix is the likelier one to be shared again)."""
        for bid in reversed(seq.block_table):
            self.release(bid)
        seq.block_table, seq.block_hashes, seq.num_cached = [], [], 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (no copy now; copy-on-write later)."""
        if child.block_table:
            raise ValueError(f"sequence {child.id} already holds blocks")
        for bid in parent.block_table:
            self._share(bid)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_cached = parent.num_cached

    def can_append(self, seq: Sequence, n: int = 1) -> bool:
        """Are there free blocks for the next ``n`` writes (new blocks, and a copy of a shared one)?"""
        return self._blocks_for(seq, n) <= self.num_free

    def _blocks_for(self, seq: Sequence, n: int) -> int:
        first = seq.num_cached // self.block_size  # the block the next token's K/V goes into
        new = max(0, self.blocks_needed(seq.num_cached + n) - len(seq.block_table))
        shared = first < len(seq.block_table) and self.blocks[seq.block_table[first]].ref_count > 1
        return new + shared

    def append_slot(self, seq: Sequence, n: int = 1) -> tuple[int, int] | None:
        """Make the slots for ``seq``'s next ``n`` K/V (a decode step's one, a speculative step's
        γ + 1) writable by ``seq`` alone.

        Takes new blocks as the sequence crosses into them; copies a shared block before the first
        write into it (copy-on-write; only the block it is part-way through can be shared). Returns
        the (src, dst) copy to make on the K/V tensors, or None.
        """
        if not self.can_append(seq, n):
            raise OutOfBlocksError(f"sequence {seq.id} needs {self._blocks_for(seq, n)} blocks and "
                                   f"{self.num_free} of {self.num_blocks} are free")
        i = seq.num_cached // self.block_size
        while len(seq.block_table) < self.blocks_needed(seq.num_cached + n):
            seq.block_table.append(self.take())
        if i >= len(seq.block_table) or self.blocks[seq.block_table[i]].ref_count == 1:
            return None
        src = seq.block_table[i]
        dst = self.take()
        self.release(src)
        seq.block_table[i] = dst
        self.copies += 1
        return src, dst

    def trim(self, seq: Sequence) -> None:
        """Return the blocks past what ``seq`` has stored: a speculative step held slots for every guess,
        and the rejected ones' blocks are free again (their K/V are never read: past the length)."""
        keep = self.blocks_needed(seq.num_cached)
        while len(seq.block_table) > keep:
            self.release(seq.block_table.pop())

    def filled_slots(self, seqs) -> int:
        """Slots of held blocks that hold a stored token's K/V (a shared block counts once)."""
        bs = self.block_size
        full, partial = set(), {}
        for s in seqs:
            n = min(s.num_cached // bs, len(s.block_table))
            full.update(s.block_table[:n])
            if n < len(s.block_table) and s.num_cached > n * bs:
                bid = s.block_table[n]
                partial[bid] = max(partial.get(bid, 0), s.num_cached - n * bs)
        return len(full) * bs + sum(v for b, v in partial.items() if b not in full)

    # --- invariants, for tests and the notebook ---
    def check(self, seqs) -> None:
        """Raise AssertionError unless every ref count equals the number of tables holding the
        block and the free list holds exactly the blocks nobody holds."""
        owners = [0] * self.num_blocks
        for s in seqs:
            for bid in s.block_table:
                owners[bid] += 1
        for b in self.blocks:
            assert b.ref_count == owners[b.id], f"block {b.id}: ref_count {b.ref_count}, held {owners[b.id]}x"
            assert (b.ref_count == 0) == (b.id in self.free), f"block {b.id} free-list mismatch"
        for h, bid in self.cached.items():
            assert self.blocks[bid].hash == h, f"prefix cache points hash {h} at block {bid}"


class WindowedBlockPool(BlockPool):
    """Blocks for a model with sliding-window layers (Gemma 3): this pool holds the full-attention
    layers' blocks, as ``BlockPool`` does, and ``local`` a second pool for the sliding layers' (their
    K/V live in a storage of their own, ``kv_cache.PagedKVCache``'s local one).

    A sliding layer's query at position p sees keys p - window + 1 .. p. Each sequence's next tokens
    start at ``num_cached``, so once a step is done (``register``) every local block wholly before
    ``num_cached - window + 1`` is never read again: it goes back to the local pool, and its entry in
    the sequence's ``local_table`` becomes None (attention reads a pad there, masked out by the
    window). A long sequence then holds about window / block_size local blocks, whatever its length:
    the memory a window saves, in blocks that other sequences reuse.

    Prefix caching is off: a cached prefix would need its last window's local blocks too.
    """

    def __init__(self, num_blocks: int, block_size: int, window: int, num_local_blocks: int | None = None):
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.local = BlockPool(num_local_blocks or num_blocks, block_size, enable_prefix_caching=False)
        self.local_copies: list[tuple[int, int]] = []  # copy-on-write of local blocks, for the engine to make
        self.local_freed = 0  # local blocks that left a window and went back

    # --- the local table, alongside every call on the full one ---
    def blocks_to_allocate(self, seq: Sequence, reserve_tokens: int = 0) -> int:
        need = super().blocks_to_allocate(seq, reserve_tokens)
        # a sequence the local pool cannot take now looks as big as the whole pool: it waits
        return need if self.blocks_needed(len(seq)) <= self.local.num_free else self.num_blocks + 1

    def allocate(self, seq: Sequence, reserve_tokens: int = 0) -> None:
        if self.blocks_needed(len(seq)) > self.local.num_free:
            raise OutOfBlocksError(f"sequence {seq.id} needs {self.blocks_needed(len(seq))} local blocks, "
                                   f"{self.local.num_free} of {self.local.num_blocks} are free")
        super().allocate(seq, reserve_tokens)
        seq.local_table = [self.local.take() for _ in range(self.blocks_needed(len(seq)))]

    def _local_blocks_for(self, seq: Sequence, n: int) -> int:
        first = seq.num_cached // self.block_size
        new = max(0, self.blocks_needed(seq.num_cached + n) - len(seq.local_table))
        table = seq.local_table
        shared = first < len(table) and table[first] is not None and self.local.blocks[table[first]].ref_count > 1
        return new + shared

    def can_append(self, seq: Sequence, n: int = 1) -> bool:
        return super().can_append(seq, n) and self._local_blocks_for(seq, n) <= self.local.num_free

    def append_slot(self, seq: Sequence, n: int = 1):
        if self._local_blocks_for(seq, n) > self.local.num_free:
            raise OutOfBlocksError(f"sequence {seq.id} needs {self._local_blocks_for(seq, n)} local blocks and "
                                   f"{self.local.num_free} of {self.local.num_blocks} are free")
        copy = super().append_slot(seq, n)
        i, table = seq.num_cached // self.block_size, seq.local_table
        while len(table) < self.blocks_needed(seq.num_cached + n):
            table.append(self.local.take())
        if i < len(table) and table[i] is not None and self.local.blocks[table[i]].ref_count > 1:
            src, dst = table[i], self.local.take()
            self.local.release(src)
            table[i] = dst
            self.local.copies += 1
            self.local_copies.append((src, dst))
        return copy

    def pop_local_copies(self) -> list[tuple[int, int]]:
        out, self.local_copies = self.local_copies, []
        return out

    def free_seq(self, seq: Sequence) -> None:
        for bid in reversed(seq.local_table):
            if bid is not None:
                self.local.release(bid)
        seq.local_table = []
        super().free_seq(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        super().fork(parent, child)
        for bid in parent.local_table:
            if bid is not None:
                self.local._share(bid)
        child.local_table = list(parent.local_table)

    def trim(self, seq: Sequence) -> None:
        super().trim(seq)
        keep = self.blocks_needed(seq.num_cached)
        while len(seq.local_table) > keep:
            bid = seq.local_table.pop()
            if bid is not None:
                self.local.release(bid)

    def register(self, seq: Sequence) -> None:
        """After a step: the local blocks wholly before the window of ``seq``'s next token go back."""
        super().register(seq)
        first_seen = seq.num_cached - self.window + 1  # the oldest position the next query sees
        for i in range(min(len(seq.local_table), max(0, first_seen) // self.block_size)):
            if seq.local_table[i] is not None:
                self.local.release(seq.local_table[i])
                seq.local_table[i] = None
                self.local_freed += 1

    def check(self, seqs) -> None:
        """``BlockPool.check`` on both pools: every local block owned as often as tables hold it, none
        both free and held, and no sequence holding a local block its window has left."""
        seqs = list(seqs)
        super().check(seqs)
        from types import SimpleNamespace
        self.local.check([SimpleNamespace(block_table=[b for b in s.local_table if b is not None]) for s in seqs])
        for s in seqs:
            first_seen = s.num_cached - self.window + 1
            stale = [i for i, b in enumerate(s.local_table) if b is not None and (i + 1) * self.block_size <= first_seen]
            assert not stale, f"sequence {s.id} holds local blocks {stale} its window has left"
