"""The library's device paths on a real GPU (`-m cuda`; skipped on a machine without CUDA).

The models are fp64 on both devices, except RMSNorm, which computes in fp32 whatever the dtype
(model.py): each norm rounds to fp32, and the CPU's and the GPU's fp32 norms may round differently.
That moves this model's logits by under 1e-6 (fp32 norms against fp64 ones, measured on the CPU:
6.5e-7, largest logit 3.8), so logits are compared to 1e-5 and tokens exactly: ``pair`` checks that
the greedy choices of these prompts never come within 1e-4 of a tie (measured: 1.4e-4, 200x the
shift), so a token that differs is a device bug, not a near-tie broken by rounding.
"""
import pytest
import torch

from inference_internals.cuda_graph import GraphDecoder, generate_graphed
from inference_internals.drafts import PromptLookupDraft
from inference_internals.generate import generate
from inference_internals.analysis.logit_lens import logit_lens
from inference_internals.model import LlamaConfig, random_model
from inference_internals.engine import LLMEngine
from inference_internals.params import SamplingParams
from inference_internals.sampling import Sampler
from inference_internals.speculative import speculative_generate

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
PROMPTS = [[5, 17, 3, 9], [1, 2, 3, 4], [60, 61, 5, 17]]


FP32_NORMS = dict(rtol=1e-5, atol=1e-5)  # the fp32 rounding of the norms (see above), with 15x room


def smallest_top2_gap(model, prompts, n: int) -> float:
    """The smallest gap between the best and second-best logit along greedy generation."""
    gaps = []
    with torch.no_grad():
        for p, t in zip(prompts, generate(model, prompts, n, stop_ids=[])):
            top2 = model(torch.tensor([p + t]))[0, len(p) - 1:-1].topk(2, -1).values
            gaps.append(float((top2[:, 0] - top2[:, 1]).min()))
    return min(gaps)


@pytest.fixture(scope="module")
def pair():
    cpu = random_model(TINY, seed=0, device="cpu", dtype=torch.float64)
    assert smallest_top2_gap(cpu, PROMPTS, 40) > 10 * FP32_NORMS["atol"]  # no near-tie for rounding to break
    return cpu, random_model(TINY, seed=0, device="cuda", dtype=torch.float64)


def test_generate_takes_lists_and_cpu_tensors(pair):
    cpu, gpu = pair
    want = generate(cpu, PROMPTS, 20, stop_ids=[])
    assert generate(gpu, PROMPTS, 20, stop_ids=[]) == want
    assert generate(gpu, torch.tensor(PROMPTS), 20, stop_ids=[]) == want
    with torch.no_grad():
        torch.testing.assert_close(gpu(torch.tensor(PROMPTS)).cpu(), cpu(torch.tensor(PROMPTS)), **FP32_NORMS)


def test_logit_lens_takes_cpu_ids(pair):
    cpu, gpu = pair
    torch.testing.assert_close(logit_lens(gpu, torch.tensor(PROMPTS)).cpu(), logit_lens(cpu, torch.tensor(PROMPTS)),
                               **FP32_NORMS)


def test_one_seeded_sampler_serves_both_devices(pair):
    cpu, gpu = pair
    s = Sampler(temperature=1.0, seed=0)
    generate(cpu, PROMPTS[0], 5, s)
    assert len(generate(gpu, PROMPTS[0], 5, s)) == 5


def test_paged_engine_and_speculative_on_cuda(pair):
    _, gpu = pair
    want = generate(gpu, PROMPTS, 16, stop_ids=[])
    engine = LLMEngine(gpu, num_blocks=32, block_size=4)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == want
    for p, w in zip(PROMPTS, want):
        assert speculative_generate(gpu, p, PromptLookupDraft(2), 16, stop_ids=[]).tokens == w


def test_cuda_graph_decode_is_token_identical_to_eager(pair):
    _, gpu = pair
    for batch in (PROMPTS[:1], PROMPTS):
        want = generate(gpu, batch, 40, stop_ids=[])
        assert generate_graphed(gpu, batch, 40, stop_ids=[]) == want
        assert generate_graphed(gpu, batch, 40, stop_ids=[], graph=False) == want


def test_graph_replays_the_captured_step(pair):
    _, gpu = pair
    graphed, eager = GraphDecoder(gpu, 1, 32), GraphDecoder(gpu, 1, 32, graph=False)
    a, b = graphed.prefill([PROMPTS[0]]), eager.prefill([PROMPTS[0]])
    for _ in range(10):
        torch.testing.assert_close(a, b)
        a, b = graphed.step(a.argmax(-1)).clone(), eager.step(b.argmax(-1)).clone()
    assert graphed.graph is not None


def test_masked_gqa_attention_keeps_a_fused_kernel_and_the_same_result():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from inference_internals.kv_cache import KVCache

    m = random_model(TINY, seed=0, device="cuda", dtype=torch.float16)
    ids = torch.tensor(PROMPTS, device="cuda")
    cache = KVCache.for_model(m, 3, 12)
    with torch.no_grad():
        m(ids[:, :2], cache=cache)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # no math fallback allowed
            got = m(ids[:, 2:], cache=cache)  # two queries after two cached keys: a masked pass
        torch.testing.assert_close(got[:, -1], m(ids)[:, -1], atol=2e-2, rtol=2e-2)
