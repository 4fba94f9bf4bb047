"""Four drafts for speculative decoding, from free to trained.

PromptLookupDraft   copy what followed the last n tokens earlier in the context (no model)
EarlyExitDraft      the target's own first k layers + its final norm and LM head
MTPDraft            small heads on the target's last hidden state guessing tokens t+2, t+3, ..
EagleDraft          one decoder layer over the target's hidden states and the next tokens (EAGLE)

Each implements ``speculative.Draft.propose``; ``ModelDraft`` is the generic "run a smaller
model autoregressively on its own KV cache" that the early-exit draft is an instance of.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from .kv_cache.contiguous import KVCache
from .model import Block, Llama, RMSNorm, RotaryEmbedding
from .speculative import Draft, Proposal, draw, is_greedy

HEADS_PATH = Path(__file__).parent / "data" / "mtp_heads.pt"
EAGLE_PATH = Path(__file__).parent / "data" / "eagle.pt"


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x`` scaled to unit root-mean-square per row: how the trained drafts take a token's embedding,
    beside the target's hidden state, which its final norm has already scaled."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def head_rows(target: Llama, vocab: torch.Tensor) -> torch.Tensor:
    """The rows of ``target``'s LM head for the draft's ``vocab`` [V', D], gathered once. A quantized
    target's head (optimize(weights=...)) holds codes: the rows they stand for."""
    head = target.lm_head
    weight = head.weight if hasattr(head, "weight") else head.qw.dequantize()
    return weight[vocab.to(weight.device)].detach().to(target.dtype)


def draw_small(logits: torch.Tensor, vocab: torch.Tensor, vocab_size: int, sampler, generator):
    """Guesses over a draft vocabulary: logits [g, V'] -> token ids, and at temperature > 0 the
    distributions they were drawn from, spread over the whole vocabulary [g, V] (zero outside V')."""
    if is_greedy(sampler):
        return vocab[logits.argmax(-1)].tolist(), None
    g = logits.shape[0]
    q_small = sampler.probs(logits.float()).cpu()
    picks = torch.tensor([draw(row, generator) for row in q_small])
    q = torch.zeros(g, vocab_size).scatter_(1, vocab.cpu()[None].expand(g, -1), q_small)
    return vocab.cpu()[picks].tolist(), q


class PromptLookupDraft(Draft):
    """Find the context's last n tokens earlier in the context and guess what followed them.

    The longest n from ``max_ngram`` down to ``min_ngram`` wins, and among equal n the earliest
    match, as in Hugging Face's ``prompt_lookup_num_tokens`` (Saxena 2023,
    https://github.com/apoorvumang/prompt-lookup-decoding). Free, and strong wherever the
    output copies the input: summaries, edits, code changes.

    ``min_ngram`` (vLLM's ``prompt_lookup_min``) is the shortest match worth a guess. A single
    repeated token ("the", a newline) is weak evidence, and its guesses are not free: each one
    is one more position in the verification pass, which costs real time on an engine whose
    one-token step is already fast. With no match this long the round is a plain decode step.
    """
    name = "prompt lookup"

    def __init__(self, max_ngram: int = 2, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context, gamma, hidden=None, sampler=None, generator=None) -> Proposal:
        if gamma <= 0:
            return Proposal([])
        length = len(context)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            tail = context[length - n:]
            for start in range(length - n):  # every earlier window, the tail itself excluded
                if context[start:start + n] == tail:
                    return Proposal(list(context[start + n:start + n + gamma]))
        return Proposal([])


class ModelDraft(Draft):
    """A (smaller) model that guesses by decoding γ tokens on its own KV cache.

    The cache keeps every token the draft has seen; at each round it is cropped to the part
    of the context that is still right (the target may have rejected some guesses) and only
    the tokens it has not seen are fed, so an accepted guess costs the draft nothing more.
    """
    name = "model"

    def __init__(self, model: Llama, name: str | None = None):
        self.model = model
        self.name = name or self.name
        self.cache: KVCache | None = None
        self.fed: list[int] = []
        self.stop: set[int] = set()

    def start(self, prompt, max_len, stop_ids) -> None:
        self.cache = KVCache.for_model(self.model, 1, max_len)
        self.fed, self.stop = [], set(stop_ids)

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        logits = self.model(torch.tensor([tokens], device=self.model.device), cache=self.cache, last_only=True)
        self.fed += tokens
        return logits[0, -1]

    def propose(self, context, gamma, hidden=None, sampler=None, generator=None) -> Proposal:
        if self.cache is None:
            raise RuntimeError("call start(prompt, max_len, stop_ids) before propose")
        if gamma <= 0:
            return Proposal([])
        keep = 0
        limit = min(len(self.fed), len(context) - 1)  # feed at least the last token to get logits
        while keep < limit and self.fed[keep] == context[keep]:
            keep += 1
        self.cache.crop(keep)
        self.fed = self.fed[:keep]
        logits = self._feed(list(context[keep:]))
        tokens, qs = [], []
        for i in range(gamma):
            if is_greedy(sampler):
                t = int(logits.argmax())
            else:
                q = sampler.probs(logits.float()).cpu()
                t = draw(q, generator)
                qs.append(q)
            tokens.append(t)
            if t in self.stop or i + 1 == gamma:  # the last guess need not be fed
                break
            logits = self._feed([t])
        return Proposal(tokens, torch.stack(qs) if qs else None)


def truncated_model(model: Llama, n_layers: int) -> Llama:
    """The first ``n_layers`` blocks of ``model`` followed by its final norm and LM head.

    The modules are shared, not copied: the early-exit draft costs no extra weights.
    """
    total = model.config.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be in 1..{total}, got {n_layers}")
    with torch.device("meta"):
        cfg = model.config
        shallow = Llama(replace(cfg, num_hidden_layers=n_layers,
                                layer_types=None if cfg.layer_types is None else cfg.layer_types[:n_layers]))
    shallow.embed_tokens = model.embed_tokens
    shallow.layers = nn.ModuleList(model.layers[:n_layers])
    shallow.norm = model.norm
    shallow.lm_head = model.lm_head
    shallow.rotary, shallow.rotary_local = model.rotary, model.rotary_local
    return shallow.eval()


class EarlyExitDraft(ModelDraft):
    """Self-speculation: the target's first k layers, then its final norm and LM head.

    Layers 0..k-1 compute the same keys and values in the draft as in the target, so the two
    could share one cache (LayerSkip, https://arxiv.org/abs/2404.16710, does). The simplest
    correct scheme keeps a separate k-layer cache for the draft: k/30 of the target's cache
    memory, and no bookkeeping between the two.
    """
    name = "early exit"

    def __init__(self, target: Llama, n_layers: int):
        super().__init__(truncated_model(target, n_layers), f"early exit ({n_layers} layers)")
        self.n_layers = n_layers


# --- multi-token prediction heads ----------------------------------------------------------

class MTPHeads(nn.Module):
    """K small heads on the target's final hidden state h_t (which gives token t+1 through
    the LM head). Head k guesses token t+1+k from h_t and the embedding of token t+1, the
    token the target has just chosen: Medusa's heads on h_t (https://arxiv.org/abs/2401.10774)
    with the next token's embedding as an input, as DeepSeek-V3's MTP modules take it
    (https://arxiv.org/abs/2412.19437; theirs are full transformer blocks run in sequence):

        z_k = h_t + up_k(silu(down_k([h_t, rms(e_{t+1})])))     logits_k = z_k @ E[vocab]^T

    A residual low-rank MLP per head and the target's own (tied) LM head, restricted to the
    ``vocab`` the heads were trained on (the tokens the target writes most often): far cheaper
    than the full 49152-token head, and the only tokens they ever learned to predict.
    """

    def __init__(self, hidden_size: int, n_heads: int, rank: int, vocab: torch.Tensor):
        super().__init__()
        if n_heads < 1 or rank < 1:
            raise ValueError(f"n_heads and rank must be >= 1, got {n_heads}, {rank}")
        self.hidden_size, self.n_heads, self.rank = hidden_size, n_heads, rank
        self.down = nn.Parameter(torch.randn(n_heads, 2 * hidden_size, rank) / math.sqrt(2 * hidden_size))
        self.bias = nn.Parameter(torch.zeros(n_heads, rank))
        # zero: every head starts as the LM head itself, guessing token t+1
        self.up = nn.Parameter(torch.zeros(n_heads, rank, hidden_size))
        self.register_buffer("vocab", torch.as_tensor(vocab, dtype=torch.long))

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """h, e [N, D] -> z [N, K, D], the inputs to the LM head for tokens t+2 .. t+K+1."""
        u = torch.einsum("nd,kdr->nkr", torch.cat([h, rms(e)], -1), self.down) + self.bias
        return h[:, None] + torch.einsum("nkr,krd->nkd", torch.nn.functional.silu(u), self.up)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"hidden_size": self.hidden_size, "n_heads": self.n_heads, "rank": self.rank,
                    "vocab": self.vocab.to(torch.int32).cpu(),
                    # fp16 halves the file; the heads are small corrections, fp16 keeps them exact enough
                    "state": {k: v.half().cpu() for k, v in self.state_dict().items() if k != "vocab"},
                    "meta": meta or {}}, path)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "MTPHeads":
        path = Path(path) if path is not None else HEADS_PATH
        if not path.exists():
            raise FileNotFoundError(f"no MTP heads at {path}: train them with "
                                    f"`python -m inference_course.train_mtp`")
        blob = torch.load(path, map_location="cpu", weights_only=True)
        heads = cls(blob["hidden_size"], blob["n_heads"], blob["rank"], blob["vocab"].long())
        heads.load_state_dict({k: v.float() for k, v in blob["state"].items()}, strict=False)
        heads.meta = blob.get("meta", {})
        return heads.eval()


