"""Chapter 2 exercises: merges by hand, why " RAG" splits where it does, top-p and temperature.
Every expected answer is computed by the library (``bpe``, ``sampling``), never typed in."""
from __future__ import annotations

import torch

from inference_internals.bpe import bpe, to_symbols
from ..exercises import Exercise, choice, number, sequence, word_set
from inference_internals.sampling import apply_temperature, top_p_filter

# 1. Two merges by hand.
TOY_WORD = "banana"
TOY_MERGES = [("a", "n"), ("b", "an")]
toy_tokens = bpe(TOY_WORD, {m: r for r, m in enumerate(TOY_MERGES)})
merges_exercise = Exercise(
    title="Apply two merges by hand",
    prompt=(f"A tokenizer has learned two merges, in this order: "
            + ", ".join(f"**{r + 1}.** `{a}` + `{b}`" for r, (a, b) in enumerate(TOY_MERGES))
            + f". Starting from the letters of `{TOY_WORD}`, BPE applies merge 1 everywhere it can, "
              "then merge 2. Which tokens come out? Type them separated by commas."),
    check=sequence(toy_tokens, parse=str),
    hint="Merge 1 turns every adjacent a, n into one symbol; merge 2 only fires where b is "
         "directly followed by that new symbol.",
    solution=(" → ".join(["`" + " ".join(TOY_WORD) + "`", "`b an an a`", "`" + " ".join(toy_tokens) + "`"])
              + f": **{', '.join(toy_tokens)}**. The second `an` has no `b` before it, so it stays, and "
                "the final `a` has no partner at all.\n\n```python\n"
                f"bpe('{TOY_WORD}', {{('a', 'n'): 0, ('b', 'an'): 1}})\n```"),
    placeholder="token, token, ...",
)


# 2. Why " RAG" splits as ĠR + AG: after the first merge, two merges compete.
def rag_exercise(tokenizer) -> Exercise:
    """Built from the model's own merge ranks, so it needs the tokenizer."""
    trace: list = []
    final = bpe(to_symbols(" RAG"), tokenizer.ranks, trace)
    (first, first_rank, after_first), (second, _, _) = trace[0], trace[1]
    candidates = list(zip(after_first, after_first[1:]))
    ranks = {p: tokenizer.ranks.get(p) for p in candidates}
    options = [" + ".join(p) for p in candidates]
    table = "\n".join(f"| `{a}` + `{b}` | {'none' if r is None else f'{r:,}'} |" for (a, b), r in ranks.items())
    return Exercise(
        title='Why " RAG" splits the way it does',
        prompt=(f'" RAG" starts as the byte symbols `Ġ R A G` (`Ġ` is the space). The lowest-ranked '
                f"merge, `{first[0]}` + `{first[1]}` (rank {first_rank:,}), fires first, leaving "
                f"`{' '.join(after_first)}`. Now these merges are candidates:\n\n"
                f"| pair | rank in SmolLM2's merges |\n|---|---|\n{table}\n\n"
                f"Which one applies next? Answer with one of: {', '.join(options)}."),
        check=choice(" + ".join(second), options, ignore_spaces=True),  # "A+G" is "A + G"
        hint="BPE does not look for the longest token: it always applies the merge that was learned "
             "first, i.e. the one with the lowest rank.",
        solution=(f"**{' + '.join(second)}** has the lower rank, so it wins: `{' '.join(final)}`. "
                  f"No learnt merge joins `{final[0]}` and `{final[1]}`, so BPE stops with "
                  f"{len(final)} tokens."
                  + "".join(f" `{a}{b}` is a token too, but its merge ranks later, and once `{second[0]}` "
                            f"joins `{second[1]}` the pair `{a}` + `{b}` no longer exists."
                            for a, b in candidates if (a, b) != second and (a, b) in tokenizer.ranks)),
        placeholder=options[0],
    )


# 3. Which tokens survive top-p = 0.9?
TOP_P = 0.9
CANDIDATES = {"Paris": 4.0, "London": 2.5, "Rome": 2.0, "Berlin": 1.0, "the": 0.0}
_logits = torch.tensor(list(CANDIDATES.values()))
_kept = torch.isfinite(top_p_filter(_logits, TOP_P))
top_p_survivors = [w for w, k in zip(CANDIDATES, _kept.tolist()) if k]
_probs = _logits.softmax(-1)


top_p_exercise = Exercise(
    title=f"Which tokens survive top-p = {TOP_P}?",
    prompt=("After \"The capital of France is\" a model gives these logits:\n\n"
            "| token | logit |\n|---|---|\n" + "\n".join(f"| {w} | {v:g} |" for w, v in CANDIDATES.items())
            + f"\n\nWhich tokens does top-p = {TOP_P} keep? Type them separated by commas."),
    # Order does not matter for a set of survivors.
    check=word_set(top_p_survivors, list(CANDIDATES), too_many="Too many tokens kept.",
                   too_few="Too few tokens kept."),
    hint="Softmax first (exp of each logit, divided by their sum), then add probabilities from the "
         f"most likely token down until the total reaches {TOP_P}; the token that crosses it is kept.",
    solution=("Probabilities: " + ", ".join(f"{w} {p:.3f}" for w, p in zip(CANDIDATES, _probs.tolist()))
              + f". Running total: " + ", ".join(f"{t:.3f}" for t in _probs.cumsum(0).tolist())
              + f". The total first reaches {TOP_P} at {top_p_survivors[-1]}, so the kept set is "
              f"**{', '.join(top_p_survivors)}**.\n\n```python\n"
              f"top_p_filter(torch.tensor({list(CANDIDATES.values())}), {TOP_P})\n```"),
    placeholder="word, word, ...",
)

# 4. Temperature reshapes the same logits.
TEMPERATURE = 0.5
p_london = apply_temperature(_logits, TEMPERATURE).softmax(-1)[list(CANDIDATES).index("London")].item()
temperature_exercise = Exercise(
    title="Temperature",
    prompt=(f"With the same logits, what probability does **London** get at temperature "
            f"T = {TEMPERATURE}? (At T = 1 it is {_probs[1]:.3f}.) Give a number between 0 and 1."),
    check=number(p_london, rel=0.02),
    hint="Divide every logit by T, then take the softmax. A lower T widens the gaps between logits.",
    solution=(f"Logits / {TEMPERATURE} = " + ", ".join(f"{v / TEMPERATURE:g}" for v in CANDIDATES.values())
              + f"; softmax gives London **{p_london:.4f}**. Halving T doubles the gaps between "
                f"logits, so Paris takes even more of the mass and London falls from {_probs[1]:.3f}."),
    placeholder="e.g. 0.12",
)


def exercises(tokenizer) -> list[Exercise]:
    """All four, in the chapter's order."""
    return [merges_exercise, rag_exercise(tokenizer), top_p_exercise, temperature_exercise]
