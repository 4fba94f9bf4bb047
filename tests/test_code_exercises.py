"""Code exercises: every grader accepts the library's function and the solution, calls the stub
"not implemented yet", and rejects planted wrong versions with a message naming the failing case.
The notebooks hold every exercise's stub cell."""
import ast
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference_course.chapter_exercises import (ch01_code, ch02_code, ch03_code, ch04_code, ch05_code,
                                                   ch06_code, ch07_code)
from inference_course import browser_grading
from inference_course.code_exercises import (BROWSER_CLASS, BROWSER_RERUN, JUPYTER_ONLY_CLASS, NOT_IMPLEMENTED, Case,
                                             CodeExercise, differ)

CHAPTERS = {1: ch01_code, 2: ch02_code, 3: ch03_code, 4: ch04_code, 5: ch05_code, 6: ch06_code, 7: ch07_code}
ALL = [ex for module in CHAPTERS.values() for ex in module.CODE_EXERCISES]
ROOT = Path(__file__).resolve().parents[1]


def define(source: str, name: str):
    namespace: dict = {}
    exec(source, namespace)
    return namespace[name]


def planted(ex, *edits) -> str:
    """The exercise's solution with one bug planted: each (old, new) replaces a piece of it."""
    source = ex.solution
    for old, new in edits:
        assert source.count(old) == 1, f"{ex.name}: {old!r} is not once in the solution"
        source = source.replace(old, new)
    return source


