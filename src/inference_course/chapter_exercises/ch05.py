"""Chapter 5 exercises: blocks, reservations, preemption, sharing, packing. Every expected answer is
computed by running the library's block pool and scheduler on the exercise's numbers."""
from __future__ import annotations

from ..exercises import Exercise, choice, integer, number
from inference_internals.kv_cache import kv_cache_bytes
from inference_internals.model import LlamaConfig
from inference_internals.engine import BlockPool, Scheduler, Sequence
from inference_internals.kv_cache import PagedKVCache
from inference_internals.params import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=8)

# 1. Blocks for a set of sequence lengths.
LENGTHS, BLOCK = [17, 32, 33, 100, 5], 16
blocks_answer = sum(BlockPool(1, BLOCK).blocks_needed(n) for n in LENGTHS)
empty_slots = blocks_answer * BLOCK - sum(LENGTHS)
blocks_exercise = Exercise(
    title="Blocks for five sequences",
    prompt=(f"Five sequences hold {', '.join(map(str, LENGTHS))} tokens. With a block size of "
            f"{BLOCK} tokens, how many blocks do they hold in total?"),
    check=integer(blocks_answer),
    hint="Each sequence needs ⌈length / block size⌉ blocks of its own: a block never holds two "
         "sequences' tokens (unless they share a prefix).",
    solution=(" + ".join(f"⌈{n}/{BLOCK}⌉" for n in LENGTHS) + f" = **{blocks_answer}** blocks, "
              f"{blocks_answer * BLOCK} slots for {sum(LENGTHS)} tokens: {empty_slots} slots empty, "
              f"all in the sequences' last blocks (at most {BLOCK - 1} each).\n\n"
              f"```python\nsum(BlockPool(1, {BLOCK}).blocks_needed(n) for n in {LENGTHS})\n```"),
    placeholder="a whole number",
)

# 2. What a contiguous max-length reservation wastes.
CONTEXT, PROMPT, OUTPUT = 2048, 300, 200
waste_answer = 1 - (PROMPT + OUTPUT) / CONTEXT
smol = LlamaConfig()  # the defaults are SmolLM2-135M's
reserved_mb = kv_cache_bytes(smol, CONTEXT, batch=1, bytes_per_elem=2) / 1e6
waste_exercise = Exercise(
    title="The waste of a contiguous reservation",
    prompt=(f"A server with a contiguous KV cache reserves the full context of {CONTEXT:,} tokens for "
            f"every request, because it cannot know in advance how long the output will be. A request "
            f"has a {PROMPT}-token prompt and stops after {OUTPUT} output tokens. What fraction of its "
            "reservation never holds a token? (A percentage or a fraction.)"),
    check=number(waste_answer, rel=0.01),
    hint="The reservation is the whole context; the tokens that ever arrive are prompt + output.",
    solution=(f"1 − ({PROMPT} + {OUTPUT}) / {CONTEXT} = **{waste_answer:.1%}**. For SmolLM2-135M in "
              f"bf16 the reservation is {reserved_mb:.0f} MB per request, of which "
              f"{waste_answer * reserved_mb:.0f} MB stay empty. A paged cache would have held "
              f"⌈{PROMPT + OUTPUT}/16⌉ = {-(-(PROMPT + OUTPUT) // 16)} blocks of 16 at the end, "
              f"{-(-(PROMPT + OUTPUT) // 16) * 16 - PROMPT - OUTPUT} empty slots."),
    placeholder="e.g. 50% or 0.5",
)


