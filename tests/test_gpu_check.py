"""`gpu-check` on the CPU (tiny random weights, `--device cpu`): the same sections, measurement
functions, JSON and figure a CUDA run has, so only the CUDA-only calls are new on a GPU."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from inference_internals.generate import generate
from inference_course.gpu_report import regime_series, regimes_figure
from inference_internals.model import LlamaConfig, random_model
from scripts import gpu_check


def test_cpu_run_measures_every_section_and_survives_one_that_fails(tmp_path, monkeypatch, capsys):
    # "" reads as unset; monkeypatch then also undoes the folder that main() points the variable at
    monkeypatch.setenv("INFERENCE_INTERNALS_MODEL", "")
    monkeypatch.delenv(gpu_check.GUARD, raising=False)
    out = tmp_path / "gpu.json"
    on_disk = []  # the sections the JSON on disk held at each write
    write = gpu_check.Report.write

    def spy(self):
        write(self)
        if out.exists():
            on_disk.append(list(json.loads(out.read_text())["sections"]))
    monkeypatch.setattr(gpu_check.Report, "write", spy)

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")
    monkeypatch.setattr(gpu_check, "batching", broken)
    assert gpu_check.main(["--device", "cpu", "--tiny", "--no-tests", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert os.environ.get(gpu_check.GUARD) == "1"  # what it starts would know it runs inside gpu-check
    monkeypatch.delenv(gpu_check.GUARD)

    sections = report["sections"]
    assert sections["fp32: batching"]["ok"] is False and "injected fault" in sections["fp32: batching"]["error"]
    assert [n for n, s in sections.items() if not s["ok"]] == ["fp32: batching"]  # the one fault, and the next ran
    assert "fp32: speculative" in sections and report["ok"] is False
    # rewritten after every section: the file held each section as soon as it had run, the fault's included
    names = list(sections)
    assert all(names[:i + 1] in on_disk for i in range(len(names)))

    checks = report["checks"]["cpu/fp32"]
    assert checks["ok"] and checks["logits_ok"]
    for name in ("greedy tokens: ours == Hugging Face", "paged == contiguous", "paged (packed) == contiguous",
                 "speculative == plain", "static (graph-ready) step decode == eager"):
        assert checks[name]["ok"] and len(checks[name]["rows"]) >= 3, name
    m = report["measurements"]["fp32"]
    b1 = m["decode_batch1"]
    assert b1["eager_tok_s"] > 0 and b1["static_eager_tok_s"] > 0 and "cuda_graph_tok_s" not in b1  # no graph on a CPU
    for k in b1["kernels"].values():  # counted by the profiler: each step attends once per layer
        assert k["total"] > 0
        assert k["attention"]["aten::scaled_dot_product_attention"] == gpu_check.TINY.num_hidden_layers
    sweep = m["decode_eager_sweep"]
    assert list(sweep["step_ms"]) == ["1", "2", "4", "8"] and sweep["stopped"]
    assert set(m["ttft_ms"]) == {"8", "32"} and m["speculative"]["same_tokens"]
    assert "decode_batched_cuda_graph" not in m and any("CUDA-only" in s for s in report["skipped"])
    assert report["figures"] and all(Path(f).stat().st_size > 0 for f in report["figures"])
    assert "skipped: " in capsys.readouterr().out


def test_the_unit_tests_are_never_started_from_inside_a_gpu_check():
    assert gpu_check.tests_skipped(no_tests=False, nested=False, cuda=True) is None
    assert "GPU_CHECK" in gpu_check.tests_skipped(no_tests=False, nested=True, cuda=True)
    assert gpu_check.tests_skipped(no_tests=True, nested=False, cuda=True) == "--no-tests"


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    # pytest's stand-in starts a child of its own, then both hang
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    t0 = time.perf_counter()
    rc, _ = gpu_check.run_group([sys.executable, "-c", code], dict(os.environ), timeout_s=3)
    assert rc is None and time.perf_counter() - t0 < 30
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild is gone (or a zombie awaiting its reaper)
        status = Path(f"/proc/{child}/status")
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {child}, started by the timed-out command, is still running")


def test_plain_python_entry_needs_neither_make_nor_pythonpath(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, str(gpu_check.ROOT / "scripts" / "gpu_check.py"), "--help"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "--out" in p.stdout, p.stderr


def synthetic_report() -> dict:
    """A gpu-check run as a GPU would write it: launch-bound eager steps, graphed steps flat to
    batch 64 then growing with the batch."""
    graph = {1: 0.05, 2: 0.05, 4: 0.05, 8: 0.05, 16: 0.05, 32: 0.05, 64: 0.06, 128: 0.1, 256: 0.2}
    return {"machine": {"gpu": "Synthetic H0"}, "measurements": {"bf16": {
        "roofline": {"weight_bytes": 2.7e8, "bandwidth_Bps": 4.8e12, "flops_per_s": 9.9e14,
                     "kv_bytes_per_sequence": 1e6, "flops_per_token": 2.7e8, "context": 64},
        "decode_batch1": {"launch_overhead_ms_per_step": 4.0},
        "decode_eager_sweep": {"step_ms": {str(b): 4.05 for b in (1, 2, 4, 8, 16, 32)}},
        "decode_batched_cuda_graph": {"step_ms": {str(b): t for b, t in graph.items()}}}}}


def test_three_regime_figure_from_a_synthetic_run():
    import matplotlib
    import matplotlib.pyplot as plt

    from inference_course.plotting import check_legible, use_book_style

    r = synthetic_report()
    s = regime_series(r["measurements"]["bf16"])
    assert s["batches"] == [1, 2, 4, 8, 16, 32, 64, 128, 256] and s["launch"] == 4.0
    assert s["bandwidth"][1] == pytest.approx(1e3 * (2.7e8 + 1e6) / 4.8e12)
    assert s["compute"][256] == pytest.approx(1e3 * 2.7e8 * 256 / 9.9e14)
    with matplotlib.rc_context():
        use_book_style()  # as the Benchmarks page draws it
        fig = regimes_figure(r)
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert labels == ["eager (measured)", "CUDA graph (measured)", "bandwidth: bytes ÷ bandwidth",
                          "compute: FLOPs ÷ FLOP/s", "launch overhead per step (eager − graph, same kernels)"]
        assert "Synthetic H0" in fig.axes[0].get_title()
        check_legible(fig)
        plt.close(fig)
    with pytest.raises(ValueError, match="no measurements"):
        regimes_figure({"machine": {}})


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