class MTPDraft(Draft):
    """Guess γ <= K tokens in one shot from the target's last hidden state: no draft model,
    no draft KV cache, and one small matrix product for all K heads together."""
    name = "MTP heads"
    needs_hidden = True

    def __init__(self, target: Llama, heads: MTPHeads):
        if heads.hidden_size != target.config.hidden_size:
            raise ValueError(f"heads built for hidden size {heads.hidden_size}, "
                             f"the target has {target.config.hidden_size}")
        self.target = target
        self.heads = heads.to(device=target.device, dtype=target.dtype)
        self.lm_rows = head_rows(target, self.heads.vocab)
        self.vocab_size = target.config.vocab_size

    @torch.inference_mode()
    def propose(self, context, gamma, hidden=None, sampler=None, generator=None) -> Proposal:
        if hidden is None:
            raise ValueError("MTPDraft needs the target's hidden state: use it through speculative_generate")
        g = min(gamma, self.heads.n_heads)
        if g <= 0:
            return Proposal([])
        e = self.target.embed_tokens.weight[context[-1]]
        newest = hidden.reshape(-1, hidden.shape[-1])[-1:]  # the state that chose context[-1]
        z = self.heads(newest.to(self.lm_rows.dtype), e[None])[0, :g]
        return Proposal(*draw_small(z @ self.lm_rows.T, self.heads.vocab, self.vocab_size, sampler, generator))