c1, c2, c3, c4, c5, c6, c7 = ch01_code, ch02_code, ch03_code, ch04_code, ch05_code, ch06_code, ch07_code
ROTATE = "    x1, x2 = x[..., :D // 2], x[..., D // 2:]\n    rotated = torch.cat([-x2, x1], dim=-1)\n"
MERGE = "            if i + 1 < len(word) and (word[i], word[i + 1]) == pair:\n"
TAKE_RELEASE = "    dst = pool.take()                             # first: it raises when none is free\n    pool.release(src)\n"
BEST = "            if joined in scores and (best is None or scores[joined] > scores[pieces[best] + pieces[best + 1]]):\n"
GREEDY_LOOP = "    while n < len(drafted) and drafted[n] == target_choice[n]:\n"
# Each wrong version: (exercise, what is wrong, its source, the case that must catch it).
WRONG = [
    # --- chapter 1: causal attention over lists
    (c1.causal_attention_exercise, "no causal mask: every token sees every key",
     planted(c1.causal_attention_exercise, ("for j in range(i + 1)]", "for j in range(len(k))]")),
     "equal scores: each token averages what it sees"),
    (c1.causal_attention_exercise, "the mask off by one: a token does not see itself",
     planted(c1.causal_attention_exercise, ("for j in range(i + 1)]", "for j in range(i)]"),
             ("        top = max(scores)\n", "        if not scores:   # nothing to see\n            out.append([0.0] * len(v[0]))\n            continue\n        top = max(scores)\n")),
     "one token: it can only read its own value"),
    (c1.causal_attention_exercise, "scales by 1/D",
     planted(c1.causal_attention_exercise, ("/ math.sqrt(D)", "/ D")), "causal: token 0 ignores the key that would win"),
    (c1.causal_attention_exercise, "no scaling",
     planted(c1.causal_attention_exercise, ("/ math.sqrt(D)", "")), "causal: token 0 ignores the key that would win"),
    (c1.causal_attention_exercise, "exp of the raw scores (overflows)",
     planted(c1.causal_attention_exercise, ("math.exp(s - top)", "math.exp(s)")),
     "large scores (900): a softmax that cannot overflow"),
    (c1.causal_attention_exercise, "forgets to divide by the sum of the weights",
     planted(c1.causal_attention_exercise, (") / total for d", ") for d")),
     "equal scores: each token averages what it sees"),
    (c1.causal_attention_exercise, "averages the keys, not the values",
     planted(c1.causal_attention_exercise, ("w * v[j][d]", "w * k[j][d]")),
     "one token: it can only read its own value"),
    # --- chapter 1: RMSNorm
    (c1.rms_norm_exercise, "normalises over the first axis (wrong axis)",
     planted(c1.rms_norm_exercise, ("mean(dim=-1", "mean(dim=0")), "3 rows of 8 (normalise each row)"),
    (c1.rms_norm_exercise, "eps outside the square root",
     planted(c1.rms_norm_exercise, ("torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)",
                                    "1 / (x32.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)")),
     "tiny values, where eps matters"),
    (c1.rms_norm_exercise, "returns float32 for a 16-bit input (wrong dtype)",
     planted(c1.rms_norm_exercise, ("weight * normed.to(x.dtype)", "weight.float() * normed")),
     "bfloat16 in, bfloat16 out"),
    (c1.rms_norm_exercise, "forgets the square (mean of x)",
     planted(c1.rms_norm_exercise, ("x32.pow(2).mean", "x32.mean")), "one vector of 6 features"),
    (c1.rms_norm_exercise, "forgets the weight",
     planted(c1.rms_norm_exercise, ("return weight * normed.to(x.dtype)", "return normed.to(x.dtype)")),
     "one vector of 6 features"),
    (c1.rms_norm_exercise, "normalises in x's dtype (a 16-bit sum of squares overflows)",
     planted(c1.rms_norm_exercise, ("x32 = x.float()", "x32 = x")), "float16, large values"),
    # --- chapter 1: RoPE
    (c1.rope_exercise, "rotates neighbouring pairs, not halves",
     planted(c1.rope_exercise, ("cos().repeat(1, 1, 2)", "cos().repeat_interleave(2, dim=-1)"),
             ("sin().repeat(1, 1, 2)", "sin().repeat_interleave(2, dim=-1)"),
             (ROTATE, "    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)\n")),
     "head_dim 8, positions 0..3"),
    (c1.rope_exercise, "frequencies θ^(−i/D): the exponent off by a factor 2",
     planted(c1.rope_exercise, ("torch.arange(0, D, 2, dtype=torch.float32)", "torch.arange(0, D // 2, dtype=torch.float32)")),
     "head_dim 8, positions 0..3"),
    (c1.rope_exercise, "rotates the wrong way (the sign of rotate_half)",
     planted(c1.rope_exercise, ("torch.cat([-x2, x1]", "torch.cat([x2, -x1]")), "one head, head_dim 2, positions 0..2"),
    (c1.rope_exercise, "ignores the positions (counts 0 … T−1)",
     planted(c1.rope_exercise, ("positions.float()[..., None]", "torch.arange(x.shape[2]).float()[None, :, None]")),
     "a decode step at position 17"),
    (c1.rope_exercise, "ignores theta (always 10000)",
     planted(c1.rope_exercise, ("inv_freq = theta **", "inv_freq = 10000.0 **")),
     "theta 100000 (SmolLM2's), position 1000"),
    (c1.rope_exercise, "returns float32 for a bfloat16 x",
     planted(c1.rope_exercise, ("cos().repeat(1, 1, 2).to(x.dtype)", "cos().repeat(1, 1, 2)"),
             ("sin().repeat(1, 1, 2).to(x.dtype)", "sin().repeat(1, 1, 2)")),
     "bfloat16 stays bfloat16"),
    # --- chapter 2: BPE
    (c2.bpe_exercise, "merges the leftmost known pair, not the lowest rank",
     planted(c2.bpe_exercise, ('pair = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))',
                               'pair = next((p for p in zip(word, word[1:]) if p in ranks), None)')),
     "the lowest rank first, wherever it is"),
    (c2.bpe_exercise, "steps by 1 after a merge (off by one: the pair's right symbol stays too)",
     planted(c2.bpe_exercise, ("                i += 2\n", "                i += 1\n")), "one merge"),
    (c2.bpe_exercise, "only one merge pass",
     planted(c2.bpe_exercise, ("        word = merged\n", "        return merged\n")),
     "merges chain into longer symbols"),
    (c2.bpe_exercise, "misses a pair at the end of the word (off by one)",
     planted(c2.bpe_exercise, (MERGE, MERGE.replace("i + 1 <", "i + 2 <")),
             ("        word = merged\n", "        if merged == word:\n            break\n        word = merged\n")),
     "one merge"),
    (c2.bpe_exercise, "merges right to left", """
def merge_word(symbols, ranks):
    word = list(symbols)
    while len(word) > 1:
        pair = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        merged, i = [], len(word) - 1
        while i >= 0:
            if i >= 1 and (word[i - 1], word[i]) == pair:
                merged.insert(0, word[i - 1] + word[i])
                i -= 2
            else:
                merged.insert(0, word[i])
                i -= 1
        word = merged
    return word
""", "aaa with (a, a): left to right, no overlap"),
    # ("merge every occurrence" has no wrong version: merging the first one and looping again
    # merges the next one in the next pass, with the same result.)
    (c2.bpe_exercise, "merges a pair that is not a learned merge",
     planted(c2.bpe_exercise, ("        if pair not in ranks:\n            break\n", "")),
     "no known pair: nothing merges"),
    # --- chapter 2: top-p
    (c2.top_p_exercise, "drops the token that crosses p (off by one)",
     planted(c2.top_p_exercise, ("drop_sorted = mass_before >= p", "drop_sorted = sorted_probs.cumsum(dim=-1) > p")),
     "8 logits, p = 0.9"),
    (c2.top_p_exercise, "keeps nothing at p = 0 (the top token not protected)",
     planted(c2.top_p_exercise, ("    drop_sorted[..., 0] = False              # the top token always stays\n", "")),
     "p = 0 keeps the top token"),
    (c2.top_p_exercise, "softmax over the batch axis (wrong axis)",
     planted(c2.top_p_exercise, ("logits.softmax(dim=-1)", "logits.softmax(dim=0)")),
     "a batch of 3 rows, each its own nucleus"),
    (c2.top_p_exercise, "masks in sorted order (no scatter back)",
     planted(c2.top_p_exercise, ("drop = drop_sorted.scatter(-1, order, drop_sorted)", "drop = drop_sorted")),
     "8 logits, p = 0.9"),
    (c2.top_p_exercise, "returns float32 for float64 logits",
     planted(c2.top_p_exercise, ("return logits.masked_fill", "return logits.float().masked_fill")),
     "float64 in, float64 out"),
    (c2.top_p_exercise, "returns log-probabilities, not the kept logits",
     planted(c2.top_p_exercise, ("return logits.masked_fill", "return logits.log_softmax(dim=-1).masked_fill")),
     "8 logits, p = 0.9"),
    # --- chapter 3: intensity
    (c3.intensity_exercise, "one FLOP per multiply-add",
     planted(c3.intensity_exercise, ("flops = 2 * m * k * n", "flops = m * k * n")), "decode: one row, fp32"),
    (c3.intensity_exercise, "reads the weights once per row",
     planted(c3.intensity_exercise, ("weight_bytes * k * n", "weight_bytes * m * k * n")),
     "a square 1024 x 1024 matmul, 8 rows, bf16"),
    (c3.intensity_exercise, "weights at the activations' byte width (wrong dtype)",
     planted(c3.intensity_exercise, ("weight_bytes * k * n", "act_bytes * k * n")), "bf16 weights, fp32 activations"),
    (c3.intensity_exercise, "forgets the output rows",
     planted(c3.intensity_exercise, ("act_bytes * m * (k + n)", "act_bytes * m * k")), "decode: one row, fp32"),
    (c3.intensity_exercise, "forgets the input rows",
     planted(c3.intensity_exercise, ("act_bytes * m * (k + n)", "act_bytes * m * n")), "decode: one row, fp32"),
    # --- chapter 3: decode step time
    (c3.step_time_exercise, "adds memory and compute time",
     planted(c3.step_time_exercise, ("max(memory, compute)", "memory + compute")), "SmolLM2 on an H100, batch 1, bf16"),
    (c3.step_time_exercise, "compute ignores the batch",
     planted(c3.step_time_exercise, ("2 * n_params * batch", "2 * n_params")), "batch 1024: compute-bound"),
    (c3.step_time_exercise, "leaves out the KV cache",
     planted(c3.step_time_exercise, (" + kv_bytes)", ")")), "the KV cache is read too"),
    (c3.step_time_exercise, "reads the weights once per sequence",
     planted(c3.step_time_exercise, ("(n_params * bytes_per_param", "(batch * n_params * bytes_per_param")),
     "batch 64: still memory-bound"),
    (c3.step_time_exercise, "ignores bytes_per_param (2 bytes a weight)",
     planted(c3.step_time_exercise, ("(n_params * bytes_per_param", "(n_params * 2")),
     "fp32 weights take twice the bytes"),
    # --- chapter 4: keys appended to a list
    (c4.append_keys_exercise, "builds a new list instead of filling the caller's",
     planted(c4.append_keys_exercise, ("    for i, key in enumerate(new):\n        slots[length + i] = list(key)\n",
                                       "    slots = slots[:length] + [list(key) for key in new]\n")),
     "prefill: 3 keys into an empty cache"),
    (c4.append_keys_exercise, "returns the number of new keys, not the number stored",
     planted(c4.append_keys_exercise, ("return length + len(new)", "return len(new)")), "one decode key after 3"),
    (c4.append_keys_exercise, "no room check: writes what fits, then fails",
     planted(c4.append_keys_exercise, ("    if length + len(new) > len(slots):\n        raise ValueError(f\"{length} + {len(new)} keys do not fit in {len(slots)} slots\")\n", "")),
     "one key too many: an error, and the cache unchanged"),
    (c4.append_keys_exercise, "no width check",
     planted(c4.append_keys_exercise, ("    if any(len(key) != width for key in new):\n        raise ValueError(f\"every key must have {width} numbers\")\n", "")),
     "keys wider than the stored ones: an error"),
    (c4.append_keys_exercise, "checks the new keys against the first new one, not the stored ones",
     planted(c4.append_keys_exercise, ("width = len(slots[0]) if length else len(new[0]) if new else 0",
                                       "width = len(new[0]) if new else 0")),
     "keys wider than the stored ones: an error"),
    (c4.append_keys_exercise, "checks each key as it writes it: a bad second key leaves the first written",
     planted(c4.append_keys_exercise, ("    if any(len(key) != width for key in new):\n        raise ValueError(f\"every key must have {width} numbers\")\n", ""),
             ("        slots[length + i] = list(key)\n", "        if len(key) != width:\n            raise ValueError(\"wrong width\")\n        slots[length + i] = list(key)\n")),
     "a second key of another width: an error, nothing written"),
    # --- chapter 4: cache append
    (c4.append_exercise, "returns only the new keys",
     planted(c4.append_exercise, ("return buffer[:, :, :length + T]", "return buffer[:, :, length:length + T]")),
     "one decode token after 4"),
    (c4.append_exercise, "concatenates instead of writing into the buffer",
     planted(c4.append_exercise, ("    buffer[:, :, length:length + T] = new\n    return buffer[:, :, :length + T]",
                                  "    return torch.cat([buffer[:, :, :length], new], dim=2)"),
             ("def cache_append", "import torch\n\ndef cache_append")),
     "prefill: 4 tokens into an empty cache"),
    (c4.append_exercise, "writes one position too far (off by one)",
     planted(c4.append_exercise, ("buffer[:, :, length:length + T] = new", "buffer[:, :, length + 1:length + 1 + T] = new[:, :, :max_len - length - 1]")),
     "prefill: 4 tokens into an empty cache"),
    (c4.append_exercise, "writes what fits of an append that overflows, then raises",
     planted(c4.append_exercise, ("    if length + T > max_len:\n", "    buffer[:, :, length:length + T] = new[:, :, :max_len - length]\n    if length + T > max_len:\n")),
     "one token too many: an error, and the cache unchanged"),
    (c4.append_exercise, "no shape check: keys of one head broadcast over two",
     planted(c4.append_exercise, ("    if new.dim() != 4 or (new.shape[0], new.shape[1], new.shape[3]) != (B, H, D):\n", "    if False:\n")),
     "keys with one head where the buffer has 2: an error, not a broadcast"),
    # --- chapter 4: attention over the cache
    (c4.attention_exercise, "no causal mask",
     planted(c4.attention_exercise, ('    scores = scores.masked_fill(~visible, float("-inf"))\n', "")),
     "prefill: 4 queries over their own 4 keys (causal)"),
    (c4.attention_exercise, "the mask starts at key 0, not after the cache (off by the cache length)",
     planted(c4.attention_exercise, ("torch.arange(T)[:, None] + (S - T)", "torch.arange(T)[:, None]")),
     "a decode step: 1 query sees all 6 keys"),
    (c4.attention_exercise, "tiles the K/V heads (repeat) instead of grouping them (wrong axis order)",
     planted(c4.attention_exercise, ("k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)",
                                     "k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)")),
     "grouped-query: 6 query heads share 2 K/V heads"),
    (c4.attention_exercise, "scales by 1/D",
     planted(c4.attention_exercise, ("/ math.sqrt(D)", "/ D")), "prefill: 4 queries over their own 4 keys (causal)"),
    (c4.attention_exercise, "softmax over the queries (wrong axis)",
     planted(c4.attention_exercise, ("scores.softmax(dim=-1) @ v", "scores.softmax(dim=-2) @ v")),
     "prefill: 4 queries over their own 4 keys (causal)"),
    # --- chapter 5: block hashes
    (c5.block_hash_exercise, "hashes the partial last block too",
     planted(c5.block_hash_exercise, ("len(token_ids) - block_size + 1", "len(token_ids)")),
     "fewer tokens than a block: no full block"),
    (c5.block_hash_exercise, "does not chain: each block hashed alone",
     planted(c5.block_hash_exercise, ("token_ids[start:start + block_size], prefix)", "token_ids[start:start + block_size])")),
     "two full blocks and a partial one"),
    (c5.block_hash_exercise, "drops the last full block (off by one)",
     planted(c5.block_hash_exercise, ("len(token_ids) - block_size + 1", "len(token_ids) - block_size")),
     "exactly one block"),
    (c5.block_hash_exercise, "chains every block to the first block's hash",
     planted(c5.block_hash_exercise, ("        hashes.append(prefix)\n", "        hashes.append(prefix)\n        prefix = hashes[0]\n")),
     "exactly three blocks"),
    (c5.block_hash_exercise, "the first block chained to 0, not to None",
     planted(c5.block_hash_exercise, ("hashes, prefix = [], None", "hashes, prefix = [], 0")), "exactly one block"),
    # --- chapter 5: append_slot
    (c5.append_slot_exercise, "no copy-on-write: writes into the shared block",
     planted(c5.append_slot_exercise, ("if pool.blocks[src].ref_count == 1:", "if True:")),
     "after a fork, the shared partial block is copied"),
    (c5.append_slot_exercise, "copies but never releases the shared block",
     planted(c5.append_slot_exercise, ("    pool.release(src)\n", "")),
     "after a fork, the shared partial block is copied"),
    (c5.append_slot_exercise, "indexes the block by len(seq), not by the stored tokens (off by one)",
     planted(c5.append_slot_exercise, ("i = seq.num_cached // pool.block_size", "i = len(seq) // pool.block_size")),
     "the next slot is the last one of its block"),
    (c5.append_slot_exercise, "releases before taking: a full pool is left changed",
     planted(c5.append_slot_exercise, (TAKE_RELEASE, "    pool.release(src)\n    dst = pool.take()\n")),
     "a copy with no free block: an error, nothing changed"),
    (c5.append_slot_exercise, "does not count the copy",
     planted(c5.append_slot_exercise, ("    pool.copies += 1\n", "")),
     "after a fork, the shared partial block is copied"),
    (c5.append_slot_exercise, "never takes a block when the slot is past the table",
     planted(c5.append_slot_exercise, ("        seq.block_table.append(pool.take())\n", "")),
     "a full block: the next token needs a new block"),
    (c5.append_slot_exercise, "copies but leaves the shared block in the table",
     planted(c5.append_slot_exercise, ("    seq.block_table[i] = dst\n", "")),
     "after a fork, the shared partial block is copied"),
    (c5.append_slot_exercise, "returns (dst, src)",
     planted(c5.append_slot_exercise, ("    return src, dst\n", "    return dst, src\n")),
     "after a fork, the shared partial block is copied"),
    # --- chapter 6: greedy acceptance
    (c6.greedy_exercise, "counts every match, not the matching prefix",
     planted(c6.greedy_exercise, (GREEDY_LOOP + "        n += 1\n",
                                  "    n = sum(d == t for d, t in zip(drafted, target_choice))\n")),
     "the first guess is wrong"),
    (c6.greedy_exercise, "returns the rejected guess instead of the target's correction",
     planted(c6.greedy_exercise, ("return n, target_choice[n]", "return n, drafted[n] if n < len(drafted) else target_choice[n]")),
     "the first guess is wrong"),
    (c6.greedy_exercise, "never rejects at position 0 (starts counting at 1)",
     planted(c6.greedy_exercise, ("    n = 0\n", "    n = min(1, len(drafted))\n")), "the first guess is wrong"),
    (c6.greedy_exercise, "no bonus: when all match, returns the last guess",
     planted(c6.greedy_exercise, ("return n, target_choice[n]", "return n, target_choice[n] if n < len(drafted) else drafted[-1]")),
     "all 3 guesses right: a bonus token"),
    (c6.greedy_exercise, "accepts target_choice of any length",
     planted(c6.greedy_exercise, ("    if len(target_choice) != len(drafted) + 1:\n", "    if False:\n"),
             ("while n < len(drafted) and", "while n < min(len(drafted), len(target_choice) - 1) and")),
     "target_choice one token short: an error"),
    (c6.greedy_exercise, "never checks the lengths",
     planted(c6.greedy_exercise, ("    if len(target_choice) != len(drafted) + 1:\n        raise ValueError(f\"need {len(drafted) + 1} target tokens, got {len(target_choice)}\")\n", "")),
     "target_choice one token long: an error"),
    (c6.greedy_exercise, "checks only that target_choice is not too short",
     planted(c6.greedy_exercise, ("if len(target_choice) != len(drafted) + 1:", "if len(target_choice) < len(drafted) + 1:")),
     "target_choice one token long: an error"),
    # --- chapter 6: rejection sampling
    (c6.rejection_exercise, "accepts with probability q/p (the ratio upside down)",
     planted(c6.rejection_exercise, ("if u * qi[x] < p[i, x]:", "if u * p[i, x] < qi[x]:")), "random γ = 4, seed 0"),
    (c6.rejection_exercise, "resamples from p, not from the residual",
     planted(c6.rejection_exercise, ("draw(residual / residual.sum(), generator)", "draw(p[i], generator)")),
     "random γ = 4, seed 2"),
    (c6.rejection_exercise, "cannot take a deterministic draft (q = None)",
     planted(c6.rejection_exercise, ("q[i] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[1]).to(p.dtype)", "q[i]")),
     "a deterministic draft (q = None)"),
    (c6.rejection_exercise, "the bonus drawn from the last guess's row (off by one)",
     planted(c6.rejection_exercise, ("draw(p[-1], generator)", "draw(p[len(drafted) - 1], generator)")),
     "p = q: every guess is accepted, then a bonus"),
    (c6.rejection_exercise, "draws u in float32 whatever p's dtype",
     planted(c6.rejection_exercise, ("u = torch.rand((), generator=generator, dtype=p.dtype)", "u = torch.rand((), generator=generator)")),
     "random γ = 4, seed 0"),
    (c6.rejection_exercise, "a residual not clamped at 0",
     planted(c6.rejection_exercise, ("residual = (p[i] - qi).clamp_min(0)", "residual = (p[i] - qi).abs()")),
     "random γ = 4, seed 1"),
    # --- chapter 7: SentencePiece's merge by scores
    (c7.merge_exercise, "joins the lowest score first",
     planted(c7.merge_exercise, ("scores[joined] > scores", "scores[joined] < scores")), "the higher score joins first"),
    (c7.merge_exercise, "a tie goes to the rightmost pair",
     planted(c7.merge_exercise, ("scores[joined] > scores", "scores[joined] >= scores")), "a tie: the leftmost pair joins"),
    (c7.merge_exercise, "joins every copy of the best pair at once (chapter 2's rule)",
     planted(c7.merge_exercise, ("        pieces[best:best + 2] = [pieces[best] + pieces[best + 1]]\n",
                                 "        pair, out, i = (pieces[best], pieces[best + 1]), [], 0\n"
                                 "        while i < len(pieces):\n"
                                 "            if i + 1 < len(pieces) and (pieces[i], pieces[i + 1]) == pair:\n"
                                 "                out.append(pieces[i] + pieces[i + 1])\n"
                                 "                i += 2\n"
                                 "            else:\n"
                                 "                out.append(pieces[i])\n"
                                 "                i += 1\n"
                                 "        pieces = out\n")),
     "a new pair outscores the rest of the old one"),
    (c7.merge_exercise, "stops after one merge",
     planted(c7.merge_exercise, ("        pieces[best:best + 2] = [pieces[best] + pieces[best + 1]]\n",
                                 "        pieces[best:best + 2] = [pieces[best] + pieces[best + 1]]\n        return pieces\n")),
     "a joined piece joins again"),
    (c7.merge_exercise, "never looks at the last pair (off by one)",
     planted(c7.merge_exercise, ("for i in range(len(pieces) - 1):", "for i in range(len(pieces) - 2):")), "one pair joins"),
    (c7.merge_exercise, "ranks a pair by its two pieces' scores, not its joined piece's",
     planted(c7.merge_exercise, (BEST, "            if joined in scores and (best is None or scores[pieces[i]] + scores[pieces[i + 1]] > "
                                       "scores[pieces[best]] + scores[pieces[best + 1]]):\n")),
     "the higher score joins first"),
    # --- chapter 7: a local layer's ring
    (c7.ring_exercise, "no wrap: slot = position",
     planted(c7.ring_exercise, ("ring[(length + i) % R] = list(key)", "ring[length + i] = list(key)")),
     "one past the window: position 4 overwrites position 0"),
    (c7.ring_exercise, "returns the slots in slot order, not position order",
     planted(c7.ring_exercise, ("    return [ring[p % R] for p in range(max(0, end - R), end)]",
                                "    return [k for k in ring if k is not None]")),
     "one past the window: position 4 overwrites position 0"),
    (c7.ring_exercise, "returns R keys even before the ring is full",
     planted(c7.ring_exercise, ("range(max(0, end - R), end)", "range(end - R, end)")),
     "the first keys into an empty ring"),
    (c7.ring_exercise, "returns one key too few (off by one)",
     planted(c7.ring_exercise, ("range(max(0, end - R), end)", "range(max(0, end - R + 1), end)")),
     "filling the ring exactly"),
    (c7.ring_exercise, "writes a copy, not the caller's ring",
     planted(c7.ring_exercise, ("    R = len(ring)\n", "    ring = list(ring)\n    R = len(ring)\n")),
     "the first keys into an empty ring"),
    (c7.ring_exercise, "writes only the first R of many new keys",
     planted(c7.ring_exercise, ("for i, key in enumerate(new):", "for i, key in enumerate(new[:R]):")),
     "more new keys than slots: only the newest stay"),
]


