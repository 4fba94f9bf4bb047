"""Chapter 6's code exercises: greedy acceptance of a draft and speculative sampling's
accept / resample step, graded against ``speculative.greedy_accept`` and
``speculative.rejection_accept`` (the same seeded draws, so the same tokens)."""
from __future__ import annotations

import torch

from ..code_exercises import Case, CodeExercise
from inference_internals.speculative import greedy_accept, rejection_accept


# --- 1. Greedy acceptance -----------------------------------------------------------------------

def reference_greedy_accept(drafted: list[int], target_choice: list[int]) -> tuple[int, int]:
    return greedy_accept(drafted, target_choice)


def _greedy_cases() -> list[Case]:
    def case(label, drafted, target):
        return Case(label, lambda: (list(drafted), list(target)),
                    inputs=f"drafted={drafted}, target_choice={target}")
    return [
        case("all 3 guesses right: a bonus token", [5, 6, 7], [5, 6, 7, 8]),
        case("the first guess is wrong", [5, 6, 7], [9, 6, 7, 8]),
        case("wrong at position 1", [5, 6, 7], [5, 9, 7, 8]),
        case("a match after a mismatch does not count", [5, 6, 7, 8], [5, 1, 7, 8, 2]),
        case("the last guess is wrong", [1, 2], [1, 3, 4]),
        case("no draft (γ = 0): the target's own token", [], [3]),
        case("a repeated token", [4, 4, 4], [4, 4, 5, 6]),
        case("target_choice one token short: an error", [1, 2], [1, 2]),
        case("target_choice one token long: an error", [1, 2], [1, 2, 3, 4]),
        case("target_choice much too long, first guess wrong: an error", [1], [9, 8, 7, 6]),
    ]


greedy_exercise = CodeExercise(
    title="Accept a draft, greedily",
    prompt=("The draft guessed `drafted` (γ tokens); one target pass gave `target_choice`, the target's "
            "argmax after the context plus `drafted[:i]`, for i = 0 … γ (γ + 1 tokens). Accept the "
            "longest prefix of the guesses that equals the target's choices, and return "
            "`(n_accepted, next_token)`: the target's correction at the first mismatch, or its bonus "
            "token `target_choice[γ]` when every guess matched. Lengths that do not fit raise an error."),
    name="accept_greedy",
    stub='''def accept_greedy(drafted, target_choice):
    """drafted: γ ints; target_choice: γ + 1 ints. Returns (number accepted, next token)."""
    raise NotImplementedError("your code here")
''',
    solution='''def accept_greedy(drafted, target_choice):
    if len(target_choice) != len(drafted) + 1:
        raise ValueError(f"need {len(drafted) + 1} target tokens, got {len(target_choice)}")
    n = 0
    while n < len(drafted) and drafted[n] == target_choice[n]:
        n += 1
    return n, target_choice[n]
''',
    hint=("Walk while drafted[n] == target_choice[n]; stop at the first mismatch. target_choice[n] is "
          "then the correction, or the bonus when n = γ."),
    reference=reference_greedy_accept,
    cases=_greedy_cases,
)


# --- 2. The rejection-sampling step -------------------------------------------------------------

def reference_rejection(drafted, q, p, generator):
    return rejection_accept(drafted, q, p, generator)


def _dist(seed: int, rows: int, vocab: int, sharp: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g, dtype=torch.float64) * sharp).softmax(-1)


def _rejection_cases() -> list[Case]:
    def case(label, drafted, q, p, seed):
        def make():
            return (list(drafted), None if q is None else q.clone(), p.clone(),
                    torch.Generator().manual_seed(seed))
        return Case(label, make, inputs=(f"drafted={drafted}, q={'None' if q is None else f'[{len(drafted)}, {p.shape[1]}]'}, "
                                         f"p=[{p.shape[0]}, {p.shape[1]}], generator seeded {seed}"))
    V = 6
    cases = []
    for seed in range(10):
        q, p = _dist(seed, 4, V), _dist(seed + 100, 5, V)
        drafted = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed)).squeeze(1).tolist()
        cases.append(case(f"random γ = 4, seed {seed}", drafted, q, p, seed))
    same = _dist(7, 3, V)
    zero_p = _dist(8, 3, V)
    zero_p[0, 2] = 0
    zero_p[0] /= zero_p[0].sum()
    one_hot_p = _dist(9, 3, V)
    return cases + [
        case("p = q: every guess is accepted, then a bonus", [1, 4], same[:2], same, 3),
        case("the target gives the first guess probability 0: rejected at position 0",
             [2, 0], _dist(10, 2, V), zero_p, 4),
        case("a deterministic draft (q = None)", [3, 1], None, one_hot_p, 5),
        case("no draft (γ = 0): the bonus only", [], torch.zeros(0, V, dtype=torch.float64), _dist(11, 1, V), 6),
    ] + [case(f"a deterministic draft, seed {s}", [0, 5, 2], None, _dist(20 + s, 4, V), s) for s in range(4)]


rejection_exercise = CodeExercise(
    title="Speculative sampling's accept / resample step",
    prompt=("The draft drew guess $d_i$ from its distribution $q_i$ (row `i` of `q`, `[γ, V]`; `q` is None "
            "for a deterministic draft, i.e. one-hot at $d_i$); the target's distributions are `p` "
            "`[γ + 1, V]`. For i = 0 … γ−1: draw `u = torch.rand((), generator=generator, dtype=p.dtype)` "
            "and accept $d_i$ if $u \\cdot q_i(d_i) < p_i(d_i)$ (that is $u < p/q$). At the first rejection "
            "return `(i, draw(residual, generator))` with residual $= \\max(0, p_i - q_i)$ normalised; "
            "if all γ are accepted return `(γ, draw(p[γ], generator))`. Use the library's "
            "`draw(probs, generator)` for every draw, in this order, so your tokens match its tokens."),
    name="accept_sampled",
    stub='''import torch
from inference_internals.speculative import draw

def accept_sampled(drafted, q, p, generator):
    """drafted: γ ints; q: [γ, V] or None; p: [γ + 1, V]. Returns (number accepted, next token)."""
    raise NotImplementedError("your code here")
''',
    solution='''import torch
from inference_internals.speculative import draw

def accept_sampled(drafted, q, p, generator):
    for i, x in enumerate(drafted):
        qi = q[i] if q is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[1]).to(p.dtype)
        u = torch.rand((), generator=generator, dtype=p.dtype)
        if u * qi[x] < p[i, x]:
            continue
        residual = (p[i] - qi).clamp_min(0)
        return i, draw(residual / residual.sum(), generator)
    return len(drafted), draw(p[-1], generator)
''',
    hint=("Accept with probability min(1, p/q): `u * q_i[x] < p_i[x]`. After a rejection draw from "
          "clamp_min(p_i − q_i, 0), not from p_i; a None q is one-hot at the guess; the bonus comes from p's "
          "last row."),
    reference=reference_rejection,
    cases=_rejection_cases,
)

CODE_EXERCISES = [greedy_exercise, rejection_exercise]
