"""Chapter 4's code exercises: appending to a preallocated KV cache (in plain Python, which the
website grades, and on tensors) and attending over it,
graded against ``kv_cache.KVCache`` (its write and its attention mask) and the model's attention
call (``F.scaled_dot_product_attention`` with that mask and grouped-query K/V)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..code_exercises import Case, CodeExercise
from inference_internals.kv_cache import KVCache
from inference_internals.model import LlamaConfig


def _rand(seed: int, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _one_layer_cache(batch: int, kv_heads: int, max_len: int, head_dim: int, heads: int | None = None,
                     dtype=torch.float32) -> KVCache:
    cfg = LlamaConfig(num_hidden_layers=1, num_key_value_heads=kv_heads, head_dim=head_dim,
                      num_attention_heads=heads or kv_heads, max_position_embeddings=max(max_len, 1))
    return KVCache(cfg, batch, max_len, dtype=dtype)


# --- 1. Append to a preallocated cache ----------------------------------------------------------

def reference_append(buffer: torch.Tensor, length: int, new: torch.Tensor) -> torch.Tensor:
    B, H, S, D = buffer.shape
    cache = _one_layer_cache(B, H, S, D, dtype=buffer.dtype)
    cache.k, cache.v = buffer[None], torch.zeros_like(buffer)[None]  # K writes land in `buffer`
    cache.length = length
    return cache.update(0, new, torch.zeros_like(new))[0]


def _append_cases() -> list[Case]:
    def case(label, B, H, S, D, length, T, dtype=torch.float32, new_heads=None, seed=0):
        def make():
            buffer = torch.zeros(B, H, S, D, dtype=dtype)
            buffer[:, :, :length] = _rand(seed, B, H, length, D, dtype=dtype)
            return buffer, length, _rand(seed + 1, B, new_heads or H, T, D, dtype=dtype)
        shapes = (f"buffer [B={B}, H={H}, max_len={S}, D={D}] holding {length} tokens, new keys "
                  f"[{B}, {new_heads or H}, {T}, {D}]")
        return Case(label, make, inputs=shapes)
    return [
        case("prefill: 4 tokens into an empty cache", 1, 1, 6, 2, 0, 4),
        case("one decode token after 4", 1, 2, 8, 3, 4, 1, seed=2),
        case("a chunk of 3 after 2, batch of 2", 2, 2, 8, 4, 2, 3, seed=4),
        case("filling the cache exactly", 1, 1, 5, 2, 3, 2, seed=6),
        case("one token too many: an error, and the cache unchanged", 1, 1, 5, 2, 4, 2, seed=8),
        case("keys with the wrong number of heads: an error", 1, 2, 6, 2, 1, 1, new_heads=3, seed=10),
        case("keys with one head where the buffer has 2: an error, not a broadcast", 1, 2, 6, 2, 1, 1,
             new_heads=1, seed=11),
        case("bfloat16", 1, 3, 7, 4, 3, 2, dtype=torch.bfloat16, seed=12),
    ]


append_exercise = CodeExercise(
    title="Append to a preallocated KV cache",
    prompt=("A preallocated cache holds one layer's keys in `buffer` `[B, H, max_len, D]`; the first "
            "`length` positions are filled. Write the `T` new keys `new` `[B, H, T, D]` into the next "
            "positions **in place** (no new buffer: that is the point of preallocating) and return the "
            "keys stored so far, `[B, H, length + T, D]`, a view of the buffer. New keys that do not "
            "fit, or do not match the buffer's shape, must raise an error before anything is written."),
    name="cache_append",
    stub='''def cache_append(buffer, length, new):
    """Writes new [B, H, T, D] into buffer [B, H, max_len, D] after `length` stored tokens.
    Returns buffer's first length + T positions."""
    raise NotImplementedError("your code here")
''',
    solution='''def cache_append(buffer, length, new):
    B, H, max_len, D = buffer.shape
    T = new.shape[2]
    if new.dim() != 4 or (new.shape[0], new.shape[1], new.shape[3]) != (B, H, D):
        raise ValueError(f"new keys {tuple(new.shape)} do not match the buffer {tuple(buffer.shape)}")
    if length + T > max_len:
        raise ValueError(f"{length} + {T} tokens do not fit in {max_len}")
    buffer[:, :, length:length + T] = new
    return buffer[:, :, :length + T]
