"""The logit lens: read the model's next-token guess out of the residual stream after every layer.

Every block adds its output to one running vector per token (the residual stream), and the
model turns only the last one into a prediction: final RMSNorm, then the LM head. Applying
that same read-out to the stream after each earlier block shows how the prediction forms
with depth (nostalgebraist, 2020:
https://www.lesswrong.com/posts/AcKRB8wDpdaN6v6ru/interpreting-gpt-the-logit-lens).
"""
from __future__ import annotations

import torch


@torch.no_grad()
def logit_lens(model, input_ids, position: int = -1) -> torch.Tensor:
    """Logits [n_layers + 1, batch, vocab] at ``position``, read after each stage, for
    ``input_ids`` [batch, seq] (a tensor on any device, or nested lists).

    Row 0 reads the embedding, row i the stream after block i; the last row is the model's
    own output (its stream is already normed, so it is not normed twice).
    """
    input_ids = torch.as_tensor(input_ids, device=model.device)  # a list or CPU ids for a CUDA model
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
    T = input_ids.shape[1]
    if not -T <= position < T:
        raise ValueError(f"position {position} is outside a sequence of {T} tokens")
    _, hidden = model(input_ids, output_hidden_states=True, last_only=True)
    streams = torch.stack([h[:, position] for h in hidden])  # [L + 1, B, d]
    normed = torch.cat([model.norm(streams[:-1]), streams[-1:]])
    return model.lm_head(normed)


def first_layer_predicting(lens: torch.Tensor, token: torch.Tensor | int | None = None) -> torch.Tensor:
    """For each batch row, the first row of ``lens`` whose top-1 token is ``token``
    (default: the model's final prediction, which the last row always makes).
    -1 where no layer predicts it."""
    if lens.dim() != 3:
        raise ValueError(f"expected lens logits [layers, batch, vocab], got {tuple(lens.shape)}")
    top = lens.argmax(dim=-1)                                   # [L + 1, B]
    target = top[-1] if token is None else torch.as_tensor(token, device=lens.device).expand(top.shape[1])
    hit = top == target
    first = hit.int().argmax(dim=0)                             # first True (0 if none)
    return torch.where(hit.any(dim=0), first, torch.full_like(first, -1))