def test_every_chapter_has_two_code_exercises():
    assert all(len(module.CODE_EXERCISES) >= 2 for module in CHAPTERS.values())
    assert len({ex.name for ex in ALL}) == len(ALL) >= 12


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_grader_accepts_the_library_and_the_solution(ex):
    for fn in (ex.reference, ex.solution_function()):
        verdict = ex.grade(fn)
        assert verdict.correct, verdict.message
        assert verdict.message.startswith("Correct")


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_stub_is_not_implemented_yet(ex):
    verdict = ex.grade(ex.stub_function())
    assert not verdict.correct and verdict.message.startswith(NOT_IMPLEMENTED)
    assert "raise NotImplementedError" in ex.stub


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_cases_are_seeded(ex):
    """Two runs build the same inputs: a reader's verdict does not change between runs."""
    first, second = ex.cases(), ex.cases()
    assert [c.label for c in first] == [c.label for c in second]
    assert len(first) >= 5 and len({c.label for c in first}) == len(first)
    for a, b in zip(first, second):
        assert a.inputs == b.inputs
        if ex.observe is None:  # plain values (a pool and its sequences are described by `inputs`)
            plain = [[x for x in case.make() if not isinstance(x, torch.Generator)] for case in (a, b)]
            assert differ(*plain) is None