# --- EAGLE: a draft in the target's feature space ------------------------------------------

class Eagle(nn.Module):
    """One decoder layer of the target's own shape that reads, at each position p, the target's final
    hidden state h_p (the one that chose token p+1) beside the embedding of token p+1, and writes f_{p+1},
    its guess of the target's next hidden state; the target's LM head (its rows for ``vocab``) turns f
    into the next token. EAGLE (Li et al. 2024, https://arxiv.org/abs/2401.15077):

        x_p = fc([h_p ; rms(e_{p+1})])      f_{p+1} = norm(layer(x_{..p}))      logits = f_{p+1} @ E[vocab]^T

    The layer attends over every earlier position (its own KV cache), so it sees the context, not only
    the newest state as the MTP heads do. Past the first guess it runs on its own f in place of h.
    """

    def __init__(self, cfg, vocab: torch.Tensor):
        super().__init__()
        self.config = replace(cfg, num_hidden_layers=1, layer_types=None)  # what its KV cache is sized from
        d = cfg.hidden_size
        self.fc = nn.Linear(2 * d, d)
        self.layer = Block(self.config, 0)
        self.norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_offset)
        self.rotary = RotaryEmbedding(self.config)
        self.register_buffer("vocab", torch.as_tensor(vocab, dtype=torch.long))

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def forward(self, h: torch.Tensor, e: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """h, e [B, T, D] (states, and the embeddings of the tokens they chose) -> f [B, T, D]. With a
        ``cache`` the T positions continue it; without, they start at 0, causal (training)."""
        B, T, _ = h.shape
        positions = cache.positions(B, T) if cache is not None else torch.arange(T, device=h.device).expand(B, -1)
        if cache is not None:
            cache.begin(positions)
        x = self.fc(torch.cat([h, rms(e)], -1))
        x = self.layer(x, *self.rotary(positions, x.dtype), cache)
        if cache is not None:
            cache.commit(T)
        return self.norm(x)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"config": eagle_shape(self.config),
                    "vocab": self.vocab.to(torch.int32).cpu(),
                    # fp16 halves the file: a draft's rounding changes guesses, never the output
                    "state": {k: v.half().cpu() for k, v in self.state_dict().items() if k != "vocab"},
                    "meta": meta or {}}, path)

    @classmethod
    def load(cls, target_config, path: str | Path | None = None) -> "Eagle":
        path = Path(path) if path is not None else EAGLE_PATH
        if not path.exists():
            raise FileNotFoundError(f"no EAGLE draft at {path}: train it with `python -m inference_course.train_eagle`")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            saved, vocab, state = blob["config"], blob["vocab"].long(), blob["state"]
        except Exception as e:  # a damaged or foreign file: refused before anything is built
            raise ValueError(f"{path} is not an EAGLE draft file ({type(e).__name__}: {e})") from None
        built = eagle_shape(target_config)
        if saved != built:
            raise ValueError(f"{path}: this EAGLE draft was trained for a target with {saved}, not {built}")
        if not (len(vocab) and 0 <= int(vocab.min()) and int(vocab.max()) < built["vocab_size"]):
            raise ValueError(f"{path}: its draft vocabulary is not within the target's {built['vocab_size']} tokens")
        draft = cls(target_config, vocab)  # only once the file has passed every check
        try:
            draft.load_state_dict({"vocab": vocab, **{k: v.float() for k, v in state.items()}})
        except RuntimeError as e:
            raise ValueError(f"{path}: its weights do not fit an EAGLE layer of this shape ({e})") from None
        draft.meta = blob.get("meta", {})
        return draft.eval()


