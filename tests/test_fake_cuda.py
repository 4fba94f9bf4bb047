"""The GPU paths on fake CUDA, without a GPU: every tensor on the right device, and every host read listed.

``torch._subclasses.fake_tensor.FakeTensorMode`` runs ops on ``device="cuda:0"`` with no GPU and no
CUDA build: each op computes its output's shape, dtype and device and no data, and a CPU tensor
meeting a CUDA one raises the device-mismatch error a GPU would. So a decode step run this way
proves that nothing in it creates a tensor on the wrong device.

A read back to the host (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``torch.equal``) has no
value to give in fake mode. ``HostReads`` answers each one with a harmless dummy (0, False, zeros,
equal) and records where in the library it was made; on a GPU each of them is a wait for the
device. The tests assert the exact list that remains per step, and that it does not grow with the
number of layers. ``torch.cuda.synchronize`` (the timers') is recorded the same way.

The request's own checks at the door run on real CPU tensors, as they do on a GPU machine: they
read the prompt (a Python list) before anything reaches the device. Three things fake mode cannot do
on a CPU-only build are stood in for: indexing and ``copy_`` (their Python bindings ask for the real
device before dispatching) run as the aten ops they stand for, and a one-element ``torch.tensor``
is made outside inference mode. The device helper's refusal of "cuda" is lifted for these tests only.
"""
from __future__ import annotations

import contextlib
import sys
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from inference_internals import cuda_graph, device as device_mod, params
from inference_internals.cuda_graph import GraphDecoder, decode_seconds
from inference_internals.drafts import PromptLookupDraft
from inference_internals.generate import generate_stream
from inference_internals.model import LlamaConfig, random_model
from inference_internals.engine import LLMEngine
from inference_internals.params import SamplingParams
from inference_internals.speculative import speculative_generate

CUDA = torch.device("cuda:0")
LIB = Path(device_mod.__file__).resolve().parent


def tiny(layers: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)


def _site() -> str:
    """The innermost library frame of the current stack: 'module.py:function'."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename).resolve()
        if LIB in path.parents:
            return f"{path.relative_to(LIB)}:{frame.name}"
    return "outside the library"


def _zeros(shape):
    return 0 if not shape else [_zeros(shape[1:]) for _ in range(shape[0])]


A = torch.ops.aten


def _basic(t, idx):
    """Apply the ints, slices and Nones of index ``idx`` to ``t`` with view ops; returns the view and
    the tensor indices left for ``aten.index``, one per remaining dim (None: all of it)."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    if any(i is Ellipsis for i in idx):
        at = next(k for k, i in enumerate(idx) if i is Ellipsis)
        used = sum(1 for i in idx if i is not None and i is not Ellipsis)
        idx = idx[:at] + (slice(None),) * (t.dim() - used) + idx[at + 1:]
    x, dim, tensors = t, 0, {}
    for i in idx:
        if i is None:
            x = x.unsqueeze(dim)
            dim += 1
        elif isinstance(i, int) and not isinstance(i, bool):
            x = x.select(dim, i)
        elif isinstance(i, slice):
            if i != slice(None):
                x = A.slice.Tensor(x, dim, i.start, i.stop, i.step or 1)
            dim += 1
        elif isinstance(i, torch.Tensor):
            tensors[dim] = i
            dim += 1
        else:
            raise TypeError(f"index {i!r} is not handled on fake CUDA")
    return x, [tensors.get(d) for d in range(max(tensors) + 1)] if tensors else []


def fake_getitem(t, idx):
    x, tensors = _basic(t, idx)
    return A.index.Tensor(x, tensors) if tensors else x


def fake_setitem(t, idx, value):
    x, tensors = _basic(t, idx)
    if not isinstance(value, torch.Tensor):
        value = torch.full((), value, dtype=x.dtype, device=x.device)
    if tensors:
        A.index_put_.default(x, tensors, value)
    else:
        A.copy_.default(x, value.expand_as(x))