def test_a_wrong_version_per_stated_rule():
    """Each exercise's prompt states its rules (axis, scale, mask, in place, errors before writing,
    lengths...); WRONG above breaks each one in turn, at least five per exercise."""
    counts = {ex.name: 0 for ex in ALL}
    for ex, *_ in WRONG:
        counts[ex.name] += 1
    assert min(counts.values()) >= 5, counts


@pytest.mark.parametrize("ex, what, source, case", WRONG, ids=[f"{w[0].name}: {w[1]}" for w in WRONG])
def test_grader_rejects_a_wrong_version(ex, what, source, case):
    verdict = ex.grade(define(source, ex.name))
    assert not verdict.correct, f"{what}: passed"
    assert f"Case “{case}” failed" in verdict.message, verdict.message
    assert "Inputs: " in verdict.message and verdict.message.endswith(f"Hint: {ex.hint}")
    assert "Expected" in verdict.message


# --- the framework -------------------------------------------------------------------------------

def _toy(**kw) -> CodeExercise:
    args = dict(title="Double", prompt="Return 2·x.", name="double", stub="def double(x):\n    raise NotImplementedError\n",
                solution="def double(x):\n    return 2 * x\n", hint="Multiply by two.", reference=lambda x: 2 * x,
                cases=lambda: [Case("one", lambda: (1,)), Case("a tensor", lambda: (torch.arange(3.0),))])
    return _toy_cls(**{**args, **kw})


