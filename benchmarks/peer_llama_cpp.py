"""llama.cpp as a peer of the benchmark: a worker process that decodes on request.

    .venv-peers/bin/python benchmarks/peer_llama_cpp.py MODEL.gguf THREADS [--no-extra-bufts] [--n-ctx N]
                                                        [--flash-attn on|off]
    .venv-peers/bin/python benchmarks/peer_llama_cpp.py --quantize IN.gguf OUT.gguf   (to Q4_0, see quantize)

Run by the interpreter of ``.venv-peers`` (``make bench-peers``), which has ``llama-cpp-python``;
the course's own venv never imports llama.cpp, and this file imports nothing of the course, so
it runs with the standard library and ``llama_cpp`` alone. One JSON object a line, both ways:

    <- {"ready": true, "version": "0.3.x", "threads": 2, "system_info": "...", "extra_bufts": true}
                                                      once, model loaded, a prompt prefilled and decoded
    -> {"decode": [prompt ids], "n": 32}
    <- {"t0": the request's arrival, "t": [seconds at which each new token was ready], "tokens": [the n greedy tokens]}
    -> {"decode_batch": [[prompt ids], ...], "n": 32}
    <- {"t0": when its context was made, "t": [seconds at which each step's tokens were ready],
        "tokens": [[the n greedy tokens of each prompt], ...]}

``decode_batch`` is llama.cpp's multi-sequence decoding (its batch API, as ``llama-batched`` and
``llama-server`` run it): every prompt a sequence of its own in one context, all prompts in one
``llama_decode``, then one ``llama_decode`` a step with each sequence's next token.

Between requests it blocks on its input, so it leaves the CPU to the process being measured
while that one runs: the benchmark interleaves the two round by round (``LlamaCppPeer``, below,
is the benchmark's side).
The replies go to a private copy of stdout; the process's own stdout is pointed at stderr, so
whatever the C library prints cannot break a reply.

On an AMX CPU, llama.cpp 0.3.36 moves Q4_1 weights into its AMX buffers and can then crash in its
AMX matrix multiply (seen here on a 2-core Sapphire Rapids-class Xeon: SIGSEGV in the first prefill;
llama.cpp issue #20824). The worker prefills and decodes a few tokens before it says it is ready, so such a crash
shows at start; ``LlamaCppPeer`` then starts it once more with ``--no-extra-bufts`` (llama.cpp's
``use_extra_bufts = false``: every weight in plain CPU buffers, read by its AVX-512 kernels; its
repacked layouts are off too, which for Q4_1 blocks means only the AMX path) and records why.
On such a CPU ``make peers`` builds llama.cpp without AMX, so that its repacked Q4_0 path stays on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# where `make bench-peers` builds the peer's venv (git-ignored), beside the course's .venv
PEERS_VENV = Path(__file__).resolve().parent.parent / ".venv-peers"


def peers_python(given: str | None = None) -> str | None:
    """The interpreter that runs the peer: ``given`` (``--peers-python``), else $PEERS_PYTHON, else
    ``.venv-peers/bin/python`` when it exists; None when there is none."""
    given = given or os.environ.get("PEERS_PYTHON")
    if given:
        return given
    default = PEERS_VENV / "bin" / "python"
    return str(default) if default.exists() else None


class LlamaCppPeer:
    """The benchmark's side: the worker started under ``python``, asked to decode one prompt at a time.

    ``decode(prompt, n)`` returns the token arrival times, as the course's runners do, and keeps the
    tokens in ``last_tokens``; ``cpu_seconds()`` is the CPU time the worker has used, so that a
    measure of what other programs did meanwhile can leave it out. Use it as a context manager.
    """

    def __init__(self, python: str, model_path, threads: int, n_ctx: int = 512, flash_attn: bool | None = None):
        self.last_tokens: list[int] = []
        self.last_t0 = 0.0  # when the worker read the last request (the clock of time.perf_counter, as ours)
        flags = ["--n-ctx", str(n_ctx)] + ([] if flash_attn is None else ["--flash-attn", "on" if flash_attn else "off"])
        try:
            self._start(python, model_path, threads, flags)
        except RuntimeError:
            code = self.proc.returncode
            if code is None or code >= 0:  # not killed by a signal (a crash): a Python error, say
                raise
            self._start(python, model_path, threads, [*flags, "--no-extra-bufts"])
            self.info["fallback"] = (f"with its extra buffer types (AMX, repacking) it crashed at the first prefill "
                                     f"(the llama.cpp peer exited ({code})); run with use_extra_bufts=false")

    def _start(self, python, model_path, threads, flags) -> None:
        self.log = tempfile.TemporaryFile()  # its stderr, for the message when it fails
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), str(model_path), str(threads), *flags],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        try:
            self.info = self._reply()
        except RuntimeError:
            self.log.close()
            raise

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            self.log.seek(0)
            tail = self.log.read().decode(errors="replace").strip()[-800:]
            raise RuntimeError(f"the llama.cpp peer exited ({self.proc.returncode}): {tail}")
        return json.loads(line)

    def _request(self, req: dict) -> list[float]:
        """One request to the peer: its reply's times; its tokens and start kept in ``last_tokens``, ``last_t0``."""
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        if "error" in reply:
            raise RuntimeError(f"the llama.cpp peer: {reply['error']}")
        self.last_tokens, self.last_t0 = reply["tokens"], reply.get("t0", 0.0)
        return reply["t"]

    def decode(self, prompt: list[int], n: int) -> list[float]:
        return self._request({"decode": [int(t) for t in prompt], "n": n})

    def decode_batch(self, prompts: list[list[int]], n: int) -> list[float]:
        """Every prompt at once through llama.cpp's batch API, ``n`` greedy tokens each; returns each
        step's time, keeps the tokens (one list a prompt) in ``last_tokens``."""
        return self._request({"decode_batch": [[int(t) for t in p] for p in prompts], "n": n})

    def cpu_seconds(self) -> float | None:
        try:  # /proc/<pid>/stat: utime and stime, the 14th and 15th fields (Linux only)
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the worker's loop ends at the end of its input
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def quantize(src: str, out: str) -> None:
    """``src`` requantized to Q4_0 by llama.cpp's own ``llama_model_quantize`` (``allow_requantize``: the
    source is already 4-bit), the token embedding (the tied LM head) kept Q8_0 as in the shipped file."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.token_embedding_type = llama_cpp.GGML_TYPE_Q8_0
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed on {src}")


def decode_batch(llm, prompts: list[list[int]], n: int, threads: int) -> dict:
    """``prompts`` as sequences 0..B-1 of one fresh context (its KV cache one buffer for all, sized for
    them), greedy: the prompts in one llama_decode, then one a step, each sequence's token at its
    position. The clock starts once the context is made, as ours starts with its engine built."""
    import numpy as np
    import llama_cpp.llama_cpp as ll

    B, total = len(prompts), sum(len(p) for p in prompts)
    params = ll.llama_context_default_params()
    params.n_ctx = -(-sum(len(p) + n for p in prompts) // 256) * 256
    params.n_batch = max(total, B)
    params.n_ubatch = min(512, params.n_batch)
    params.n_seq_max, params.kv_unified = B, True
    params.n_threads = params.n_threads_batch = threads
    ctx = ll.llama_init_from_model(llm.model, params)
    if not ctx:
        return {"error": f"llama_init_from_model failed for {B} sequences, n_ctx {params.n_ctx}"}
    batch = ll.llama_batch_init(params.n_batch, 0, B)
    vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(llm.model))
    try:
        def run(entries):  # (token, position, sequence, logits wanted) each
            batch.n_tokens = len(entries)
            for i, (tok, pos, seq, wanted) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, wanted
                batch.seq_id[i][0] = seq
            if ll.llama_decode(ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed on a batch of {len(entries)} tokens")
            rows = [i for i, e in enumerate(entries) if e[3]]
            return [int(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(vocab,)).argmax()) for i in rows]

        t0, stamps, tokens = time.perf_counter(), [], [[] for _ in prompts]
        nxt = run([(t, j, s, j == len(p) - 1) for s, p in enumerate(prompts) for j, t in enumerate(p)])
        for step in range(n):
            for s, t in enumerate(nxt):
                tokens[s].append(t)
            stamps.append(time.perf_counter())
            if step < n - 1:
                nxt = run([(t, len(prompts[s]) + step, s, True) for s, t in enumerate(nxt)])
    except RuntimeError as e:
        return {"error": str(e)}
    finally:
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
    return {"t0": t0, "t": stamps, "tokens": tokens}


def _option(argv: list[str], name: str, default: str | None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv: list[str]) -> None:
    if argv[0] == "--quantize":
        return quantize(argv[1], argv[2])
    model_path, threads, extra = argv[0], int(argv[1]), "--no-extra-bufts" not in argv[2:]
    n_ctx, flash = int(_option(argv, "--n-ctx", "512")), _option(argv, "--flash-attn", None)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import llama_cpp
    import llama_cpp.llama_cpp as low_level

    if not extra:  # Llama() takes no such argument: its model parameters start from these defaults
        defaults = low_level.llama_model_default_params

        def without_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params

        low_level.llama_model_default_params = without_extra_bufts
    kw = {} if flash is None else {"flash_attn": flash == "on"}
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          verbose=False, **kw)
    # a prefill and a decode through every weight: a crash (seen in prefills) shows before "ready"
    llm.eval([llm.token_bos()] * 32)
    llm.eval([llm.token_bos()])
    llm.reset()
    info = llama_cpp.llama_print_system_info()
    replies.write(json.dumps({"ready": True, "version": llama_cpp.__version__, "threads": threads,
                              "system_info": info.decode() if isinstance(info, bytes) else str(info),
                              "extra_bufts": extra, "n_ctx": n_ctx, "flash_attn": flash}) + "\n")
    for line in sys.stdin:
        t0 = time.perf_counter()
        req = json.loads(line)
        if "decode_batch" in req:
            replies.write(json.dumps(decode_batch(llm, req["decode_batch"], int(req["n"]), threads)) + "\n")
            continue
        n, stamps, tokens = int(req["n"]), [], []
        llm.reset()  # nothing cached from the last request: every round prefills the prompt alike
        # temp 0 is llama.cpp's greedy sampler: argmax, as the course's engines decode
        for tok in llm.generate(req["decode"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                reset=True):
            stamps.append(time.perf_counter())
            tokens.append(int(tok))
            if len(tokens) == n:
                break
        replies.write(json.dumps({"t0": t0, "t": stamps, "tokens": tokens}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
