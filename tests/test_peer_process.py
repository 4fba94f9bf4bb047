"""benchmarks/peer_llama_cpp.py: llama.cpp as a worker process, here run on a stand-in llama_cpp
package (the real one is never in the course's venv): the protocol, and the restart without
llama.cpp's extra buffer types when the first decode crashes (its AMX path, on some CPUs)."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.peer_llama_cpp import LlamaCppPeer

ROOT = Path(__file__).resolve().parents[1]

FAKE = '''
import os, signal, sys
__version__ = "0.0-fake"
CRASH = os.environ["FAKE_LLAMA_CRASH"]  # "never", "with_extra" or "always"

def llama_print_system_info():
    return b"CPU : FAKE = 1 |"

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, verbose, **kw):
        from llama_cpp import llama_cpp as low
        self.extra = low.llama_model_default_params().use_extra_bufts
        self.n_threads = n_threads

    def token_bos(self):
        return 1

    def eval(self, ids):
        if CRASH == "always" or (CRASH == "with_extra" and self.extra):
            os.kill(os.getpid(), signal.SIGSEGV)

    def reset(self):
        pass

    def generate(self, prompt, top_k, top_p, min_p, temp, repeat_penalty, reset):
        assert top_k == 1 and temp == 0.0 and reset
        t = sum(prompt)
        while True:
            t = (t * 31 + 7) % 1000
            yield t
'''
LOW = '''
class Params:
    use_extra_bufts = True

def llama_model_default_params():
    return Params()
'''


@pytest.fixture
def fake_llama_cpp(tmp_path, monkeypatch):
    pkg = tmp_path / "llama_cpp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(FAKE))
    (pkg / "llama_cpp.py").write_text(LOW)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return lambda crash: monkeypatch.setenv("FAKE_LLAMA_CRASH", crash)


def test_the_peer_decodes_on_request_and_reports_arrival_times(fake_llama_cpp, tmp_path):
    fake_llama_cpp("never")
    with LlamaCppPeer(sys.executable, tmp_path / "m.gguf", 2) as peer:
        assert peer.info["ready"] and peer.info["threads"] == 2 and peer.info["extra_bufts"]
        assert "fallback" not in peer.info
        stamps = peer.decode([3, 4], 5)
        again = list(peer.last_tokens)
        assert len(stamps) == 5 and stamps == sorted(stamps) and len(again) == 5
        peer.decode([3, 4], 5)
        assert peer.last_tokens == again  # greedy from a fresh state: the same tokens each request


def test_a_crash_at_the_first_decode_restarts_it_without_extra_buffer_types(fake_llama_cpp, tmp_path):
    fake_llama_cpp("with_extra")
    with LlamaCppPeer(sys.executable, tmp_path / "m.gguf", 1) as peer:
        assert peer.info["extra_bufts"] is False
        assert f"exited (-{int(signal.SIGSEGV)})" in peer.info["fallback"]
        assert len(peer.decode([1], 3)) == 3


def test_a_peer_that_crashes_either_way_is_an_error_not_a_hang(fake_llama_cpp, tmp_path):
    fake_llama_cpp("always")
    with pytest.raises(RuntimeError, match="peer exited"):
        LlamaCppPeer(sys.executable, tmp_path / "m.gguf", 1)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_peer_is_built_without_amx_exactly_where_the_cpu_has_it(tmp_path):
    """llama.cpp's AMX path crashes (#20824) and its fallback turns off the repacked Q4_0 layout: on an AMX
    CPU `make peers` builds it without AMX; elsewhere for the machine (no CMAKE_ARGS)."""
    amx = " amx_int8" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
    recipe = subprocess.run(["make", "--no-print-directory", "-n", "peers", f"PEERS={tmp_path / 'peers'}"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "llama-cpp-python==" in recipe and "--no-cache-dir" in recipe  # a cached native wheel is not reused
    if amx:
        assert "-DGGML_AMX_INT8=OFF" in recipe and "-DGGML_NATIVE=OFF" in recipe and "-DGGML_AVX512_VNNI=ON" in recipe
    else:
        assert 'CMAKE_ARGS=""' in recipe
