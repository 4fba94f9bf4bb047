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


def test_llama_cpp_runner_decodes_the_models_own_gguf(monkeypatch):
    from inference_internals.weights import gguf_path

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    run = peers.llama_cpp_runner(n_threads=3)
    stamps = run([1, 2, 3], 5)
    llm = FakeLlama.made[-1]
    assert llm.model_path == str(gguf_path()) and llm.n_threads == 3 and llm.resets == 1
    assert len(stamps) == 5 and stamps == sorted(stamps)


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