_toy_cls = CodeExercise


def test_messages_name_the_case_inputs_expected_and_returned():
    ex = _toy()
    assert ex.grade(lambda x: 2 * x).correct
    wrong = ex.grade(lambda x: x + 1)
    assert wrong.message.startswith("Case “a tensor” failed. Inputs: x=tensor(shape=[3], dtype=float32, values=[0.0, 1.0, 2.0]).")
    assert "2 of 3 values differ; the first at [0]: expected 0, got 1" in wrong.message
    raised = ex.grade(lambda x: x.foo)
    assert "Case “one” failed" in raised.message and "it raised AttributeError" in raised.message
    assert "Expected a function" in ex.grade(42).message


def test_a_stub_that_raises_later_is_still_not_implemented():
    ex = _toy()
    def half_done(x):
        if isinstance(x, int):
            return 2 * x
        raise NotImplementedError("tensors next")
    assert ex.grade(half_done).message.startswith(NOT_IMPLEMENTED)


@pytest.mark.parametrize("expected, got, message", [
    (torch.zeros(2), torch.zeros(3), "expected shape [2], got [3]"),
    (torch.zeros(2), torch.zeros(2, dtype=torch.float64), "expected dtype torch.float32, got torch.float64"),
    (torch.tensor([float("-inf"), 1.0]), torch.tensor([0.0, 1.0]), "expected -inf, got 0"),
    ([1, 2], [1, 3], "at item 1"),
    ((1, [2, 3]), (1, [2, 3, 4]), "expected 2 items at item 1"),
    (3, 3.5, "expected 3, got 3.5"),
    (None, (1, 2), "expected None, got (1, 2)"),
    (1, True, "expected 1, got True"),
])
def test_differ_says_what_differs(expected, got, message):
    assert message in differ(expected, got)


