"""The physical KV pool, and the cache object the model reads it through.

``PagedKVCache`` holds K and V for every block: [layers, num_blocks, kv_heads, block_size,
head_dim] each, allocated once. A token at position p of a sequence lives in block
``block_table[p // block_size]`` at offset ``p % block_size`` (its slot).

``PagedBatch`` is one forward pass's view of it, for a ragged batch: row b has
``num_cached[b]`` tokens stored and feeds ``num_new[b]`` new ones, padded to a common T.
It speaks the model's cache protocol (``base.KVCacheView``):
    positions(B, T)     each row's new tokens after its own cached ones
    begin(positions)    check the positions, compute the write slots and the attention mask
    attend(layer, ...)  write the new tokens' K/V into their slots (``update``), gather each row's
                        blocks into a padded [B, kv_heads, S, head_dim], attend over them
    commit(n)           nothing to do: the engine advances each sequence's ``num_cached``
Gathering copies the context every layer; vLLM's PagedAttention kernel instead reads the
blocks in place. The copy keeps this file short and uses the model's ordinary attention.

``PackedBatch`` is the other layout: every row's new tokens end to end in one row [1, N],
as vLLM runs a step, so prompts and decode tokens share one forward with no padding and
every weight is read once per step. Its keys are all rows' blocks end to end, and the mask
lets a token see only its own sequence's keys, up to its own position. vLLM does this
with a variable-length attention kernel; the mask costs N x keys booleans instead, and
attention scores every token against every sequence's keys: it grows with the square of
the batch, which is fine for this book's batches and not for a large server.

Padding: a row shorter than T is padded with its last token at its last position (the
engine does this). The pad's K/V are not written, and it attends to exactly what the last
real token attends to, so its output equals the last real token's: ``last_only`` then
gives every row's next-token logits.
"""
from __future__ import annotations

import functools

import torch

from ..device import get_device, parse_dtype
from .contiguous import CacheFullError
from ..params import check_int
from .base import Gathering, Stored


