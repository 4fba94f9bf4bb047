import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from inference_internals.model import MLP, LlamaConfig, random_model
from inference_internals.analysis.moe import (ROUTERS, MoEMLP, flop_fraction, moefy, predicted_flop_fraction,
                                     restore, routed, split_into_experts)

CFG = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny():
    return random_model(CFG, seed=0, device="cpu")  # the tests feed it CPU tensors


def _mlp(d=16, inter=24, seed=0):
    torch.manual_seed(seed)
    mlp = MLP(LlamaConfig(hidden_size=d, intermediate_size=inter))
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0, 0.3)
    return mlp


@settings(max_examples=25, deadline=None)
@given(n_experts=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 24]), seed=st.integers(0, 1000),
       n=st.integers(1, 7))
def test_experts_sum_to_dense(n_experts, seed, n):
    mlp = _mlp(seed=seed)
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    experts = split_into_experts(mlp, n_experts)
    assert len(experts) == n_experts
    assert all(e.gate_proj.out_features == 24 // n_experts for e in experts)
    with torch.no_grad():
        torch.testing.assert_close(sum(e(x) for e in experts), mlp(x), rtol=1e-5, atol=1e-5)


def test_experts_are_views_of_the_dense_weights():
    mlp = _mlp()
    experts = split_into_experts(mlp, 4)
    assert experts[1].gate_proj.weight.data_ptr() == mlp.gate_proj.weight[6:].data_ptr()
    assert experts[2].down_proj.weight.data_ptr() == mlp.down_proj.weight[:, 12:].data_ptr()


@pytest.mark.parametrize("bad", [0, 5, -2, 2.0])
def test_split_rejects_bad_expert_counts(bad):
    with pytest.raises(ValueError):
        split_into_experts(_mlp(), bad)


@pytest.mark.parametrize("router", ROUTERS)
def test_all_experts_is_the_dense_mlp(router):
    mlp = _mlp()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(MoEMLP(mlp, 4, 4, router)(x), mlp(x), rtol=1e-5, atol=1e-5)


def test_each_token_runs_exactly_its_top_k_experts():
    mlp = _mlp()
    moe = MoEMLP(mlp, n_experts=6, k=2, router="oracle")
    x = torch.randn(9, 16)
    with torch.no_grad():
        outs = torch.stack([e(x) for e in moe.experts], 1)
        top = outs.norm(dim=-1).topk(2, dim=-1).indices
        expected = outs.gather(1, top[..., None].expand(-1, -1, 16)).sum(1)
        torch.testing.assert_close(moe(x), expected)
    assert int(moe.tokens_per_expert.sum()) == 9 * 2


def test_gate_router_picks_largest_silu_gate_norm():
    mlp = _mlp(seed=3)
    moe = MoEMLP(mlp, n_experts=4, k=1, router="gate")
    x = torch.randn(10, 16)
    with torch.no_grad():
        scores = torch.stack([torch.nn.functional.silu(e.gate_proj(x)).norm(dim=-1) for e in moe.experts], -1)
        best = scores.argmax(-1)
        expected = torch.stack([moe.experts[int(b)](x[i]) for i, b in enumerate(best)])
        torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-5)
    assert moe.tokens_per_expert.tolist() == torch.bincount(best, minlength=4).tolist()


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("k", [1, 3, 6])
def test_flop_counter_matches_prediction_and_torch(router, k):
    mlp = _mlp()
    moe = MoEMLP(mlp, n_experts=6, k=k, router=router)
    x = torch.randn(11, 16)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        moe(x)
    assert moe.flops == counter.get_total_flops()           # what torch saw run
    assert moe.dense_flops == 2 * 3 * 11 * 16 * 24
    assert flop_fraction([moe]) == pytest.approx(predicted_flop_fraction(6, k, router))


def test_random_router_is_seeded():
    mlp = _mlp()
    x = torch.randn(8, 16)
    with torch.no_grad():
        a = MoEMLP(mlp, 4, 1, "random", seed=1)(x)
        b = MoEMLP(mlp, 4, 1, "random", seed=1)(x)
        c = MoEMLP(mlp, 4, 1, "random", seed=2)(x)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("n_experts,k,router", [(4, 0, "gate"), (4, 5, "gate"), (4, 2, "learned"), (5, 1, "gate")])
