"""Every public entry point moves its inputs to the model's device, checked without a GPU: a spy
model that says it lives on torch's 'meta' device records where its inputs arrive."""
import ast

import pytest
import torch
from torch import nn

from inference_internals.cuda_graph import generate_graphed
from inference_internals.device import max_activation
from inference_internals.drafts import PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.timing import time_decode_step, time_prefill
from inference_internals.analysis.logit_lens import logit_lens
from inference_internals.model import LlamaConfig
from inference_internals.engine.llm_engine import LLMEngine
from inference_internals.params import SamplingParams
from inference_internals.sampling import Sampler
from inference_internals.speculative import speculative_generate

TINY = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


class Arrived(Exception):
    pass


class SpyModel(nn.Module):
    """Claims to live on 'meta' and stops at its first forward, reporting its inputs' devices."""
    config, dtype, device = TINY, torch.float32, torch.device("meta")

    def forward(self, input_ids, positions=None, **kw):
        raise Arrived([t.device.type for t in (input_ids, positions) if t is not None])


def _engine_step(model):
    """One engine step; the engine turns a request's error into that request's abort, so re-raise it."""
    engine = LLMEngine(model, num_blocks=8, block_size=4)
    req = engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    assert req.error and req.error.startswith("Arrived: "), req.error
    raise Arrived(ast.literal_eval(req.error.removeprefix("Arrived: ")))


ENTRY_POINTS = {
    "generate": lambda m: generate(m, [1, 2, 3], 4),
    "generate_graphed": lambda m: generate_graphed(m, [[1, 2, 3]], 4, graph=False),
    "logit_lens": lambda m: logit_lens(m, torch.tensor([[1, 2, 3]])),
    "logit_lens (lists)": lambda m: logit_lens(m, [[1, 2, 3]]),
    "paged engine": lambda m: _engine_step(m),
    "speculative": lambda m: speculative_generate(m, [1, 2, 3], PromptLookupDraft(2), 4),
    "time_prefill": lambda m: time_prefill(m, 4),
    "time_decode_step": lambda m: time_decode_step(m, 4),
    "max_activation": lambda m: max_activation(m, torch.tensor([[1, 2, 3]])),
}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_inputs_arrive_on_the_models_device(name):
    with pytest.raises(Arrived) as seen:
        ENTRY_POINTS[name](SpyModel())
    assert set(seen.value.args[0]) == {"meta"}, f"{name} fed the model tensors on {seen.value.args[0]}"


def test_a_sampler_generator_on_another_device_is_a_clear_error():
    logits = torch.zeros(1, 5, device="meta")
    with pytest.raises(ValueError, match="generator is on cpu but the logits are on meta"):
        Sampler(generator=torch.Generator()).generator_on(logits.device)


def test_a_seeded_sampler_keeps_one_generator_per_device():
    s = Sampler(temperature=1.0, seed=7)
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    first = s(logits)
    assert s.generator_on(torch.device("cpu")) is s.generator_on(torch.device("cpu"))
    assert torch.equal(Sampler(temperature=1.0, seed=7)(logits), first)  # each device starts from the seed
