"""Chapter 1 exercises: the inference flow. Expected answers come from ``flops.param_counts``,
the model config, ``moe.predicted_flop_fraction`` and, for the logit lens, the lens itself."""
from __future__ import annotations

import torch

from ..exercises import Exercise, integer, number, sequence
from inference_internals.analysis.flops import param_counts
from inference_internals.analysis.logit_lens import first_layer_predicting
from inference_internals.model import LlamaConfig
from inference_internals.analysis.moe import predicted_flop_fraction

# 1. Parameters of Llama-3-8B from its published config.
LLAMA3_8B_SOURCE = "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json"
LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                        tie_word_embeddings=False)
llama3_params = param_counts(LLAMA3_8B)
llama3_total = sum(llama3_params.values())
_c = LLAMA3_8B
params_exercise = Exercise(
    title="Count Llama-3-8B",
    prompt=(f"Llama-3-8B's [config]({LLAMA3_8B_SOURCE}): hidden size {_c.hidden_size}, "
            f"{_c.num_hidden_layers} layers, {_c.num_attention_heads} query heads and "
            f"{_c.num_key_value_heads} K/V heads of dimension {_c.head_dim}, MLP intermediate size "
            f"{_c.intermediate_size}, vocabulary {_c.vocab_size}, and an LM head that is **not** tied to "
            "the embedding. The blocks are built like SmolLM2's (no biases). How many parameters "
            "does it have in total?"),
    check=number(llama3_total, rel=1e-3),
    hint="Per layer: q and o are d×d, k and v are d×(kv_heads·head_dim), the MLP is 3·d·intermediate, "
         "two norms of d. Then the embedding (vocab·d), the final norm (d), and the untied LM head (vocab·d).",
    solution=("\n".join(f"- {name}: {n:,}" for name, n in llama3_params.items())
              + f"\n\nTotal **{llama3_total:,}** (the \"8B\").\n\n```python\n"
                "sum(flops.param_counts(LLAMA3_8B).values())\n```"),
    placeholder="a number of parameters, e.g. 7.5e9 or 7.5B",
)


# 2. The shape of a tensor at a stage.
def key_shape(cfg: LlamaConfig, batch: int, tokens: int) -> list[int]:
    """``k`` in ``Attention.forward`` after RoPE, without a cache: [batch, kv_heads, tokens, head_dim]."""
    return [batch, cfg.num_key_value_heads, tokens, cfg.head_dim]


def shape_exercise(cfg: LlamaConfig, batch: int = 2, tokens: int = 7) -> Exercise:
    expected = key_shape(cfg, batch, tokens)
    return Exercise(
        title="The shape of the keys",
        prompt=(f"A batch of {batch} prompts of {tokens} tokens each goes through the model (no cache). "
                "In `Attention.forward`, what is the shape of `k` right after `apply_rope`? "
                "Answer as a comma-separated list, e.g. `1, 2, 3, 4`."),
        check=sequence(expected),
        hint=(f"k_proj maps {cfg.hidden_size} features to num_key_value_heads × head_dim; the view splits "
              "that into heads, and transpose(1, 2) moves the head axis before the token axis."),
        solution=(f"**{', '.join(map(str, expected))}** = [batch, K/V heads, tokens, head_dim]. "
                  f"Only {cfg.num_key_value_heads} K/V heads: with grouped-query attention each serves "
                  f"{cfg.n_rep} of the {cfg.num_attention_heads} query heads (q is "
                  f"[{batch}, {cfg.num_attention_heads}, {tokens}, {cfg.head_dim}])."),
        placeholder="e.g. 1, 2, 3, 4",
    )


# 3. The first layer whose logit lens already gives the final answer.
def lens_exercise(lens: torch.Tensor, prompt: str, answer: str) -> Exercise:
    """``lens``: ``logit_lens(model, ids)`` for ``prompt`` (batch 1); ``answer``: its final token."""
    if lens.dim() != 3 or lens.shape[1] != 1:
        raise ValueError(f"expected the lens of one prompt [layers, 1, vocab], got {tuple(lens.shape)}")
    first = int(first_layer_predicting(lens)[0])
    return Exercise(
        title="Where does the answer appear?",
        prompt=(f"For the prompt `{prompt!r}` the model predicts `{answer!r}`. Using `logit_lens`, find "
                "the first layer whose read-out already has that token on top (0 = the embedding, "
                f"i = after block i, {lens.shape[0] - 1} = the model's output)."),
        check=integer(first),
        hint="lens = logit_lens(model, ids); top = lens.argmax(-1)[:, 0]; look for the first index where "
             "top equals top[-1].",
        solution=(f"**{first}**.\n\n```python\nlens = logit_lens(model, ids)\ntop = lens.argmax(-1)[:, 0]\n"
                  "int((top == top[-1]).int().argmax())   # or first_layer_predicting(lens)\n```"),
        placeholder="a layer index",
    )


# 4. The compute of a routed MLP.
MOE_E, MOE_K = 8, 2
moe_fraction = predicted_flop_fraction(MOE_E, MOE_K, "gate")
moe_exercise = Exercise(
    title="What does the gate router cost?",
    prompt=(f"An MLP is split into {MOE_E} experts and each token goes to {MOE_K} of them, chosen by the "
            "norm of each expert's SiLU(gate) activations (the `gate` router). The gate projection "
            "therefore runs for every expert; up and down run only for the chosen ones. What fraction "
            "of the dense MLP's matmul FLOPs does a token cost?"),
    check=number(moe_fraction, rel=0.01),
    hint="gate, up and down each cost a third of the MLP. Which of them run for all experts, which for k of E?",
    solution=(f"1/3 (all gates) + 2/3 × {MOE_K}/{MOE_E} (up and down for the chosen experts) = "
              f"**{moe_fraction:.3f}**. Free routing would cost {MOE_K}/{MOE_E} = {MOE_K / MOE_E:.3f}, a saving "
              f"of {1 - MOE_K / MOE_E:.3f}; the gates spend {moe_fraction - MOE_K / MOE_E:.3f} of it: a third, "
              "whatever k and E, since the gate is a third of every expert. A trained MoE uses a tiny "
              "learned router instead "
              "(E dot products per token)."),
    placeholder="a fraction, e.g. 0.4 or 40%",
)

# The ones that need no model (the lens exercise is built in the notebook from its own lens).
EXERCISES = [params_exercise, shape_exercise(LlamaConfig()), moe_exercise]