def test_differ_accepts_equal_values():
    assert differ(torch.tensor([1.0, float("-inf")]), torch.tensor([1.0 + 1e-7, float("-inf")])) is None
    assert differ((None, [1, 2], 0.5), (None, [1, 2], 0.5)) is None


def test_declaration_is_checked():
    with pytest.raises(ValueError, match="define double"):
        _toy(stub="def other(x):\n    raise NotImplementedError\n")
    with pytest.raises(ValueError, match="hint"):
        _toy(hint=" ")


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_page_shows_prompt_hint_solution_and_the_website_grader_or_note(ex):
    page = ex._static_html()
    assert 'class="exercise code-exercise"' in page and "Code exercise:" in page
    assert '<details class="exercise-hint">' in page and '<details class="exercise-solution">' in page
    assert f"def {ex.name}(" in page  # the solution's code, behind its toggle
    # Jupyter's way to answer: the notebook's cell below (the website's stylesheet hides it)
    assert f'<p class="{JUPYTER_ONLY_CLASS}">Write <code>{ex.name}</code> in the cell below and run it' in page
    if ex.name in BROWSER_GRADED:   # an editor holding the stub, and the export the page grades with
        assert f'<div class="{BROWSER_CLASS}" hidden data-export="' in page and 'class="exercise-needs-jupyter"' not in page
        assert f"{html.escape(ex.stub)}</textarea>" in page
        assert json.loads(html.unescape(re.search(r'data-export="([^"]*)"', page)[1])) == ex.browser_export()
        grader = page.split('data-export="', 1)[1].split('">', 1)[1].split("</textarea>")[0]   # what it shows
        assert "in the box below and press <strong>Check</strong>" in grader and "cell" not in grader
        assert '<details class="exercise-stub"' not in page
    else:   # the website's note says where it is graded; the stub is folded beside the hint
        note = page[page.index('class="exercise-needs-jupyter"'):page.index('<details class="exercise-stub"')]
        assert "graded in Jupyter" in note and "make lab" in note
        assert f'<details class="exercise-stub" hidden><summary>Stub</summary><pre><code>{html.escape(ex.stub)}' in page
        assert BROWSER_CLASS not in page


