"""A GGUF file is a model at the door, as vLLM takes one (``LLM(model="x.gguf")``): checked as untrusted
input before anything is allocated, prepared once into the cache, and with ``quantization='q4_1'`` its own
blocks (Q4_1, or Q4_0: llama.cpp's repacked format) are the weights the block kernels multiply by."""
import numpy as np
import pytest
import torch

from inference_internals import LLM, SamplingParams
from inference_internals import gguf_blocks as gb
from inference_internals.optimize import QuantProjection, optimize
from inference_internals.weights import ModelNotFoundError, _sha256, gguf_path

gguf = pytest.importorskip("gguf")
LAYERS = 2  # SmolLM2's shapes and vocabulary, two of its layers: prepared in seconds


def write_copy(path, layers=LAYERS, kind=gguf.GGMLQuantizationType.Q4_0):
    """SmolLM2's GGUF cut to its first ``layers`` layers, every projection requantized to ``kind``
    (the gguf package's own quantizer), the rest (metadata, tokenizer, norms, the Q8_0 embedding) as is."""
    reader = gguf.GGUFReader(str(gguf_path()))
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = layers if key == "llama.block_count" else field.contents()
        writer.add_key_value(key, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            rows = gguf.quants.dequantize(t.data, t.tensor_type)
            writer.add_tensor(t.name, gguf.quants.quantize(rows, kind), raw_dtype=kind)
        else:
            quantized = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type if quantized else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def q4_0_file(tmp_path_factory):
    return write_copy(tmp_path_factory.mktemp("gguf") / "smollm2-2-layers.Q4_0.gguf")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module (the file is prepared once); tests that need it empty make their own."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("cache")
        mp.setenv("INFERENCE_INTERNALS_CACHE", str(folder))
        yield folder


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_INTERNALS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_door_runs_a_q4_0_file_on_its_own_blocks(q4_0_file, cache):
    llm = LLM(model=str(q4_0_file), device="cpu", quantization="q4_1")
    model = llm.model
    assert model.config.num_hidden_layers == LAYERS and [p.name for p in cache.iterdir()] == [
        f"gguf-{q4_0_file.stem}-{_sha256(q4_0_file)[:12]}"]
    # the weights multiplied are the file's blocks: dequantized, each equals the file's tensor decoded from
    # scratch (rows in Hugging Face's order), and every minimum is -8 times its scale (Q4_0 has none)
    f = gb.GGUFFile(q4_0_file)
    state = gb.model_state_dict(f)
    for i, block in enumerate(model.layers):
        qkv, down = block.self_attn.qkv_proj, block.mlp.down_proj
        assert isinstance(qkv, QuantProjection) and isinstance(down, QuantProjection)
        want = torch.cat([state[f"layers.{i}.self_attn.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(qkv.qw.dequantize(), want)
        assert torch.equal(down.qw.dequantize(), state[f"layers.{i}.mlp.down_proj.weight"])
        assert torch.equal(down.qw.zero, -8 * down.qw.scale)
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8 and out[0].prompt_token_ids == llm.tokenizer.encode("The capital of France is")


def test_the_same_file_unquantized_is_its_dequantized_weights(q4_0_file, cache):
    """Without quantization the file is dequantized once (by Hugging Face's reader) into the cache: its
    weights equal this course's own decoding of the blocks, and a second door reuses the prepared folder."""
    model = LLM(model=str(q4_0_file), device="cpu", optimize=False).model
    state = gb.model_state_dict(gb.GGUFFile(q4_0_file))
    ours = model.state_dict()
    for name in ("layers.1.self_attn.k_proj.weight", "layers.0.mlp.gate_proj.weight", "embed_tokens.weight"):
        assert torch.equal(ours[name], state[name]), name
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    LLM(model=str(q4_0_file), device="cpu", optimize=False)
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == before


def test_a_damaged_file_is_refused_before_anything_is_prepared(q4_0_file, empty_cache, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(q4_0_file.read_bytes()[:5000])  # the header, and a tensor table that runs off the end
    with pytest.raises(ValueError, match="not a valid GGUF"):
        LLM(model=str(bad), device="cpu")
    assert not empty_cache.exists() or not any(empty_cache.iterdir())
    with pytest.raises(ModelNotFoundError, match="no such GGUF file"):
        LLM(model=str(tmp_path / "absent.gguf"), device="cpu")


def test_q4_1_refuses_a_file_whose_projections_are_another_format(tmp_path, empty_cache):
    """Q8_0 projections are not Q4 blocks: the door says which tensor before it prepares or loads anything."""
    path = write_copy(tmp_path / "q8_0.gguf", layers=1, kind=gguf.GGMLQuantizationType.Q8_0)
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight is Q8_0, not Q4_1 or Q4_0"):
        LLM(model=str(path), device="cpu", quantization="q4_1")
    assert not empty_cache.exists()
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight is Q5_0, not Q4_1 or Q4_0"):
        LLM(model="gemma-3-270m", device="cpu", quantization="q4_1")


def test_optimize_refuses_a_file_of_another_model_before_changing_anything(q4_0_file, cache):
    model = LLM(model=str(q4_0_file), device="cpu", optimize=False).model  # 2 layers; SmolLM2's file has 30
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="this model is not that one"):
        optimize(model, weights="q4_1", gguf=gguf_path())
    with pytest.raises(ValueError, match="gguf names the file weights='q4_1' reads"):
        optimize(model, weights="int8", gguf=q4_0_file)
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
