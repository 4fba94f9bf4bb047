"""Train the EAGLE draft of ``drafts.Eagle`` on the model's own greedy output.

    python -m inference_course.train_eagle          # writes src/inference_internals/data/eagle.pt

1. Greedy-generate from the MTP heads' training prompts (``train_mtp.training_prompts``: open questions
   and tasks on a given passage, none among the course's evaluation prompts), batched with left padding
   through Hugging Face's ``generate``, keeping the final hidden state at every position, the prompt's too.
2. Each sequence is one example: at position p the layer reads (h_p, token p+1) and must give the
   next token p+2 and the target's next state h_{p+1}, at every position at once (causal attention),
   as it will at the first guess of a round. The loss counts the tokens the model wrote, not the prompt's.
3. AdamW on the layer and its input projection; the target's embedding and LM head stay frozen. It predicts
   over the 2,048 tokens the model wrote most often (the frequency-ranked vocabulary of the MTP heads).

Seeded and deterministic on one machine; sized to take under 15 minutes on 2 CPU cores.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inference_internals.drafts import EAGLE_PATH, Eagle

from .train_mtp import N_PROMPTS, arguments, draft_vocabulary, generate_sequences, run_cost, training_prompts

FEATURE_WEIGHT = 1.0  # the loss on the predicted state beside the token's cross-entropy (EAGLE's regression)
NOISE = 0.1  # uniform noise added to the states it trains on, U(-0.1, 0.1) as EAGLE's
WEIGHT_DECAY = 0.1


def batches(examples, size: int, order: torch.Tensor):
    """Padded training batches: H [B, T, D] (states at 0..T-1), X [B, T] (the tokens they chose),
    Y [B, T] (the token after those: the target, -1 where there is none or it is the prompt's),
    F [B, T, D] (the next state) and M [B, T] (whether a next state exists)."""
    for i in range(0, len(order), size):
        chunk = [examples[j] for j in order[i:i + size]]
        T = max(len(h) for _, h, _ in chunk)
        D = chunk[0][1].shape[1]
        H, Fs = torch.zeros(len(chunk), T, D), torch.zeros(len(chunk), T, D)
        X, Y = torch.zeros(len(chunk), T, dtype=torch.long), torch.full((len(chunk), T), -1, dtype=torch.long)
        M = torch.zeros(len(chunk), T, dtype=torch.bool)
        for b, (tokens, hidden, n_prompt) in enumerate(chunk):
            n = len(hidden)                  # positions 0..n-1; token p+1 chosen by hidden[p]
            H[b, :n], X[b, :n] = hidden, tokens[1:n + 1]
            Y[b, :n - 1] = tokens[2:n + 1]
            Y[b, :max(n_prompt - 2, 0)] = -1  # targets inside the prompt
            Fs[b, :n - 1], M[b, :n - 1] = hidden[1:], True
        yield H, X, Y, Fs, M


def first_guess_accuracy(eagle: Eagle, embed, lm_rows, to_small, examples, size: int = 16) -> float:
    """Top-1 accuracy of the layer's guess of each written token, fed the target's own states (every
    guess a first guess of a round)."""
    right = total = 0
    with torch.no_grad():
        for H, X, Y, _, _ in batches(examples, size, torch.arange(len(examples))):
            pred = (eagle(H, embed[X]) @ lm_rows.T).argmax(-1)
            keep = Y >= 0
            right += int((pred == to_small[Y.clamp_min(0)])[keep].sum())
            total += int(keep.sum())
    return right / max(total, 1)


def fit(train_set, valid, reference, epochs: int = 8, lr: float = 1e-3, train_batch: int = 16,
        vocab_size: int = 2048, seed: int = 0, progress: bool = True) -> tuple[Eagle, dict]:
    """Train a fresh layer on ``train_set`` (``generate_sequences``'s), scored on ``valid`` after each epoch."""
    from tqdm.auto import tqdm

    from inference_internals.model import LlamaConfig

    torch.manual_seed(seed)
    # the tokens the model wrote (the loss's targets), ranked by count: the draft vocabulary
    written = torch.cat([tokens[n_prompt:] for tokens, _, n_prompt in train_set])
    vocab, to_small, coverage = draft_vocabulary(written, reference.config.vocab_size, vocab_size)

    embed = reference.get_input_embeddings().weight.detach().float().cpu()
    lm_rows = reference.get_output_embeddings().weight.detach().float().cpu()[vocab]
    eagle = Eagle(LlamaConfig.from_json(Path(reference.config.name_or_path) / "config.json"), vocab)
    with torch.no_grad():
        # It starts as the identity on h (up to its scale): fc passes the state through and the block's two
        # residual branches add nothing (their output projections zero), so its first guesses are the target's
        # own choice one position late, and training learns the correction (the MTP heads start as the LM head).
        D = eagle.fc.out_features
        eagle.fc.weight[:, :D].copy_(torch.eye(D))
        eagle.fc.weight[:, D:].mul_(0.1)
        eagle.fc.bias.zero_()
        eagle.layer.self_attn.o_proj.weight.zero_()
        eagle.layer.mlp.down_proj.weight.zero_()
    untrained = first_guess_accuracy(eagle, embed, lm_rows, to_small, valid)
    params = [p for p in eagle.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY)
    steps = epochs * ((len(train_set) + train_batch - 1) // train_batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    bar = tqdm(total=steps, desc="train", disable=not progress)
    curve = []
    for epoch in range(epochs):
        # similar lengths together: less padding; the order of the chunks is shuffled
        by_len = sorted(range(len(train_set)), key=lambda j: len(train_set[j][1]))
        chunks = [by_len[i:i + train_batch] for i in range(0, len(by_len), train_batch)]
        order = torch.tensor([j for c in torch.randperm(len(chunks), generator=g).tolist() for j in chunks[c]])
        losses = []
        for H, X, Y, Fs, M in batches(train_set, train_batch, order):
            # noise on the states it reads (EAGLE's): past the first guess it reads its own, imperfect ones
            H = H + NOISE * (2 * torch.rand(H.shape, generator=g) - 1)
            f = eagle(H, embed[X])
            target = to_small[Y.clamp_min(0)].masked_fill(Y < 0, -1)
            ce = F.cross_entropy((f @ lm_rows.T).flatten(0, 1), target.flatten(), ignore_index=-1)
            reg = F.smooth_l1_loss(f[M], Fs[M])
            loss = ce + FEATURE_WEIGHT * reg
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            bar.update()
            bar.set_postfix(ce=f"{ce.item():.3f}", reg=f"{reg.item():.3f}")
            losses.append(ce.item())
        curve.append({"epoch": epoch + 1, "train_ce": round(sum(losses) / len(losses), 4),
                      "held_out_first_guess": round(first_guess_accuracy(eagle, embed, lm_rows, to_small, valid), 4)})
    bar.close()
    return eagle, {"epochs": epochs, "lr": lr, "vocab": len(vocab), **coverage,
                   "untrained_first_guess": round(untrained, 4), "curve": curve,
                   "held_out_first_guess": curve[-1]["held_out_first_guess"] if curve else round(untrained, 4),
                   "parameters": sum(p.numel() for p in params)}


def train(seed: int = 0, n_prompts: int = N_PROMPTS, max_new_tokens: int = 64, batch_size: int = 48,
          epochs: int = 8, lr: float = 1e-3, train_batch: int = 16, vocab_size: int = 2048,
          out=EAGLE_PATH, progress: bool = True, reference=None, tokenizer=None) -> dict:
    """Generate the data, train the layer, save it to ``out``; returns the run's metadata."""
    from inference_internals.model import load_reference, load_tokenizer

    t0, cpu0 = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    ref = reference if reference is not None else load_reference()
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    prompts = training_prompts(n_prompts, seed)
    n_valid = max(1, len(prompts) // 10)  # a held-out tenth, to report an honest accuracy
    examples = generate_sequences(ref, tok, prompts, max_new_tokens, batch_size, progress)
    t_gen = time.perf_counter() - t0
    eagle, fitted = fit(examples[n_valid:], examples[:n_valid], ref, epochs, lr, train_batch, vocab_size, seed,
                        progress)
    meta = {"seed": seed, "prompts": len(prompts), "held_out_prompts": n_valid,
            "train_sequences": len(examples) - n_valid, "max_new_tokens": max_new_tokens, **fitted,
            **run_cost(t0, cpu0, t_gen)}
    eagle.save(out, meta)
    return meta


def main(argv=None) -> None:
    ap = arguments(__doc__, epochs=8, out=EAGLE_PATH)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args(argv)
    meta = train(seed=args.seed, n_prompts=args.prompts, max_new_tokens=args.new_tokens, epochs=args.epochs,
                 lr=args.lr, vocab_size=args.vocab, out=args.out)
    print(f"wrote {args.out}: {meta}")


if __name__ == "__main__":
    main()
