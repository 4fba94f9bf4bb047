"""The chat template, stop conditions, sampling inside generate, and streaming text."""
import pytest
import torch

from inference_internals.bpe import BPETokenizer
from inference_internals.generate import (DEFAULT_SYSTEM_PROMPT, chat_prompt, generate, generate_stream,
                                          greedy, stream_text)
from inference_internals.model import Llama, LlamaConfig, load_reference, load_tokenizer, random_model
from inference_internals.sampling import Sampler
from inference_internals.weights import model_dir


@pytest.fixture(scope="module")
def folder():
    return model_dir()


@pytest.fixture(scope="module")
def model(folder):
    return Llama.from_pretrained(folder, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer random model with the real vocabulary: for loop mechanics, where the real weights
    would only cost time."""
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16)
    return random_model(cfg, seed=0, device="cpu")


@pytest.fixture(scope="module")
def ref(folder):
    return load_reference(folder)


@pytest.fixture(scope="module")
def hf_tok(folder):
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def tok(folder):
    return BPETokenizer.from_pretrained(folder)


def scripted(ids):
    """A 'sampler' that ignores the logits and emits ``ids``: forces emoji/CJK output."""
    it = iter(ids)
    return lambda logits: torch.tensor([next(it)], device=logits.device)


CONVERSATIONS = [
    [{"role": "user", "content": "What is RAG?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 😀"},
     {"role": "user", "content": "日本語で答えて"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "line 1\n\nline 2  <|im_end|>"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_prompt_equals_hf_template(hf_tok, tok, messages, add_generation_prompt):
    ours = chat_prompt(messages, add_generation_prompt)
    theirs = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    assert tok.encode(ours) == hf_tok(theirs, add_special_tokens=False)["input_ids"]


def test_default_system_prompt_comes_from_the_template(folder):
    assert DEFAULT_SYSTEM_PROMPT in (folder / "chat_template.jinja").read_text()


def test_chat_prompt_bad_input():
    with pytest.raises(TypeError, match="list"):
        chat_prompt("hello")
    with pytest.raises(TypeError, match="list"):
        chat_prompt([{"role": "user", "content": "x"}, "y"])
    with pytest.raises(ValueError, match="empty"):
        chat_prompt([])
    with pytest.raises(ValueError, match="message 0"):
        chat_prompt([{"role": "user"}])
    with pytest.raises(ValueError, match="message 1"):
        chat_prompt([{"role": "user", "content": "x"}, {"role": 3, "content": "y"}])


def test_greedy_chat_reply_equals_hf(model, ref, tok):
    ids = tok.encode(chat_prompt(CONVERSATIONS[0]))
    ours = generate(model, ids, 8)
    theirs = ref.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    assert ours == theirs[:len(ours)]


@pytest.mark.parametrize("cfg", [dict(temperature=0.7, top_k=50, top_p=0.9),
                                 dict(temperature=1.3, top_k=0, min_p=0.05)], ids=str)
def test_sampled_generation_equals_hf_with_the_same_seed(model, ref, tok, cfg):
    """Same logits, same warpers, same global RNG stream -> the same tokens as HF's sampling."""
    ids = tok.encode(chat_prompt(CONVERSATIONS[0]))
    torch.manual_seed(11)
    ours = generate(model, ids, 8, sample=Sampler(**cfg))
    torch.manual_seed(11)
    theirs = ref.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=True, **cfg)[0, len(ids):].tolist()
    assert ours == theirs[:len(ours)]


def test_seeded_generation_is_reproducible(tiny):
    ids = [1, 9690, 198, 19556]
    runs = [generate(tiny, ids, 20, sample=Sampler(temperature=1.0, seed=5), stop_ids=[]) for _ in range(3)]
    assert runs[0] == runs[1]
    other = generate(tiny, ids, 20, sample=Sampler(temperature=1.0, seed=6), stop_ids=[])
    assert other != runs[0]


def test_max_new_tokens_and_stop_ids(tiny):
    ids = [1, 9690, 198, 19556]
    free = generate(tiny, ids, 12, stop_ids=[])
    assert len(free) == 12
    assert generate(tiny, ids, 0) == []
    stop = free[5]
    first = free.index(stop)
    assert generate(tiny, ids, 12, stop_ids=[stop]) == free[:first + 1]
    assert generate(tiny, ids, 12, stop_ids=[stop], include_stop=False) == free[:first]


def test_eos_ends_the_reply(tiny, tok):
    """Force the model's EOS through a scripted sampler: the loop ends right after it."""
    hi = tok.encode("Hi")[0]
    steps = list(generate_stream(tiny, [1, 2, 3], 10, sample=scripted([hi, tiny.config.eos_token_id] + [0] * 10)))
    assert [int(s) for s in steps] == [hi, 2]


def test_stream_text_never_emits_half_a_character(tiny, tok):
    text = "日本語 😀👍🏽 ok"
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # single tokens are broken characters
    pieces = list(stream_text(tiny, tok, "Say it:", 30, sample=scripted(ids + [2])))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) < len(ids)  # some steps were held back until the character completed


@pytest.mark.parametrize("seed", range(3))
def test_stream_text_equals_decode_of_generate(tiny, tok, seed):
    """A random model emits arbitrary byte tokens, broken UTF-8 included: streaming must still
    add up to the one-shot decode."""
    prompt = chat_prompt([{"role": "user", "content": "Name a color."}])
    ids = tok.encode(prompt)
    out = generate(tiny, ids, 40, sample=Sampler(temperature=1.0, seed=seed), include_stop=False)
    streamed = "".join(stream_text(tiny, tok, prompt, 40, sample=Sampler(temperature=1.0, seed=seed)))
    assert streamed == tok.decode(out, skip_special_tokens=True)


def test_stream_text_bad_input(tiny, tok):
    with pytest.raises(ValueError, match="one prompt"):
        list(stream_text(tiny, tok, [[1, 2], [3, 4]], 2))


def test_greedy_is_still_exported():
    assert torch.equal(greedy(torch.tensor([[0.0, 2.0, 1.0]])), torch.tensor([1]))
