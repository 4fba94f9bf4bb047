"""Chapter 6 exercises: speculative decoding. Every expected answer is computed by the formulas
in ``speculative`` (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192)."""
from __future__ import annotations

import torch

from ..exercises import Exercise, integer, number
from inference_internals.speculative import best_gamma, expected_speedup, expected_tokens_per_pass, residual

# 1. Expected tokens per target pass.
ALPHA, GAMMA = 0.8, 4
tokens_answer = expected_tokens_per_pass(ALPHA, GAMMA)
tokens_per_pass_exercise = Exercise(
    title="Tokens per target pass",
    prompt=(f"A draft's guesses are each accepted with probability α = {ALPHA}, independently. "
            f"It proposes γ = {GAMMA} tokens a round. How many tokens does one target pass "
            "produce on average (the accepted guesses plus the target's own token)?"),
    check=number(tokens_answer, rel=0.01),
    hint="The round yields at least 1 token; it yields more than i tokens when the first i guesses "
         "were all accepted, which happens with probability α^i. Add these up for i = 0..γ.",
    solution=(f"E[tokens] = 1 + α + α² + … + α^γ = (1 − α^(γ+1)) / (1 − α) = "
              f"(1 − {ALPHA}^{GAMMA + 1}) / (1 − {ALPHA}) = **{tokens_answer:.3f}**.\n\n"
              f"```python\nspeculative.expected_tokens_per_pass({ALPHA}, {GAMMA})\n```"),
    placeholder="tokens, e.g. 2.5",
)

# 2. The best γ for a draft cost ratio.
B_ALPHA, COST = 0.8, 0.1
gamma_answer = best_gamma(B_ALPHA, COST)
best_gamma_exercise = Exercise(
    title="How many tokens to draft",
    prompt=(f"A draft costs c = {COST} of a target pass per guess and its guesses are accepted with "
            f"probability α = {B_ALPHA}. A round of γ guesses costs γ·c + 1 target passes (assume the "
            "verification pass costs one decode step, whatever γ). Which γ gives the largest wall-clock "
            "speedup over plain decoding?"),
    check=integer(gamma_answer),
    hint="Speedup(γ) = (1 − α^(γ+1)) / ((1 − α)(γc + 1)). Tabulate it for γ = 1, 2, … and watch it "
         "rise, peak and fall: each extra guess is accepted with probability α^γ but always costs c.",
    solution=(f"Speedups for γ = 1..8: "
              + ", ".join(f"{expected_speedup(B_ALPHA, g, COST):.3f}" for g in range(1, 9))
              + f". The peak is at **γ = {gamma_answer}** "
              f"({expected_speedup(B_ALPHA, gamma_answer, COST):.2f}×).\n\n"
              f"```python\nspeculative.best_gamma({B_ALPHA}, {COST})\n```"),
    placeholder="a whole number",
)

# 3. The acceptance rate of a draft distribution.
P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
acceptance_answer = float(torch.minimum(P, Q).sum())
acceptance_exercise = Exercise(
    title="How often is a guess accepted?",
    prompt=(f"Over three tokens A, B, C the target's next-token distribution is p = {P.tolist()} and the "
            f"draft's is q = {Q.tolist()}. The draft samples a guess x from q and it is accepted with "
            "probability min(1, p(x)/q(x)). What is the probability that the guess is accepted?"),
    check=number(acceptance_answer, rel=0.01),
    hint="Sum over x of q(x)·min(1, p(x)/q(x)), which is the sum of min(p(x), q(x)).",
    solution=(f"Σ min(p, q) = {' + '.join(f'{v:.1f}' for v in torch.minimum(P, Q).tolist())} = "
              f"**{acceptance_answer:.1f}**. It is 1 minus the total-variation distance between p and q, "
              "so the closer the draft imitates the target, the more often it is kept."),
    placeholder="a probability",
)

# 4. Why the residual restores p.
resample = residual(P, Q)
residual_answer = float(resample[0])
residual_exercise = Exercise(
    title="Why rejection sampling keeps the target distribution",
    prompt=(f"Same p = {P.tolist()} and q = {Q.tolist()}. Token A is output through acceptance with "
            f"probability q(A)·min(1, p(A)/q(A)) = {min(P[0], Q[0]).item():.1f}, but the target wants "
            f"p(A) = {P[0].item():.1f}. After a rejection (probability {1 - acceptance_answer:.1f}) the "
            "token is resampled from a distribution r. What must r(A) be so that A comes out with "
            "probability exactly p(A)?"),
    check=number(residual_answer, rel=0.01),
    hint="Solve min(p(A), q(A)) + P(reject)·r(A) = p(A) for r(A). Then check that "
         "r = norm(max(0, p − q)) gives the same number.",
    solution=(f"r(A) = (p(A) − min(p(A), q(A))) / P(reject) = ({P[0].item():.1f} − {min(P[0], Q[0]).item():.1f}) / "
              f"{1 - acceptance_answer:.1f} = **{residual_answer:.1f}**. In general "
              "min(p, q) + (1 − Σ min(p, q))·norm(max(0, p − q)) = min(p, q) + max(0, p − q) = p "
              "for every token, because Σ max(0, p − q) = 1 − Σ min(p, q). The draft decides only *which* "
              "way a token arrives, never *how often*: the output is distributed as p whatever q is. "
              f"Here r = norm(max(0, p − q)) = {[round(v, 3) for v in resample.tolist()]}: all the missing "
              "mass is A's, because q over-proposes B and matches C."),
    placeholder="a probability",
)

EXERCISES = [tokens_per_pass_exercise, best_gamma_exercise, acceptance_exercise, residual_exercise]
