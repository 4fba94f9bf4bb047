"""Batches on the fast path: the door's engine with 1, 4, 16 and 64 requests at once, beside
transformers' continuous batching and llama.cpp's multi-sequence decoding, interleaved round by round.

    make bench-peers BENCH_ARGS="--only door_batches --merge"

- ours: ``LLM(quantization="q4_1", compile=True)``, one ``generate()`` of the B prompts: continuous
  batching through the compiled batched step (every row one new token, the block kernels over the
  file's Q4_1 blocks)
- llama.cpp on the shipped Q4_1 file and on its Q4_0 requantization (the format its x86 backend
  repacks; ``llama_cpp_best.q4_0_file``): the B prompts as B sequences of one context, the prompts in
  one ``llama_decode``, then one a step (``peer_llama_cpp.decode_batch``)
- transformers' ``generate_batch`` (fp32, paged, continuously batched: ``inference_course.hf_batching``)
- on a CPU with AMX, ours again with AMX off (``blockdot.amx(False)``: every product on the AVX-512
  kernels): what the tile instructions buy a batch and a prefill. Its tokens must equal ours in the
  same round (the two kernels' sums are the same bit for bit), else the run fails

Every engine decodes ``NEW_TOKENS`` greedy tokens per request, EOS ignored; throughput is the B
requests' new tokens over the call's time, prefill included (each engine's clock starts with its
context or engine already made). Tokens: every engine's, request by request, against ours with the
prompt alone. Where ours differs from itself alone, the first difference must be at a near tie of a
plain forward of our model (its top two logits within ``OURS_TIE``: a batch's prompts prefilled
together round otherwise than one alone), else the run fails; the peers' matches are counted
(llama.cpp's multi-row kernels round otherwise than its one-row ones, and Q4_0 is another model).
"""
from __future__ import annotations

import time

import torch

from .common import stats

BATCHES = (1, 4, 16, 64)
QUICK_BATCHES = (1, 4)
NEW_TOKENS = 32
OURS = "ours: the door, Q4_1 compiled"
OURS_NO_AMX = "ours with AMX off (AVX-512 kernels alone)"
CPP_Q4_1, CPP_Q4_0 = "llama.cpp Q4_1, batch API", "llama.cpp Q4_0 (repacked), batch API"
HF = "Hugging Face generate_batch (fp32)"
# logits of the Q4_1 engine move by ~1e-3 between a prompt prefilled alone and prefilled in a batch (seen:
# 0.0018 apart at a greedy choice that went the other way): a gap below this is a tie it may break either way
OURS_TIE = 5e-3


class _Plain:
    """Our model as ``hf_batching.compare`` calls its reference: one sequence, no cache, ``.logits``."""

    def __init__(self, model):
        self.model, self.device = model, model.device

    def __call__(self, ids):
        with torch.inference_mode():
            return type("Out", (), {"logits": self.model(ids)})