# --- the website's export (tests/test_code_exercises_browser.py grades it in Chromium) -------------

BROWSER_GRADED = {"causal_attention", "merge_word", "matmul_intensity", "decode_step_seconds", "append_keys",
                  "block_hashes", "accept_greedy", "spm_merge", "ring_write"}


def test_every_chapter_has_an_exercise_the_website_grades():
    for chapter, module in CHAPTERS.items():
        assert any(ex.name in BROWSER_GRADED for ex in module.CODE_EXERCISES), f"chapter {chapter}"


@pytest.mark.parametrize("ex", ALL, ids=lambda ex: ex.name)
def test_plain_python_exercises_export_every_case_and_the_library_outcome(ex):
    export = ex.browser_export()
    if ex.name not in BROWSER_GRADED:   # tensors, a pool, a generator: only Python with torch grades these
        assert export is None
        return
    cases = ex.cases()
    assert [c["label"] for c in export["cases"]] == [c.label for c in cases]
    for exported, case in zip(export["cases"], cases):
        assert ast.literal_eval(exported["args"]) == case.make()
        args = case.make()
        try:
            result = ex.reference(*args)
        except Exception as err:
            assert exported["error"] == [type(err).__name__, str(err)]
            result = None
        else:
            assert exported["error"] is None
        assert ast.literal_eval(exported["observed"]) == ex._observe(args, result)
    # an exercise that compares its arguments' state ships that comparison, as plain Python
    assert (export["observe"] is None) == (ex.observe is None)
    assert export["stand_ins"] == ["torch"] and export["exercise"]["hint"] == ex.hint
    assert all(name.startswith(("inference_course.", "inference_internals.")) for name in export["modules"])