# 3. Who is preempted when a block runs out.
def preemption_victim() -> str:
    """Four sequences fill an 8-block pool; A (admitted first) needs a new block to decode."""
    pool = BlockPool(8, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(pool)
    names = {}
    for name, n in zip("ABCD", (8, 6, 7, 5)):
        seq = Sequence(list(range(3, 3 + n)), PARAMS, 4)
        names[seq.id] = name
        sched.add(seq)
    prefill = sched.schedule()
    sched.postprocess(prefill.seqs, [[3]] * len(prefill.seqs), prefill.num_tokens)  # every prompt token stored, one more sampled
    assert pool.num_free == 0
    decode = sched.schedule()
    return "".join(names[s.id] for s in decode.preempted)


victim_answer = preemption_victim()
preemption_exercise = Exercise(
    title="Which sequence is preempted?",
    prompt=("Sequences A, B, C, D were admitted in that order and are all decoding. The pool has no "
            "free block left, and A's next token starts a new block. The scheduler of this chapter "
            "(like vLLM's) must free memory by preemption. Which sequence loses its blocks?"),
    check=choice(victim_answer, options=list("ABCD")),
    hint="Preemption by recompute throws work away. Whose work is cheapest to redo, and who has "
         "waited longest (first come, first served)?",
    solution=(f"**{victim_answer}**, the most recently admitted. The oldest requests keep running, so "
              "every request finishes eventually (the victim goes back to the front of the waiting "
              "queue), and the newest has the least generated output to recompute. "
              "`Scheduler._decode` takes its victims from the end of the running queue."),
    placeholder="A, B, C or D",
)


# 4. Parallel sampling: shared prompt blocks, copy-on-write for the last partial one.
N_SAMPLES, PROMPT_LEN = 4, 40


def blocks_after_first_token() -> tuple[int, int]:
    pool = BlockPool(64, block_size=16)
    parent = Sequence(list(range(3, 3 + PROMPT_LEN)), PARAMS, 16)
    pool.allocate(parent)
    parent.num_cached = len(parent)
    seqs = [parent]
    for i in range(1, N_SAMPLES):
        child = parent.fork(i)
        pool.fork(parent, child)
        seqs.append(child)
    right_after_fork = pool.num_used
    for s in seqs:  # each sample's first new token is written into the prompt's last block
        s.token_ids.append(3)
        pool.append_slot(s)
    return right_after_fork, pool.num_used


fork_blocks, cow_answer = blocks_after_first_token()
cow_exercise = Exercise(
    title="Copy-on-write",
    prompt=(f"A request asks for n = {N_SAMPLES} samples of one {PROMPT_LEN}-token prompt, block size 16. "
            f"After the prompt is prefilled once, the {N_SAMPLES} samples share its blocks. Then each "
            "sample stores the key/value of its first generated token. How many blocks are in use now?"),
    check=integer(cow_answer),
    hint=f"{PROMPT_LEN} tokens fill some blocks completely and one partly. Full blocks stay shared; "
         "a shared block that someone writes into is copied first — but once only one owner is left, "
         "that owner writes in place.",
    solution=(f"The prompt takes {fork_blocks} blocks ({PROMPT_LEN // 16} full, one with "
              f"{PROMPT_LEN % 16} tokens), shared by all {N_SAMPLES}. The first {N_SAMPLES - 1} samples "
              f"to write copy the partial block; the last finds itself its only owner. "
              f"{fork_blocks} + {N_SAMPLES - 1} = **{cow_answer}** blocks, against "
              f"{N_SAMPLES * fork_blocks} without sharing."),
    placeholder="a whole number",
)

# 5. Prefix caching: what a second request with the same system prompt computes.
SYSTEM, QUESTION = 50, 10


def tokens_to_compute() -> int:
    pool = BlockPool(32, block_size=16)
    system = list(range(100, 100 + SYSTEM))
    first = Sequence(system + list(range(3, 3 + QUESTION)), PARAMS, 16)
    pool.allocate(first)
    first.num_cached = len(first)
    pool.register(first)
    second = Sequence(system + list(range(7, 7 + QUESTION)), PARAMS, 16)
    pool.allocate(second)
    return second.num_new_tokens


prefix_answer = tokens_to_compute()
prefix_exercise = Exercise(
    title="What the prefix cache saves",
    prompt=(f"Two requests start with the same {SYSTEM}-token system prompt, then each has its own "
            f"{QUESTION}-token question. The first has been computed; its full blocks (block size 16) "
            "are in the prefix cache. How many prompt tokens must the second request's prefill compute?"),
    check=integer(prefix_answer),
    hint="Only full blocks are hashed, and a block's hash covers every token before it. "
         "Which blocks of the second prompt are identical, token for token, to the first's?",
    solution=(f"The first {SYSTEM // 16} blocks ({SYSTEM // 16 * 16} tokens) hold system-prompt tokens "
              f"only and are reused; block {SYSTEM // 16} mixes the last {SYSTEM % 16} system tokens with "
              f"the question, so it differs. {SYSTEM + QUESTION} − {SYSTEM // 16 * 16} = "
              f"**{prefix_answer}** tokens to compute."),
    placeholder="a whole number",
)

# 6. A packed step: how many of attention's scores the mask keeps.
PACKED = {"A": (9, 1), "B": (4, 1), "C": (0, 3)}  # sequence: (tokens cached, new tokens this step)
PACKED_BLOCK = 4
packed_blocks = [BlockPool(1, PACKED_BLOCK).blocks_needed(c + n) for c, n in PACKED.values()]


def packed_mask() -> tuple[list[int], int, int]:
    """Scores kept per sequence, and the row's tokens and keys, from ``PackedBatch``'s own mask."""
    tables, first = [], 0
    for k in packed_blocks:
        tables.append(list(range(first, first + k)))
        first += k
    cache = PagedKVCache(LlamaConfig(num_hidden_layers=1), first, PACKED_BLOCK)
    view = cache.packed(tables, [c for c, _ in PACKED.values()], [n for _, n in PACKED.values()])
    view.begin(view.query_pos[None])
    mask = view.mask[0, 0]  # [tokens, keys]
    kept = [int(mask[view.q_seq == b].sum()) for b in range(len(PACKED))]
    return kept, mask.shape[0], mask.shape[1]


packed_kept, packed_tokens, packed_keys = packed_mask()
packed_answer = sum(packed_kept)
packed_exercise = Exercise(
    title="What a packed step's mask keeps",
    prompt=("One packed step holds three sequences in one row: "
            + "; ".join(f"{name} adds {n} token{'s' * (n > 1)} after {c} cached" for name, (c, n) in PACKED.items())
            + f". Block size {PACKED_BLOCK}. The keys are the blocks each sequence uses this step, end to end, "
            "and attention scores every token of the row against every key. How many of those scores "
            "does the mask keep?"),
    check=integer(packed_answer),
    hint="A token sees only its own sequence's keys, up to its own position: a token at position p "
         "keeps p + 1 scores.",
    solution=(f"The row has {packed_tokens} tokens and {packed_keys} keys "
              f"({' + '.join(map(str, packed_blocks))} blocks of "
              f"{PACKED_BLOCK}), so {packed_tokens * packed_keys} scores. Kept: "
              + ", ".join(f"{name} {k}" for name, k in zip(PACKED, packed_kept))
              + f" = **{packed_answer}**, {packed_answer / (packed_tokens * packed_keys):.0%} of them. The rest "
              "is work that a variable-length attention kernel never does, and it grows with the square "
              "of the batch.\n\n```python\nview = cache.packed(tables, cached, new)\n"
              "view.begin(view.query_pos[None])\nint(view.mask.sum())\n```"),
    placeholder="a whole number",
)

EXERCISES = [blocks_exercise, waste_exercise, preemption_exercise, cow_exercise, prefix_exercise,
             packed_exercise]
