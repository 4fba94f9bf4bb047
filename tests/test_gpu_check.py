"""`make gpu-check` in its CPU mode (tiny random weights): it runs, checks, and says what it skipped."""
import json

import torch

from inference_internals.generate import generate
from inference_internals.model import LlamaConfig, random_model
from scripts import gpu_check


def test_cpu_mode_runs_the_checks_and_names_what_it_skipped(tmp_path, monkeypatch, capsys):
    # "" reads as unset; monkeypatch then also undoes the folder that main() points the variable at
    monkeypatch.setenv("INFERENCE_INTERNALS_MODEL", "")
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--tiny", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    checks = report["checks"]["cpu/fp32"]
    assert checks["ok"] and checks["logits_ok"]
    for name in ("greedy tokens: ours == Hugging Face", "paged == contiguous", "speculative == plain"):
        assert checks[name]["ok"] and len(checks[name]["rows"]) == 3
    if not torch.cuda.is_available():
        assert any("CUDA" in s for s in report["skipped"]) and "measurements" not in report
    assert "skipped: " in capsys.readouterr().out


def test_a_real_difference_is_not_excused_as_a_near_tie():
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    m = random_model(cfg, seed=0, device="cpu")
    prompt = [3, 1, 4, 1, 5]
    a = generate(m, prompt, 8, stop_ids=[])
    with torch.no_grad():
        worst = int(m(torch.tensor([prompt + a[:3]]))[0, -1].argmin())
    b = a[:3] + [worst] + a[4:]
    assert gpu_check.same_or_near_tie(m, prompt, a, a, 1e-3) == (True, "identical")
    ok, why = gpu_check.same_or_near_tie(m, prompt, a, b, 1e-3)
    assert not ok and "at token 3" in why and "real" in why
    assert gpu_check.same_or_near_tie(m, prompt, a, b, 1e9)[0]  # within a huge tolerance: a tie