def test_bad_arguments_raise_and_leave_the_model_alone(tiny, n_experts, k, router):
    before = [b.mlp for b in tiny.layers]
    with pytest.raises(ValueError):
        moefy(tiny, n_experts, k, router)
    assert [b.mlp for b in tiny.layers] == before
    with pytest.raises(ValueError):
        MoEMLP(tiny.layers[0].mlp, n_experts, k, router)


@pytest.mark.parametrize("n_experts,k,router", [(4, 0, "gate"), (4, 5, "oracle"), (4, 2, "learned")])
def test_predicted_fraction_rejects_bad_arguments(n_experts, k, router):
    with pytest.raises(ValueError):
        predicted_flop_fraction(n_experts, k, router)


def test_context_manager_restores_even_on_error(tiny):
    ids = torch.randint(0, CFG.vocab_size, (2, 6))
    before = [b.mlp for b in tiny.layers]
    with torch.no_grad():
        dense = tiny(ids)
        with pytest.raises(RuntimeError):
            with routed(tiny, 4, 2, "gate") as moes:
                assert all(isinstance(b.mlp, MoEMLP) for b in tiny.layers)
                assert moes == [b.mlp for b in tiny.layers]
                raise RuntimeError("boom")
        assert [b.mlp for b in tiny.layers] == before
        torch.testing.assert_close(tiny(ids), dense, rtol=0, atol=0)


def test_moefy_then_restore(tiny):
    ids = torch.randint(0, CFG.vocab_size, (1, 7))
    with torch.no_grad():
        dense = tiny(ids)
        originals = moefy(tiny, 6, 6, "gate")
        with pytest.raises(ValueError, match="already routed"):
            moefy(tiny, 6, 2)
        torch.testing.assert_close(tiny(ids), dense, rtol=1e-5, atol=1e-5)   # k = E: all experts
        fraction = flop_fraction([b.mlp for b in tiny.layers])
        with pytest.raises(ValueError):
            restore(tiny, originals[:1])
        restore(tiny, originals)
    assert fraction == pytest.approx(1.0)
    assert all(type(b.mlp) is MLP for b in tiny.layers)


def test_routing_fewer_experts_changes_the_output(tiny):
    ids = torch.randint(0, CFG.vocab_size, (1, 7))
    with torch.no_grad():
        dense = tiny(ids)
        with routed(tiny, 6, 1, "gate") as moes:
            sparse = tiny(ids)
    assert not torch.allclose(sparse, dense, atol=1e-3)
    assert flop_fraction(moes) == pytest.approx(1 / 3 + 2 / 3 / 6)


def test_flop_fraction_needs_tokens():
    with pytest.raises(ValueError):
        flop_fraction([MoEMLP(_mlp(), 2, 1)])


def test_real_model_experts_and_full_routing_are_exact(model):
    x = torch.randn(3, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        # in fp64, so the only difference left is the order of the sums (fp32's was 3e-4 on one of 8640)
        mlp, x = copy.deepcopy(model.layers[7].mlp).double(), x.double()
        torch.testing.assert_close(sum(e(x) for e in split_into_experts(mlp, 8)), mlp(x), rtol=1e-9, atol=1e-9)
        dense = model(ids)
        with routed(model, 8, 8, "gate"):
            torch.testing.assert_close(model(ids), dense, rtol=1e-4, atol=1e-4)
    assert all(type(b.mlp) is MLP for b in model.layers)


def test_runs_on_every_device(device):
    from inference_internals.device import default_dtype

    dtype = default_dtype(device)
    small = random_model(CFG, seed=2, device=device, dtype=dtype)
    ids = torch.randint(0, CFG.vocab_size, (2, 5), device=device)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    with torch.no_grad():
        dense = small(ids).float()
        for router in ROUTERS:
            with routed(small, 4, 4, router):
                torch.testing.assert_close(small(ids).float(), dense, **tol)
            with routed(small, 4, 1, router) as moes:
                small(ids)
            assert all(int(m.tokens_per_expert.sum()) == 10 for m in moes)