''',
    hint=("The token axis is dim 2: write `buffer[:, :, length:length + T] = new`, return "
          "`buffer[:, :, :length + T]`. Check the room and the shape first."),
    reference=reference_append,
    cases=_append_cases,
    observe=lambda args, result: {"returned": result, "buffer": args[0]},  # and the buffer after
)


# --- 2. Attention over the cache ------------------------------------------------------------

def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    B, Hq, T, D = q.shape
    S = k.shape[2]
    cache = _one_layer_cache(B, k.shape[1], S, D, heads=Hq)
    cache.length = S - T  # the T new queries are the last T of the S positions
    cache.begin(torch.zeros(B, T, dtype=torch.long))
    mask = cache.mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                          enable_gqa=Hq != k.shape[1])


def _attention_cases() -> list[Case]:
    def case(label, B, Hq, Hkv, T, S, D, seed=0, dtype=torch.float32):
        def make():
            return (_rand(seed, B, Hq, T, D, dtype=dtype), _rand(seed + 1, B, Hkv, S, D, dtype=dtype),
                    _rand(seed + 2, B, Hkv, S, D, dtype=dtype))
        return Case(label, make, inputs=f"q [{B}, {Hq}, {T}, {D}], k and v [{B}, {Hkv}, {S}, {D}]")
    return [
        case("one query, one key", 1, 1, 1, 1, 1, 4),
        case("prefill: 4 queries over their own 4 keys (causal)", 1, 1, 1, 4, 4, 4, seed=3),
        case("a decode step: 1 query sees all 6 keys", 1, 2, 2, 1, 6, 4, seed=6),
        case("a chunk: 3 new queries after 5 cached keys", 1, 1, 1, 3, 8, 4, seed=9),
        case("grouped-query: 6 query heads share 2 K/V heads", 1, 6, 2, 2, 5, 4, seed=12),
        case("a batch of 2, GQA, a chunk after a cache", 2, 4, 2, 3, 7, 8, seed=15),
        case("SmolLM2's heads: 9 query, 3 K/V, head_dim 64", 1, 9, 3, 2, 6, 64, seed=18),
        case("float64", 1, 2, 1, 2, 4, 4, seed=21, dtype=torch.float64),
    ]


attention_exercise = CodeExercise(
    title="Attention over the cache",
    prompt=("`k` and `v` `[B, Hkv, S, D]` hold every position so far, cached ones first; `q` "
            "`[B, Hq, T, D]` are the queries of the **last** `T` positions (T = S at prefill, 1 at a "
            "decode step, in between for a chunk). Query `i` may attend to keys `0 … S − T + i`. With "
            "grouped-query attention `Hq` is a multiple of `Hkv`: query heads `h·n_rep … (h+1)·n_rep − 1` "
            "share K/V head `h`. Scores are scaled by $1/\\sqrt{D}$. Return `[B, Hq, T, D]`."),
    name="cached_attention",
    stub='''def cached_attention(q, k, v):
    """q: [B, Hq, T, D]; k, v: [B, Hkv, S, D] with S >= T. Returns [B, Hq, T, D]."""
    raise NotImplementedError("your code here")
''',
    solution='''import math
import torch

def cached_attention(q, k, v):
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)            # [B, Hq, T, S]
    query_pos = torch.arange(T)[:, None] + (S - T)
    visible = torch.arange(S)[None, :] <= query_pos            # [T, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1) @ v