def test_export_refuses_what_cannot_travel():
    assert _toy().browser_export() is None   # a tensor case
    plain = _toy(cases=lambda: [Case("one", lambda: (1,)), Case("two", lambda: (2.5,))])
    assert [c["observed"] for c in plain.browser_export()["cases"]] == ["2", "5.0"]
    assert _toy(cases=lambda: [Case("inf", lambda: (float("inf"),))]).browser_export() is None
    torch_stub = "import torch\n\ndef double(x):\n    raise NotImplementedError\n"
    assert _toy(cases=plain.cases, stub=torch_stub).browser_export() is None


RUN_WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None   # `import torch` fails: the browser has none
namespace = {}
exec(open(sys.argv[1]).read(), namespace)
export, sources = open(sys.argv[2]).read(), json.load(open(sys.argv[3]))
print(json.dumps([json.loads(namespace["grade"](export, source)) for source in sources]))
"""


@pytest.mark.parametrize("name", sorted(BROWSER_GRADED))
def test_the_browser_runner_gives_the_graders_verdicts_without_torch(name, tmp_path):
    """browser_grading.py, run by this machine's Python with torch unimportable, agrees with the grader
    on the solution, the stub and every planted wrong version (Chromium runs it in Pyodide in
    tests/test_code_exercises_browser.py)."""
    ex = next(ex for ex in ALL if ex.name == name)
    sources = [ex.solution, ex.stub] + [source for wrong_ex, _, source, _ in WRONG if wrong_ex is ex]
    (tmp_path / "export.json").write_text(json.dumps(ex.browser_export()))
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    run = subprocess.run([sys.executable, "-I", "-c", RUN_WITHOUT_TORCH, browser_grading.__file__,
                          tmp_path / "export.json", tmp_path / "sources.json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    python = [ex.grade(define(source, ex.name), rerun=BROWSER_RERUN) for source in sources]
    assert json.loads(run.stdout) == [{"correct": v.correct, "message": v.message} for v in python]
    assert python[0].correct and not any(v.correct for v in python[1:])
    # the website's reader presses Check; Jupyter's runs the cell
    assert python[1].message == f"{NOT_IMPLEMENTED}: fill in {ex.name}() and press Check again."
    assert ex.grade(define(ex.stub, ex.name)).message.endswith("and run its cell again.")


def test_check_button_grades_the_current_definition():
    ex = _toy()
    namespace: dict = {}
    exec("def double(x):\n    raise NotImplementedError\n", namespace)
    checker = ex.widget(namespace["double"])
    button, feedback = checker.children
    assert NOT_IMPLEMENTED in feedback.value and "exercise-checker" in checker._dom_classes
    exec("def double(x):\n    return 2 * x\n", namespace)  # the reader fills the stub and reruns it
    button.click()
    assert "✓ Correct" in feedback.value
    exec("def double(x):\n    return x\n", namespace)
    button.click()
    assert "✗ Case “one” failed" in feedback.value


# --- the notebooks ------------------------------------------------------------------------------

def _cells(chapter: int) -> list[str]:
    path = next((ROOT / "chapters").glob(f"0{chapter}_*.ipynb"))
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_notebook_holds_each_stub_and_grades_it(chapter):
    cells = _cells(chapter)
    module = f"ch0{chapter}_code"
    for i, ex in enumerate(CHAPTERS[chapter].CODE_EXERCISES):
        attr = next(a for a, v in vars(CHAPTERS[chapter]).items() if v is ex)
        show = next(n for n, c in enumerate(cells) if re.search(rf"\b{module}\.{attr}\.show\(\)", c))
        cell = cells[show + 1]
        assert cell.startswith(ex.stub), f"chapter {chapter}: the cell after {attr}.show() is not its stub"
        assert cell.rstrip().endswith(f"{module}.{attr}.check({ex.name})")