# what an EAGLE layer's shape comes from: a draft trained for one target refuses another
CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "rope_theta")


def eagle_shape(config) -> dict:
    """The settings of ``config`` an EAGLE layer is built from (``CONFIG_KEYS``)."""
    return {k: getattr(config, k) for k in CONFIG_KEYS}


class EagleDraft(Draft):
    """Chain drafting with an ``Eagle`` layer: each round it first reads the target's states of the
    positions verified since the last round (``hidden``: a round's accepted guesses cost it one pass
    together), then guesses γ tokens, feeding each guess back with its own predicted state. Its cache
    is cut back to the verified positions after every round."""
    name = "EAGLE"
    needs_hidden = True

    def __init__(self, target: Llama, eagle: Eagle, dtype: torch.dtype | None = None):
        """``dtype``: what the layer and its head rows compute in, the target's by default (bf16 reads
        half the bytes a guess costs; a draft's rounding changes guesses, never the output)."""
        want, have = eagle_shape(target.config), eagle_shape(eagle.config)
        if want != have:
            raise ValueError(f"this EAGLE layer was built for a target with {have}, not {want}")
        if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"an EAGLE layer computes in float32, bfloat16 or float16, not {dtype}")
        self.target = target
        self.eagle = eagle.to(device=target.device, dtype=dtype or target.dtype)
        self.lm_rows = head_rows(target, eagle.vocab).to(self.eagle.dtype)
        self.vocab_size = target.config.vocab_size
        self.cache: KVCache | None = None
        self.stop: set[int] = set()

    def start(self, prompt, max_len, stop_ids) -> None:
        self.cache = KVCache.for_model(self.eagle, 1, max_len)
        self.stop = set(stop_ids)

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        return self.target.embed_tokens.weight[torch.tensor(tokens, device=self.eagle.device)][None].to(self.eagle.dtype)

    @torch.inference_mode()
    def propose(self, context, gamma, hidden=None, sampler=None, generator=None) -> Proposal:
        if self.cache is None:
            raise RuntimeError("call start(prompt, max_len, stop_ids) before propose")
        if hidden is None:
            raise ValueError("EagleDraft needs the target's hidden states: use it through the engine "
                             "or speculative_generate")
        if gamma <= 0:
            return Proposal([])
        hidden = hidden.reshape(-1, hidden.shape[-1])
        k = hidden.shape[0]
        start = len(context) - 1 - k  # the states' positions: start .. len(context) - 2
        if start < 0:
            raise ValueError(f"{k} hidden states for a context of {len(context)} tokens: at most {len(context) - 1}")
        # States for positions the cache has (a sequence recomputed after preemption) replace them; a gap
        # (states never handed over) only shifts positions: guesses worsen, the output cannot.
        self.cache.crop(min(start, self.cache.length))
        f = self.eagle(hidden[None].to(self.eagle.dtype), self._embed(context[start + 1:]), self.cache)[:, -1:]
        verified = self.cache.length
        tokens, qs = [], []
        try:
            for i in range(gamma):
                t, q = draw_small(f[0] @ self.lm_rows.T, self.eagle.vocab, self.vocab_size, sampler, generator)
                tokens += t
                if q is not None:
                    qs.append(q)
                if t[0] in self.stop or i + 1 == gamma:  # the last guess need not be fed
                    break
                f = self.eagle(f, self._embed(t), self.cache)
        finally:
            self.cache.crop(verified)  # the guesses' entries: next round feeds the target's own states
        return Proposal(tokens, torch.cat(qs) if qs else None)