''',
    hint=("Repeat each K/V head n_rep times with `repeat_interleave(n_rep, dim=1)` (not `repeat`). "
          "Query i sits at position S − T + i: mask keys at later positions, then softmax over keys."),
    reference=reference_attention,
    cases=_attention_cases,
)


# --- 3. Append keys to a preallocated cache of lists (plain Python: the website grades it) ------

def reference_append_keys(slots: list, length: int, new: list) -> int:
    """``KVCache.update`` on one head: the slots as its buffer, `new` as the keys it writes. What it
    stores is copied back into `slots` only when it accepted the keys (it raises before writing)."""
    width = len(slots[0]) if length else len(new[0]) if new else 1
    cache = _one_layer_cache(1, 1, len(slots), width, dtype=torch.float64)
    if length:
        cache.k[0, 0, 0, :length] = torch.tensor(slots[:length], dtype=torch.float64)
    cache.length = length
    # a key of another width reaches the library's shape check (ragged keys stop in torch.tensor)
    keys = torch.tensor(new, dtype=torch.float64).reshape(1, 1, len(new), -1 if new else width)
    stored = cache.update(0, keys, torch.zeros_like(keys))[0][0, 0].tolist()
    slots[:len(stored)] = stored
    return len(stored)


def observe_slots(args, result):
    """What a case compares: the answer, and the slots after the call (filled in place)."""
    return {"returned": result, "slots": args[0]}


def _append_keys_cases() -> list[Case]:
    def case(label, max_len, stored, new):
        def make():
            slots = [list(r) for r in stored] + [None] * (max_len - len(stored))
            return slots, len(stored), [list(r) for r in new]
        slots = [list(r) for r in stored] + [None] * (max_len - len(stored))
        return Case(label, make, inputs=f"slots={slots}, length={len(stored)}, new={new}")
    return [
        case("prefill: 3 keys into an empty cache", 5, [], [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0]]),
        case("one decode key after 3", 5, [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0]], [[-1.0, 4.0]]),
        case("a chunk of 2 after 2", 6, [[1.0, 0.0, 2.0], [0.0, 1.0, 3.0]], [[4.0, 4.0, 4.0], [5.0, 5.0, 5.0]]),
        case("filling the cache exactly", 4, [[1.0], [2.0]], [[3.0], [4.0]]),
        case("one key too many: an error, and the cache unchanged", 4, [[1.0], [2.0], [3.0]], [[4.0], [5.0]]),
        case("a full cache: an error", 2, [[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]),
        case("keys wider than the stored ones: an error", 5, [[1.0, 2.0]], [[3.0, 4.0, 5.0]]),
        case("a second key of another width: an error, nothing written", 5, [[1.0, 2.0]],
             [[3.0, 4.0], [5.0, 6.0, 7.0]]),
        case("no new keys: nothing changes", 3, [[1.0, 2.0]], []),
    ]


append_keys_exercise = CodeExercise(
    title="Append keys to a preallocated cache, in plain Python",
    prompt=("The chapter's preallocated cache, for one head and without tensors: `slots` is a list of "
            "`max_len` slots, the first `length` holding a key (a list of D numbers), the rest `None`. "
            "Write the keys of `new` into the next slots **in place** (the list the caller holds is the "
            "cache: no new list) and return the number of keys stored now. Keys that do not fit, or a key "
            "whose width is not D (the stored keys' width, or the first new key's in an empty cache), "
            "must raise an error **before anything is written**."),
    name="append_keys",
    stub='''def append_keys(slots, length, new):
    """Writes the rows of `new` into slots[length:], in place. Returns length + len(new)."""
    raise NotImplementedError("your code here")
''',
    solution='''def append_keys(slots, length, new):
    width = len(slots[0]) if length else len(new[0]) if new else 0
    if length + len(new) > len(slots):
        raise ValueError(f"{length} + {len(new)} keys do not fit in {len(slots)} slots")
    if any(len(key) != width for key in new):
        raise ValueError(f"every key must have {width} numbers")
    for i, key in enumerate(new):
        slots[length + i] = list(key)
    return length + len(new)
''',
    hint=("Check both rules first (room: length + len(new) ≤ len(slots); every new key as wide as the "
          "stored ones), then assign `slots[length + i] = key`: assigning to an index changes the "
          "caller's list, while `slots = slots + new` only rebinds your name."),
    reference=reference_append_keys,
    cases=_append_keys_cases,
    observe=observe_slots,
)

CODE_EXERCISES = [append_keys_exercise, append_exercise, attention_exercise]