def bench_door_batches(args, device) -> dict:
    from inference_course import hf_batching as hb
    from inference_internals import LLM, SamplingParams
    from inference_internals.analysis.trace import make_trace
    from inference_internals.model import load_reference, load_tokenizer
    from inference_internals.timing import Load
    from inference_internals.weights import gguf_path

    from .llama_cpp_best import q4_0_file
    from .peer_llama_cpp import LlamaCppPeer, peers_python

    batches = QUICK_BATCHES if args.quick else BATCHES
    trace = make_trace(max(batches), prompt_range=(16, 48), output_range=(4, 8), seed=1)
    prompts = hb.text_prompts(load_tokenizer(), [r.prompt_len for r in trace])
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    door = LLM(device=str(device), quantization="q4_1", compile=True, max_num_seqs=max(batches))

    def ours(ps):
        t0 = time.perf_counter()
        outs = door.generate([{"prompt_token_ids": p} for p in ps], greedy)
        return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]

    # what batching must not change: each prompt's tokens when it runs alone (and the compiled graphs)
    alone = [ours([p])[1][0] for p in prompts]
    engines = {OURS: ours}
    from inference_internals.optimize import blockdot
    if device.type == "cpu" and blockdot.available() is None and blockdot.amx_ready():
        def ours_no_amx(ps):
            with blockdot.amx(False):
                return ours(ps)
        engines[OURS_NO_AMX] = ours_no_amx
    hf = load_reference(device=device)

    def hugging_face(ps):
        served = hb.run_hf(hf, ps, NEW_TOKENS)
        return served.seconds, served.tokens
    engines[HF] = hugging_face
    python = peers_python(args.peers_python)
    res = {"batches": list(batches), "new_tokens": NEW_TOKENS, "rounds": args.batching_reps,
           "prompt_lengths": [len(p) for p in prompts], "prompts": "slices of the Zen of Python",
           "threads": torch.get_num_threads()}
    peers = []
    try:
        if device.type == "cpu" and python is not None:
            n_ctx = sum(len(p) + NEW_TOKENS for p in prompts)
            for name, path in ((CPP_Q4_1, gguf_path()), (CPP_Q4_0, q4_0_file(python))):
                peer = LlamaCppPeer(python, path, torch.get_num_threads(), n_ctx=max(512, n_ctx))
                peers.append(peer)

                def theirs(ps, peer=peer):
                    stamps = peer.decode_batch(ps, NEW_TOKENS)
                    return stamps[-1] - peer.last_t0, peer.last_tokens
                engines[name] = theirs
            res["llama_cpp"] = {k: peers[0].info.get(k) for k in ("version", "system_info") if k in peers[0].info}
        else:
            res["llama_cpp"] = {"unmeasured": "llama.cpp is compared on a CPU, with its venv (`make bench-peers`)"}
        for _ in range(2):  # first calls out of the rounds (twice: a batch's graph compiles, pools are sized,
            for B in batches:  # and each engine then runs once after every other)
                for run in engines.values():
                    run(prompts[:B])
        seconds = {name: {B: [] for B in batches} for name in engines}
        plain, changed = _Plain(door.model), {}
        tokens = {name: {} for name in engines}
        with Load() as load:
            for rep in range(args.batching_reps):
                order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
                for B in batches:
                    for name in order:
                        s, toks = engines[name](prompts[:B])
                        seconds[name][B].append(s)
                        if name == OURS:  # every round's: a difference at other than a near tie fails the run
                            c = hb.compare(toks, alone[:B], prompts[:B], plain, tol=OURS_TIE)
                            if not c.ok:
                                raise AssertionError(f"ours in a batch of {B} changed a request's greedy tokens "
                                                     f"away from a near tie: {c.summary()}")
                            changed[B] = changed.get(B, []) + [{"round": rep, "request": d.request, "index": d.index,
                                                                "margin": d.margin} for d in c.divergences]
                        tokens[name][B] = toks
                    if OURS_NO_AMX in engines and tokens[OURS_NO_AMX][B] != tokens[OURS][B]:
                        raise AssertionError(f"AMX changed the tokens of a batch of {B} (round {rep})")
        res["load"] = {"others_busy_cores": load.others, "seconds": load.seconds,
                       "note": "others_busy_cores counts the llama.cpp workers too: they run in processes of their own"}
    finally:
        for peer in peers:
            peer.close()
    res["engines"] = {name: {str(B): {"tok_s": stats([B * NEW_TOKENS / s for s in seconds[name][B]]),
                                      "tok_s_per_round": [B * NEW_TOKENS / s for s in seconds[name][B]]}
                             for B in batches} for name in engines}
    # per round: each engine's batch of B over its own batch of 1, and ours over each peer at the same B
    res["over_batch_1"] = {name: {str(B): stats([B * a / b for a, b in zip(seconds[name][1], seconds[name][B])])
                                  for B in batches if B > 1} for name in engines}
    res["ours_over"] = {name: {str(B): stats([t / o for o, t in zip(seconds[OURS][B], seconds[name][B])])
                               for B in batches} for name in engines if name != OURS}
    res["tokens"] = {name: {str(B): {"same_as_ours_alone": sum(a == b for a, b in zip(tokens[name][B], alone)), "of": B}
                            for B in batches} for name in engines}
    res["ours_near_ties"] = {"tol": OURS_TIE, "changed": {str(B): d for B, d in changed.items() if d}}
    return res
