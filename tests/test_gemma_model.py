"""Gemma 3 270M through the library's one model family: logits equal Hugging Face's
``Gemma3ForCausalLM`` on the same weights (fp32), on prompts shorter and longer than the sliding
window of 512, and greedy decoding through every cache equals it token for token."""
import pytest
import torch

from inference_internals.generate import generate
from inference_internals.kv_cache import GrowingKVCache, KVCache
from inference_internals.model import Llama, LlamaConfig, load_reference, random_model

NAME = "gemma-3-270m"


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return (Llama.from_pretrained(NAME, device="cpu", dtype="fp32"),
            load_reference(NAME, device="cpu", dtype=torch.float32))


def test_the_config_says_what_gemma_changes(models):
    cfg = models[0].config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) == ("gemma3_text", 18, 1, 256)
    assert cfg.windowed_layers == [i for i in range(18) if i % 6 != 5] and cfg.sliding_window == 512
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1e6, 1e4)
    assert cfg.qk_norm and cfg.sandwich_norms and cfg.embed_scale and cfg.norm_offset == 1.0
    assert type(models[1]).__name__ == "Gemma3ForCausalLM"


@pytest.mark.parametrize("n", [6, 560])
def test_logits_equal_hugging_face(models, n):
    ours, ref = models
    g = torch.Generator().manual_seed(n)
    ids = torch.tensor([[2] + torch.randint(3, 262_000, (n - 1,), generator=g).tolist()])
    with torch.inference_mode():
        a, b = ours(ids), ref(ids).logits
    assert (a - b).abs().max().item() <= 1e-4  # measured: 0.0 on both


def test_greedy_64_tokens_equal_hugging_face_past_the_window(models):
    """A 470-token prompt and 64 new tokens: the last 22 steps attend past the window, through the cache."""
    ours, ref = models
    g = torch.Generator().manual_seed(1)
    prompt = [2] + torch.randint(3, 262_000, (469,), generator=g).tolist()
    out = generate(ours, prompt, max_new_tokens=64, stop_ids=[])
    with torch.inference_mode():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, pad_token_id=0,
                            eos_token_id=None)[0, len(prompt):].tolist()
    assert out == want


def _tiny(window=4):
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=64, model_type="gemma3_text",
                      layer_types=("sliding_attention", "full_attention") * 2, sliding_window=window,
                      rope_local_theta=100.0, qk_norm=True, sandwich_norms=True, norm_offset=1.0, embed_scale=True,
                      hidden_act="gelu_pytorch_tanh")
    return random_model(cfg, seed=3, device="cpu")


@pytest.mark.parametrize("cache_cls", [KVCache, GrowingKVCache])
def test_cached_equals_uncached_past_the_window(cache_cls):
    m = _tiny()
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = m(ids)
        cache = cache_cls.for_model(m, 2, 20)
        steps = [m(ids[:, :7], cache=cache)] + [m(ids[:, t:t + 1], cache=cache) for t in range(7, 17)]
        steps.append(m(ids[:, 17:], cache=cache))  # a chunk of 3 after the cached ones
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_a_window_changes_the_output_only_past_it():
    narrow, wide = _tiny(window=4), _tiny(window=64)
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        a, b = narrow(ids), wide(ids)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_bad_gemma_configs_are_refused():
    with pytest.raises(ValueError, match="sliding_window"):
        LlamaConfig(num_hidden_layers=2, layer_types=("sliding_attention", "full_attention"))
    with pytest.raises(ValueError, match="layer_types"):
        LlamaConfig(num_hidden_layers=2, layer_types=("sliding_attention",), sliding_window=4)
    with pytest.raises(ValueError, match="hidden_act"):
        LlamaConfig(hidden_act="relu")


def test_selectable_at_the_door_by_name_through_the_paged_engine_and_prompt_lookup():
    from inference_internals import LLM, SamplingParams
    from inference_internals.spm import SentencePieceBPE

    llm = LLM("gemma-3-270m", device="cpu", dtype="fp32")
    assert isinstance(llm.tokenizer, SentencePieceBPE) and llm.model.config.model_type == "gemma3_text"
    prompts = ["The capital of France is", "1, 2, 3, 4, 5, 6,"]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy)]
    assert outs == [generate(llm.model, llm.tokenizer.encode(p), max_new_tokens=12, stop_ids=[]) for p in prompts]
    spec = LLM(llm.model, tokenizer=llm.tokenizer, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert [list(o.outputs[0].token_ids) for o in spec.generate(prompts, greedy)] == outs
    assert llm.generate(prompts[0], greedy)[0].outputs[0].text.startswith(" the capital")
    # and by its checkpoint folder (the prepared one): the same model, the same tokenizer, the same tokens
    from inference_internals.weights import model_dir

    by_folder = LLM(str(model_dir("gemma-3-270m")), device="cpu", dtype="fp32")
    assert isinstance(by_folder.tokenizer, SentencePieceBPE) and by_folder.model.config.model_type == "gemma3_text"
    assert list(by_folder.generate(prompts[1], greedy)[0].outputs[0].token_ids) == outs[1]