class HostReads:
    """Record every read of a fake tensor back to the host (and every synchronize), answering
    with dummies; ``reads`` is the list of sites in order: 'module.py:function', or 'synchronize'."""

    def __init__(self, monkeypatch):
        self.reads: list[str] = []
        dummy = {"item": lambda t: False if t.dtype == torch.bool else 0, "tolist": lambda t: _zeros(list(t.shape)),
                 "__bool__": lambda t: False, "__int__": lambda t: 0, "__float__": lambda t: 0.0,
                 "__index__": lambda t: 0}

        def read(name):
            def fn(t, *args, **kwargs):
                self.record()
                return dummy[name](t)
            return fn

        # On FakeTensor itself: its own tolist() reads element by element, and real tensors stay as they are
        for name in dummy:
            monkeypatch.setattr(FakeTensor, name, read(name))
        # Indexing and copy_ go through Python bindings that ask for a real CUDA device before they
        # dispatch: on fake tensors they run as the aten ops they stand for.
        monkeypatch.setattr(FakeTensor, "__getitem__", fake_getitem)
        monkeypatch.setattr(FakeTensor, "__setitem__", fake_setitem)
        monkeypatch.setattr(FakeTensor, "copy_", lambda t, src, non_blocking=False: A.copy_.default(t, src))
        # Fake mode cannot make a tensor of one element or none from a list inside inference mode (a
        # scalar fast path asks for the real device): made outside it, the tensor is the same.
        tensor = torch.tensor

        def make_tensor(*args, **kwargs):
            with torch.inference_mode(False):
                return tensor(*args, **kwargs)
        monkeypatch.setattr(torch, "tensor", make_tensor)
        equal = torch.equal
        monkeypatch.setattr(torch, "equal", lambda a, b: (self.record(), True)[1]
                            if isinstance(a, FakeTensor) or isinstance(b, FakeTensor) else equal(a, b))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.record("synchronize"))

    def record(self, site: str | None = None) -> None:
        self.reads.append(site or _site())

    def since(self, n: int) -> Counter:
        return Counter(self.reads[n:])


@pytest.fixture
def fake(monkeypatch):
    """Fake CUDA for one test: FakeTensorMode, host reads recorded, the door's checks on real
    tensors, and the device helper's refusal of 'cuda' (no GPU here) lifted for this test only."""
    reads = HostReads(monkeypatch)
    real_check = params.check_token_ids

    def door(*args, **kwargs):
        with unset_fake_temporarily():
            ids = real_check(*args, **kwargs).tolist()
        return torch.tensor(ids, dtype=torch.long)  # the checked ids, as a (fake) CPU tensor

    for mod in list(sys.modules.values()):  # params itself, and every module that imported the check by name
        if mod is not None and mod.__name__.startswith("inference_internals") and \
                getattr(mod, "check_token_ids", None) is real_check:
            monkeypatch.setattr(mod, "check_token_ids", door)
    real_get = device_mod.get_device

    def get_device(name=None):
        return CUDA if name is None or str(name).startswith("cuda") else real_get(name)

    for mod in list(sys.modules.values()):  # the helper, and every module that imported it by name (the caches)
        if mod is not None and mod.__name__.startswith("inference_internals") and \
                getattr(mod, "get_device", None) is real_get:
            monkeypatch.setattr(mod, "get_device", get_device)
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield reads


def fake_model(layers: int = 2):
    """Random weights made on the CPU (real), then moved to the device the helper picks: fake CUDA."""
    with unset_fake_temporarily():
        model = random_model(tiny(layers), seed=0, device="cpu")
    # No gradients: with autograd on, a device mismatch on a fake CUDA parameter aborts the process
    # (autograd's error path asks for a real CUDA device) instead of raising.
    model = model.requires_grad_(False).to(device_mod.get_device("cuda"))
    assert isinstance(model.embed_tokens.weight, FakeTensor) and model.device == CUDA
    return model


PROMPTS = [[5, 17, 3, 9, 5, 17], [1, 2, 3, 4, 1, 2], [60, 61, 5, 17, 60, 61]]


def plain_decode_reads(reads, layers: int, steps: int = 4) -> list[Counter]:
    """The host reads of each decode step of ``generate`` (one sampled token per row per step)."""
    model = fake_model(layers)
    stream = generate_stream(model, PROMPTS, steps + 1)  # stopping at EOS (2): the dummy tokens are 0
    first = next(stream)  # the prefill and the first token
    assert first.device == CUDA and first.shape == (3,)
    per_step = []
    for _ in range(steps):
        n = len(reads.reads)
        assert next(stream).device == CUDA
        per_step.append(reads.since(n))
    return per_step


