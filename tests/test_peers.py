"""inference_course.peers: llama.cpp beside our engine, in turns, when llama-cpp-python is installed."""
import sys
import types

import pytest

from inference_course import peers


class FakeLlama:
    """llama_cpp.Llama's shape: generate() yields token ids forever until the caller stops."""
    made = []

    def __init__(self, model_path, n_ctx, verbose, n_threads):
        self.model_path, self.n_threads, self.resets = model_path, n_threads, 0
        FakeLlama.made.append(self)

    def reset(self):
        self.resets += 1

    def generate(self, prompt, top_k, top_p, temp, reset):
        assert top_k == 1 and temp == 0.0 and reset  # greedy, from a fresh state
        i = 0
        while True:
            i += 1
            yield i


def test_llama_cpp_runner_is_none_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    assert peers.llama_cpp_runner() is None


def fake_llama_cpp(monkeypatch, crashes: bool):
    """llama_cpp and its low-level module, as the runner imports them; FakeLlama records the params it would load with."""
    low = types.SimpleNamespace(llama_model_default_params=lambda: types.SimpleNamespace(use_extra_bufts=True))

    class Recording(FakeLlama):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.params = low.llama_model_default_params()

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=Recording, llama_cpp=low))
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", low)
    monkeypatch.setattr(peers, "crashes_with_extra_buffers", lambda path: crashes)
    return low


def test_llama_cpp_runner_decodes_the_models_own_gguf(monkeypatch):
    from inference_internals.weights import gguf_path

    fake_llama_cpp(monkeypatch, crashes=False)
    run = peers.llama_cpp_runner(n_threads=3)
    stamps = run([1, 2, 3], 5)
    llm = FakeLlama.made[-1]
    assert llm.model_path == str(gguf_path()) and llm.n_threads == 3 and llm.resets == 1
    assert len(stamps) == 5 and stamps == sorted(stamps)
    assert llm.params.use_extra_bufts and run.note == ""


def test_llama_cpp_runner_leaves_out_the_buffers_that_crash_and_says_so(monkeypatch):
    low = fake_llama_cpp(monkeypatch, crashes=True)
    before = low.llama_model_default_params
    run = peers.llama_cpp_runner(n_threads=1)
    assert FakeLlama.made[-1].params.use_extra_bufts is False and "AMX" in run.note
    assert low.llama_model_default_params is before  # llama_cpp's own defaults are left as they were


def test_the_crash_probe_runs_in_a_child_process_and_reads_its_signal(monkeypatch, tmp_path):
    import subprocess

    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, -11 if cmd[-1].endswith("crash.gguf") else 1)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert peers.crashes_with_extra_buffers(tmp_path / "crash.gguf") is True  # SIGSEGV
    assert peers.crashes_with_extra_buffers(tmp_path / "m.gguf") is False  # an error is not a crash
    assert seen[0][0] == sys.executable


def test_rates_takes_the_runners_in_turns_first_token_to_last():
    order = []

    def fake(name, dt):
        def run(prompt, n):
            order.append((name, n))
            return [i * dt for i in range(n)]
        return run

    out = peers.rates({"a": fake("a", 0.01), "b": fake("b", 0.02)}, [1], n=5, rounds=2)
    assert order == [("a", 2), ("b", 2), ("a", 5), ("b", 5), ("a", 5), ("b", 5)]  # warm-up, then in turns
    assert out["a"] == pytest.approx([100.0, 100.0]) and out["b"] == pytest.approx([50.0, 50.0])
    with pytest.raises(RuntimeError, match="stopped after 1 of 5"):
        peers.rates({"short": lambda p, n: [0.0]}, [1], n=5, rounds=1)
    with pytest.raises(ValueError):
        peers.rates({"a": fake("a", 0.01)}, [1], n=1)