class PagedKVCache:
    """With ``num_local_blocks`` (a model with sliding-window layers), the sliding layers keep their
    K/V in a storage of their own, ``local_k``/``local_v`` [local layers, num_local_blocks, ...],
    reached through each sequence's local block table (engine.block_pool.WindowedBlockPool frees its
    blocks as they leave the window); ``k``/``v`` then hold the full-attention layers only."""

    def __init__(self, cfg, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 num_local_blocks: int | None = None):
        num_blocks, block_size = check_int("num_blocks", num_blocks, 1), check_int("block_size", block_size, 1)
        self.cfg, self.num_blocks, self.block_size = cfg, num_blocks, block_size
        local = list(cfg.windowed_layers) if num_local_blocks is not None else []
        if num_local_blocks is not None:
            check_int("num_local_blocks", num_local_blocks, 1)
            if not local:
                raise ValueError("num_local_blocks is for a model with sliding-window layers")
        full = [i for i in range(cfg.num_hidden_layers) if i not in local]
        self.num_local_blocks = num_local_blocks
        # layer -> (is it local, its index in its storage)
        self.where = {layer: (False, j) for j, layer in enumerate(full)} | {layer: (True, j) for j, layer in enumerate(local)}
        shape = (len(full), num_blocks, cfg.num_key_value_heads, block_size, cfg.head_dim)
        # device and dtype named as everywhere ('cuda', 'bf16'), refused here rather than inside torch
        device, dtype = get_device(device), parse_dtype(dtype, device)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.local_k = self.local_v = None
        if local:
            lshape = (len(local), num_local_blocks, *shape[2:])
            self.local_k = torch.zeros(lshape, device=device, dtype=dtype)
            self.local_v = torch.zeros(lshape, device=device, dtype=dtype)
        self.span = torch.empty(num_blocks * block_size, 0, device=device)  # PagedBatch.stored(): a size, no bytes

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16,
                  num_local_blocks: int | None = None, dtype: torch.dtype | str | None = None) -> "PagedKVCache":
        """The pool for ``model``, its K/V kept in ``dtype`` (None: the model's own)."""
        return cls(model.config, num_blocks, block_size, model.device, dtype or model.dtype, num_local_blocks)

    @property
    def has_local(self) -> bool:
        return self.local_k is not None

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + (self.local_k.nbytes + self.local_v.nbytes if self.has_local else 0)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block of the full layers' storage (all layers, without a local pool)."""
        return (self.k.nbytes + self.v.nbytes) // self.num_blocks

    @property
    def bytes_per_local_block(self) -> int:
        return (self.local_k.nbytes + self.local_v.nbytes) // self.num_local_blocks if self.has_local else 0

    def is_local(self, layer: int) -> bool:
        return self.where[layer][0]

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s K and V storage [blocks, kv_heads, block_size, hd], in whichever pool holds it."""
        local, j = self.where[layer]
        return (self.local_k[j], self.local_v[j]) if local else (self.k[j], self.v[j])

    def write(self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store n tokens' K/V ([n, kv_heads, head_dim]) at slots (blocks[i], offsets[i])."""
        k_store, v_store = self.layer_kv(layer)
        k_store[blocks, :, offsets] = k.to(k_store.dtype)
        v_store[blocks, :, offsets] = v.to(v_store.dtype)

    def gather(self, layer: int, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks of each row of ``tables`` [B, nb], laid end to end: [B, kv_heads, nb*bs, hd]."""
        B, nb = tables.shape
        out = []
        for cache in self.layer_kv(layer):
            x = cache[tables]  # [B, nb, Hkv, bs, hd]
            out.append(x.transpose(1, 2).reshape(B, x.shape[2], nb * self.block_size, x.shape[-1]))
        return out[0], out[1]

    def read(self, layer: int, block_table: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's first ``length`` tokens: K and V [kv_heads, length, head_dim]."""
        tables = torch.tensor([block_table], dtype=torch.long, device=self.k.device)
        k, v = self.gather(layer, tables)
        return k[0, :, :length], v[0, :, :length]

    def copy_blocks(self, pairs, local: bool = False) -> None:
        """Copy-on-write: block dst gets a copy of block src, in every layer (of the local storage)."""
        if not pairs:
            return
        k, v = (self.local_k, self.local_v) if local else (self.k, self.v)
        src = torch.tensor([s for s, _ in pairs], device=k.device)
        dst = torch.tensor([d for _, d in pairs], device=k.device)
        k[:, dst] = k[:, src]
        v[:, dst] = v[:, src]

    def batch(self, block_tables, num_cached, num_new, local_tables=None) -> "PagedBatch":
        return PagedBatch(self, block_tables, num_cached, num_new, local_tables)

    def packed(self, block_tables, num_cached, num_new, local_tables=None) -> "PackedBatch":
        return PackedBatch(self, block_tables, num_cached, num_new, local_tables)


def _local_rows(pool: PagedKVCache, block_tables, local_tables, num_cached, num_new):
    """The local tables as the views read them: a block that left the window (None) reads block 0,
    which the window's mask hides; checked like the full tables."""
    if not pool.has_local:
        if local_tables is not None:
            raise ValueError("local block tables need a pool with a local storage (num_local_blocks)")
        return None
    if local_tables is None or len(local_tables) != len(block_tables):
        raise ValueError("a pool with a local storage needs one local block table per row")
    bs = pool.block_size
    rows = []
    for b, (table, c, n) in enumerate(zip(local_tables, num_cached, num_new)):
        if c + n > len(table) * bs:
            raise CacheFullError(f"row {b}: {c} + {n} tokens need {-(-(c + n) // bs)} local blocks, "
                                 f"its table has {len(table)}")
        window = pool.cfg.sliding_window
        if any(x is None for x in table[max(0, c - window + 1) // bs:]):
            raise ValueError(f"row {b}: local blocks inside the window of position {c} were freed")
        if any(x is not None and not 0 <= x < pool.num_local_blocks for x in table):
            raise ValueError(f"row {b}: local table {table} names blocks outside 0..{pool.num_local_blocks - 1}")
        rows.append([0 if x is None else x for x in table])
    return rows


def _check_rows(pool: PagedKVCache, block_tables, num_cached, num_new) -> None:
    if not (len(block_tables) == len(num_cached) == len(num_new)) or not block_tables:
        raise ValueError(f"need one block table, cached count and new count per row, got "
                         f"{len(block_tables)}, {len(num_cached)}, {len(num_new)}")
    bs = pool.block_size
    for b, (table, c, n) in enumerate(zip(block_tables, num_cached, num_new)):
        if c < 0 or n < 1:
            raise ValueError(f"row {b}: need cached >= 0 and new >= 1, got {c}, {n}")
        if c + n > len(table) * bs:
            raise CacheFullError(f"row {b}: {c} + {n} tokens need {-(-(c + n) // bs)} blocks, "
                                 f"its table has {len(table)}")
        if any(not 0 <= x < pool.num_blocks for x in table):
            raise ValueError(f"row {b}: block table {table} names blocks outside 0..{pool.num_blocks - 1}")


def _check_kv(pool: PagedKVCache, k: torch.Tensor, v: torch.Tensor, B: int) -> None:
    cfg = pool.cfg
    if k.dim() != 4 or k.shape[0] != B or k.shape[1] != cfg.num_key_value_heads or \
            k.shape[3] != cfg.head_dim or k.shape != v.shape:
        raise ValueError(f"k, v must be [{B}, {cfg.num_key_value_heads}, T, {cfg.head_dim}], "
                         f"got {tuple(k.shape)}, {tuple(v.shape)}")


class _RaggedBatch(Gathering):
    """What both layouts share of the cache protocol: rows of their own lengths have no single
    ``length`` (``positions`` says where each row's tokens sit), and nothing is left to do at
    ``commit`` (the engine advances ``num_cached``)."""

    def commit(self, n_new: int) -> None:
        pass

    @property
    def model_config(self):
        return self.pool.cfg


class PagedBatch(_RaggedBatch):
    def __init__(self, pool: PagedKVCache, block_tables, num_cached, num_new, local_tables=None):
        _check_rows(pool, block_tables, num_cached, num_new)
        self.local_tables = _local_rows(pool, block_tables, local_tables, num_cached, num_new)
        bs = pool.block_size
        self.pool, self.block_tables = pool, block_tables
        self.num_cached, self.num_new = list(num_cached), list(num_new)
        # Only the blocks that hold tokens this step: the table may reserve more.
        nb = max(-(-(c + n) // bs) for c, n in zip(num_cached, num_new))
        pad = lambda tables: torch.tensor([list(t[:nb]) + [0] * (nb - len(t[:nb])) for t in tables],  # noqa: E731
                                          dtype=torch.long, device=pool.k.device)  # block 0 pads: masked out below
        self.tables = pad(block_tables)
        self.local = None if self.local_tables is None else pad(self.local_tables)
        self._made = None  # the positions tensor ``positions`` made (right by construction)
        self.pos = None    # the positions ``begin`` was given

    @functools.cached_property
    def _slots(self) -> tuple[torch.Tensor, ...]:
        """(rows, cols, blocks, offsets) of every new token: where it sits in the batch and in the
        pool. Made when first asked for (a compiled step writing one token needs none of them)."""
        bs, rows, cols, blocks, offsets, local = self.pool.block_size, [], [], [], [], []
        locals_ = self.local_tables or [None] * len(self.block_tables)
        for b, (table, ltable, c, n) in enumerate(zip(self.block_tables, locals_, self.num_cached, self.num_new)):
            for t in range(n):
                p = c + t
                rows.append(b), cols.append(t), blocks.append(table[p // bs]), offsets.append(p % bs)
                local.append(ltable[p // bs] if ltable is not None else 0)
        return tuple(torch.tensor(xs, dtype=torch.long, device=self.pool.k.device)
                     for xs in (rows, cols, blocks, offsets, local))

    rows = property(lambda self: self._slots[0])
    cols = property(lambda self: self._slots[1])
    blocks = property(lambda self: self._slots[2])
    offsets = property(lambda self: self._slots[3])
    local_blocks = property(lambda self: self._slots[4])

    def layer_slots(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the blocks this step writes, the tables it reads) for ``layer``: the local ones for a sliding layer."""
        if self.local is not None and self.pool.is_local(layer):
            return self.local_blocks, self.local
        return self.blocks, self.tables

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """[B, 1, T, S]: key j of row b is the token at position j, so a query sees keys up to its own
        position (which hides the slots past the row's length too). Made when first asked for."""
        if self.pos is None:
            raise RuntimeError("begin(positions) must come before the mask")
        S = self.tables.shape[1] * self.pool.block_size
        return torch.arange(S, device=self.pos.device)[None, None, None, :] <= self.pos[:, None, :, None]

    def positions(self, B: int, T: int) -> torch.Tensor:
        """Each row's new tokens after its cached ones, pads at the row's last position."""
        if B != len(self.num_new) or T < max(self.num_new):
            raise ValueError(f"a batch [{B}, {T}] does not fit {len(self.num_new)} rows "
                             f"of up to {max(self.num_new)} new tokens")
        self._made = torch.tensor(self._host_positions(T), device=self.tables.device)
        return self._made

    def _host_positions(self, T: int) -> list[list[int]]:
        return [list(range(c, c + n)) + [c + n - 1] * (T - n) for c, n in zip(self.num_cached, self.num_new)]

    def begin(self, positions: torch.Tensor) -> None:
        B, T = positions.shape
        if B != len(self.num_new) or T < max(self.num_new):
            raise ValueError(f"positions {tuple(positions.shape)} do not fit {len(self.num_new)} rows "
                             f"of up to {max(self.num_new)} new tokens")
        # Real tokens must sit right after what is cached; pads must not look further (a pad may
        # repeat any position up to the row's last). Positions this batch made are right by
        # construction and are not read back (on a GPU that would stall every step); others cost one read.
        if positions is not self._made:
            rows = positions.tolist()
            if any(r[:n] != e[:n] or max(r) > c + n - 1 for r, e, c, n in
                   zip(rows, self._host_positions(T), self.num_cached, self.num_new)):
                raise ValueError("positions must continue each row from its cached length "
                                 f"{self.num_cached}, with pads at most at the row's last position")
        self.pos = positions.to(self.tables.device)
        self.__dict__.pop("mask", None)  # made again from these positions when asked for
        self._windowed = None

    def positions_seen(self):
        """Row b's queries at their positions [B, 1, T]; key j of every row at position j."""
        S = self.tables.shape[1] * self.pool.block_size
        return self.pos[:, None, :], torch.arange(S, device=self.pos.device)

    def stored(self) -> Stored | None:
        """A lone row's blocks, read where they lie through its table (of at least two entries, a second
        copy of the first if need be: torch gives a size of 1 a graph of its own, as it does sizes 0 and 1
        of what is stored, which a decode step never has after a prefill). Or a batch's, each row one new
        token (a continuous-batching decode step): every row's table, padded, and how much each holds."""
        if self.num_cached[0] < 2 or self.pool.cfg.windowed_layers:
            return None
        if len(self.num_new) == 1:
            span = self.pool.span[:self.num_cached[0]]
            table = self.tables[0] if self.tables.shape[1] > 1 else self.tables[0].repeat(2)
            return Stored(self.pool.k, self.pool.v, table, span, self._write_new, ((table, 0), (span, 0)) + self._pool_size,
                          "paged")
        if any(n != 1 for n in self.num_new) or min(self.num_cached) < 1:
            return None
        span = self.pool.span[:max(self.num_cached)]
        table = self.tables if self.tables.shape[1] > 1 else self.tables.repeat(1, 2)
        lengths = torch.tensor(self.num_cached, device=table.device)
        return Stored(self.pool.k, self.pool.v, table, span, self._write_new,
                      ((table, 0), (table, 1), (span, 0), (lengths, 0)) + self._pool_size, "paged batch", lengths)

    @property
    def _pool_size(self) -> tuple:
        # the pool's number of blocks: an engine grows its pool when a generate() needs more room, and a
        # graph that held the old number would be compiled again (a minute) at every new size
        return (self.pool.k, 1), (self.pool.v, 1)

    def _write_new(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """The step's new K/V [layers, B, Hkv, T, hd] (a lone row's T tokens, or a batch's one token per
        row) into their slots in every layer at once."""
        if len(self.num_new) == 1 and self.num_new[0] == 1:  # one slot: plain indexing, no index tensors
            p = self.num_cached[0]
            block, offset = self.block_tables[0][p // self.pool.block_size], p % self.pool.block_size
            self.pool.k[:, block, :, offset] = k[:, 0, :, 0]
            self.pool.v[:, block, :, offset] = v[:, 0, :, 0]
            return
        # k[:, rows, :, cols]: [new tokens, layers, Hkv, hd], in the order of their slots (as ``update`` picks them)
        self.pool.k[:, self.blocks, :, self.offsets] = k[:, self.rows, :, self.cols].to(self.pool.k.dtype)
        self.pool.v[:, self.blocks, :, self.offsets] = v[:, self.rows, :, self.cols].to(self.pool.v.dtype)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        _check_kv(self.pool, k, v, len(self.num_new))
        blocks, tables = self.layer_slots(layer)
        self.pool.write(layer, blocks, self.offsets,
                        k[self.rows, :, self.cols], v[self.rows, :, self.cols])
        return self.pool.gather(layer, tables)


class PackedBatch(_RaggedBatch):
    """Every sequence's new tokens end to end in one row [1, N]; ``last[b]`` is where sequence
    b's last token sits in the row."""

    def __init__(self, pool: PagedKVCache, block_tables, num_cached, num_new, local_tables=None):
        _check_rows(pool, block_tables, num_cached, num_new)
        local_tables = _local_rows(pool, block_tables, local_tables, num_cached, num_new)
        bs, dev = pool.block_size, pool.k.device
        self.pool, self.num_cached, self.num_new = pool, list(num_cached), list(num_new)
        key_blocks, key_seq, key_pos, q_seq, query_pos, blocks, offsets = [], [], [], [], [], [], []
        local_keys, local_blocks = [], []
        for b, (table, c, n) in enumerate(zip(block_tables, num_cached, num_new)):
            nb = -(-(c + n) // bs)  # only the blocks that hold tokens this step
            if local_tables is not None:
                local_keys += local_tables[b][:nb]
                local_blocks += [local_tables[b][p // bs] for p in range(c, c + n)]
            key_blocks += table[:nb]
            key_seq += [b] * (nb * bs)
            key_pos += range(nb * bs)
            q_seq += [b] * n
            query_pos += range(c, c + n)
            blocks += [table[p // bs] for p in range(c, c + n)]
            offsets += [p % bs for p in range(c, c + n)]
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)  # noqa: E731
        self.key_blocks, self.key_seq, self.key_pos, self.q_seq, self.query_pos, self.blocks, self.offsets = map(
            as_t, (key_blocks, key_seq, key_pos, q_seq, query_pos, blocks, offsets))
        self.local = None if local_tables is None else (as_t(local_blocks), as_t(local_keys))
        self.last = torch.tensor(self.num_new, device=dev).cumsum(0) - 1
        self._query_pos, self._row = query_pos, self.query_pos[None]  # host copy; what positions() gives
        self.mask = None

    def positions(self, B: int, T: int) -> torch.Tensor:
        """Every sequence's new tokens end to end, each continuing from its cached length."""
        if (B, T) != (1, len(self.query_pos)):
            raise ValueError(f"a packed batch is one row [1, {len(self.query_pos)}], got [{B}, {T}]")
        return self._row

    def begin(self, positions: torch.Tensor) -> None:
        N = len(self.query_pos)
        # The row ``positions`` made is right by construction: only another one is read back.
        if tuple(positions.shape) != (1, N) or (
                positions is not self._row and positions[0].tolist() != self._query_pos):
            raise ValueError(f"positions must be one row [1, {N}] continuing each sequence from its "
                             f"cached length {self.num_cached}, got {tuple(positions.shape)}")
        # A key is visible to a query of the same sequence at or after its position.
        self.mask = (self.q_seq[:, None] == self.key_seq[None]) & (self.key_pos[None] <= self.query_pos[:, None])
        self.mask = self.mask[None, None]  # [1, 1, N, keys]
        self._windowed = None

    def positions_seen(self):
        """Each token at its own sequence's position; each key slot at its position in its sequence."""
        return self.query_pos, self.key_pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        _check_kv(self.pool, k, v, 1)
        if k.shape[2] != len(self.query_pos):
            raise ValueError(f"k, v must hold the batch's {len(self.query_pos)} tokens, got {k.shape[2]}")
        blocks, keys = (self.blocks, self.key_blocks) if self.local is None or not self.pool.is_local(layer) \
            else self.local
        self.pool.write(layer, blocks, self.offsets, k[0].transpose(0, 1), v[0].transpose(0, 1))
        return self.pool.gather(layer, keys[None])