def engine_reads(reads, layers: int, steps: int = 6, **layout) -> list[tuple[str, Counter]]:
    """(step kind, host reads) for each step of the paged engine serving PROMPTS greedily."""
    engine = LLMEngine(fake_model(layers), num_blocks=16, block_size=4, **layout)
    assert engine.cache.k.device == CUDA
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    out = []
    while engine.has_unfinished():
        n = len(reads.reads)
        engine.step()
        out.append((engine.stats[-1].kind, reads.since(n)))
    # the engine turns a forward's exception (a device mismatch among them) into its request's error
    assert [r.error for r in engine.requests] == [None] * len(PROMPTS)
    return out


def test_plain_decode_step_runs_on_fake_cuda_with_one_read_per_step(fake):
    for layers in (2, 4):
        per_step = plain_decode_reads(fake, layers)
        # the stop check: has every row stopped? Nothing in the model's forward reads back.
        assert per_step == [Counter({"generate.py:decode_loop": 1})] * len(per_step), (layers, per_step)


@pytest.mark.parametrize("layout", [{}, {"packed": True}, {"attention": "in_place"}],
                         ids=["padded", "packed", "in-place"])
def test_paged_engine_step_reads_the_sampled_tokens_once(fake, layout):
    runs = {layers: engine_reads(fake, layers, **layout) for layers in (2, 4)}
    assert runs[2] == runs[4]  # the same reads whatever the depth: none per layer
    decode = [c for kind, c in runs[2] if kind == "decode"]
    assert len(decode) >= 4
    # one read of the step's tokens, and the step timer's synchronize (already idle by then)
    assert all(c == Counter({"engine/llm_engine.py:_sample": 1, "synchronize": 1}) for c in decode), decode
    assert all(sum(c.values()) <= 2 for _, c in runs[2]), runs[2]


def test_speculative_round_reads_the_targets_choices_once(fake):
    model = fake_model(2)
    n = len(fake.reads)
    res = speculative_generate(model, PROMPTS[0] * 3, PromptLookupDraft(2), 8)
    assert len(res.rounds) >= 2
    reads = fake.since(n)
    rounds = len(res.rounds) + 1  # the prefill's pass chooses too
    # per pass: the target's greedy choices (one .tolist()) and its timer's two synchronizes; per round
    # also the draft's timer. Once per request: the prompt's ids, from the CPU tensor the door checked.
    assert reads == Counter({"speculative.py:choose": rounds, "synchronize": 2 * rounds + 2 * len(res.rounds),
                             "speculative.py:speculative_generate": 1}), reads


def test_cuda_graph_step_python_on_fake_cuda(fake, monkeypatch):
    model = fake_model(2)
    eager = GraphDecoder(model, 2, 24, graph=False)
    logits = eager.prefill(PROMPTS[:2])
    n = len(fake.reads)
    out = eager.step(logits.argmax(-1))
    assert out.device == CUDA and out.shape == (2, 97) and fake.since(n) == Counter()

    # The capture's Python, with torch.cuda's stream and graph calls replaced by stand-ins that
    # record what runs inside the captured region (a real capture refuses any host read there).
    captured = []

    class Graph:
        def replay(self):
            captured.append("replay")

    @contextlib.contextmanager
    def graph(g):
        start = len(fake.reads)
        captured.append("capture")
        yield
        assert fake.reads[start:] == [], f"host reads inside a captured region: {fake.reads[start:]}"

    stream = type("Stream", (), {"wait_stream": lambda self, other: None})()
    for name, value in {"Stream": lambda: stream, "stream": lambda s: contextlib.nullcontext(),
                        "current_stream": lambda: stream,
                        "CUDAGraph": Graph, "graph": graph}.items():
        monkeypatch.setattr(torch.cuda, name, value, raising=False)
    dec = GraphDecoder(model, 2, 24)
    logits = dec.prefill(PROMPTS[:2])
    n = len(fake.reads)
    seconds = decode_seconds(dec, 3)
    assert captured == ["capture", "replay", "replay", "replay"] and dec.length == len(PROMPTS[0]) + 3
    assert seconds >= 0 and fake.since(n) == Counter({"synchronize": 2})  # the timer's two, nothing per step
    assert dec.out.device == CUDA and dec.out.shape == (2, 97)


def test_a_cpu_tensor_in_a_cuda_step_is_caught(fake):
    """The check these tests rest on: fake CUDA refuses a CPU tensor as a GPU would."""
    model = fake_model(2)
    with pytest.raises(Exception, match="device"):
        model.lm_head(torch.zeros(1, 32, device="cpu"))
    assert cuda_graph.StaticKVCache(model.config, 1, 8, CUDA, model.dtype).k.device == CUDA
