import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals.analysis.logit_lens import first_layer_predicting, logit_lens
from inference_internals.model import LlamaConfig, random_model

CFG = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


@pytest.fixture(scope="module")
def small():
    return random_model(CFG, seed=1, device="cpu")  # the tests feed it CPU tensors


def test_matches_hugging_face_on_the_real_model(model, reference):
    ours, hf = model, reference  # conftest: fp32 on CPU
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314], [1, 378, 2102, 282, 6493, 314]])
    lens = logit_lens(ours, ids, position=-2)
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        hs = [h[:, -2] for h in out.hidden_states]
        # HF's last hidden state is already after the final norm, like ours.
        expected = torch.stack([hf.lm_head(hf.model.norm(h)) for h in hs[:-1]] + [out.logits[:, -2]])
    assert lens.shape == (31, 2, 49152)
    torch.testing.assert_close(lens, expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 9), data=st.data())
def test_last_row_is_the_models_prediction(small, B, T, data):
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, CFG.vocab_size - 1), min_size=T, max_size=T),
                                          min_size=B, max_size=B)))
    position = data.draw(st.integers(-T, T - 1))
    lens = logit_lens(small, ids, position)
    with torch.no_grad():
        logits, hidden = small(ids, output_hidden_states=True)
        torch.testing.assert_close(lens[-1], logits[:, position])
        # Every other row reads its stream through the final norm and the LM head.
        for i in (0, CFG.num_hidden_layers // 2):
            torch.testing.assert_close(lens[i], small.lm_head(small.norm(hidden[i][:, position])))
    assert lens.shape == (CFG.num_hidden_layers + 1, B, CFG.vocab_size)


@pytest.mark.parametrize("position", [5, -6, 100])
def test_bad_position_raises(small, position):
    with pytest.raises(ValueError, match="outside"):
        logit_lens(small, torch.zeros(1, 5, dtype=torch.long), position)


def test_bad_ids_raise(small):
    with pytest.raises(ValueError):
        logit_lens(small, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError):
        logit_lens(small, torch.full((1, 3), CFG.vocab_size))


def _lens_from_tops(tops, vocab=5):
    """Logits whose argmax at [layer, row] is tops[layer][row]."""
    tops = torch.tensor(tops)
    return torch.nn.functional.one_hot(tops, vocab).float()


def test_first_layer_predicting():
    lens = _lens_from_tops([[0, 1, 2],
                            [3, 1, 4],
                            [3, 2, 0],
                            [3, 2, 4]])
    assert first_layer_predicting(lens).tolist() == [1, 2, 1]       # final tokens 3, 2, 4
    assert first_layer_predicting(lens, token=1).tolist() == [-1, 0, -1]
    assert first_layer_predicting(lens, token=torch.tensor([0, 1, 0])).tolist() == [0, 0, 2]


def test_first_layer_predicting_rejects_bad_shape():
    with pytest.raises(ValueError):
        first_layer_predicting(torch.zeros(4, 5))


def test_runs_on_every_device(device):
    from inference_internals.device import default_dtype

    m = random_model(CFG, seed=3, device=device, dtype=default_dtype(device))
    ids = torch.randint(0, CFG.vocab_size, (2, 6), device=device)
    lens = logit_lens(m, ids)
    with torch.no_grad():
        torch.testing.assert_close(lens[-1], m(ids)[:, -1])
    assert first_layer_predicting(lens).tolist() == [first_layer_predicting(lens[:, i:i + 1]).item() for i in range(2)]
