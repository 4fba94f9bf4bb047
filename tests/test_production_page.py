"""The page "From this engine to vLLM and SGLang" (book/production.ipynb): its script runs, unchanged
from vLLM's quickstart but for the import line, and every vLLM and SGLang setting it names is one of
the fields recorded from those engines (src/inference_internals/data/*_fields.json)."""
import contextlib
import io
import json
import re
import runpy
from importlib.resources import files
from pathlib import Path

import nbformat
import pytest
import yaml

from inference_internals import RequestOutput

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "production.ipynb"
SCRIPT = ROOT / "book" / "vllm_quickstart.py"


def recorded(engine: str) -> dict:
    return json.loads(files("inference_internals").joinpath(f"data/{engine}_fields.json").read_text())


VLLM, SGLANG = recorded("vllm"), recorded("sglang")
VLLM_NAMES = set().union(*(VLLM[k]["fields"] for k in ("EngineArgs", "SamplingParams", "SpeculativeConfig",
                                                       "CompilationConfig")))
VLLM_FLAGS = {f.replace("-", "_") for f in VLLM["EngineArgs"]["fields"]} | {
    f[2:].replace("-", "_") for f in VLLM["ServeCLI"]["flags"]}
SGLANG_NAMES = set().union(*(SGLANG[k]["fields"] for k in ("ServerArgs", "SamplingParams", "GenerateReqInput")))
SGLANG_FLAGS = set(SGLANG["ServerArgs"]["fields"])


def test_the_quickstart_runs_and_prints_vllms_outputs():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ran = runpy.run_path(str(SCRIPT), run_name="__main__")
    lines = out.getvalue().splitlines()
    assert len(lines) == len(ran["prompts"]) == 4
    for line, prompt, o in zip(lines, ran["prompts"], ran["outputs"]):
        assert isinstance(o, RequestOutput) and o.prompt == prompt
        assert re.fullmatch(r"Prompt: .*, Generated text: .+", line) and repr(o.outputs[0].text) in line
        assert 1 <= len(o.outputs[0].token_ids) <= 16  # vLLM's default max_tokens
        assert o.outputs[0].finish_reason in ("stop", "length")


def test_the_quickstart_differs_from_vllms_by_its_import_line_only():
    code = [line for line in SCRIPT.read_text().splitlines() if line.strip() and not line.startswith("#")]
    ours = [line for line in code if "inference_internals" in line]
    assert ours == ["from inference_internals import LLM, SamplingParams"]
    assert "from vllm import LLM, SamplingParams" in SCRIPT.read_text()  # the line it replaces, in a comment
    assert 'llm = LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct")' in code  # a model vLLM serves too


def markdown_cells():
    return [c.source for c in nbformat.read(PAGE, as_version=4).cells if c.cell_type == "markdown"]


def table_names(column: str) -> list[str]:
    """Every `name` in the column headed ``column`` of the page's tables."""
    names = []
    for text in markdown_cells():
        header = None
        for line in text.splitlines():
            if not line.startswith("|"):
                header = None
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif column in header and not set(line) <= set("|-: "):
                names += re.findall(r"`([^`]+)`", cells[header.index(column)])
    return names


def command_flags(program: str) -> list[str]:
    flags = []
    for text in markdown_cells():
        for line in text.splitlines():
            if line.startswith(program):
                flags += [f[2:].replace("-", "_") for f in re.findall(r"\s(--[a-z0-9-]+)", line)]
    return flags


@pytest.mark.parametrize("engine,column,known,program,flags", [
    ("vLLM", "vLLM setting", VLLM_NAMES, "vllm serve", VLLM_FLAGS),
    ("SGLang", "SGLang setting", SGLANG_NAMES, "python -m sglang.launch_server", SGLANG_FLAGS)])
def test_every_setting_on_the_page_is_the_engines(engine, column, known, program, flags):
    names, used = table_names(column), command_flags(program)
    assert len(set(names)) >= 40 and len(set(used)) >= 5  # the page's tables and commands were found
    assert not [n for n in names if n not in known], f"not {engine} settings"
    assert not [f for f in used if f not in flags], f"not {engine} flags"


def test_the_page_is_in_the_book_and_runs_with_the_notebooks():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files_ = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert "book/production" in files_
    assert "production.ipynb" in (ROOT / "tests" / "test_notebooks.py").read_text()


def table_row(setting: str) -> str:
    """The page's table row whose vLLM setting column starts with ``setting``."""
    for text in markdown_cells():
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) > 2 and cells[2].startswith(f"`{setting}`"):
                return line
    raise AssertionError(f"no row for {setting}")


def test_the_batch_defaults_are_vllms_for_both_front_ends():
    # vLLM's LLM class and `vllm serve` default to different batch limits (EngineArgs.get_batch_defaults):
    # the row gives both, each with its large-GPU variant, as recorded from 0.33.0.
    recorded_ = VLLM["EngineArgs"]["resolved_defaults"]
    row = table_row("max_num_seqs")
    for setting in ("max_num_seqs", "max_num_batched_tokens"):
        numbers = re.findall(r"\b(\d{3,5})\b(?![ -]GiB)", recorded_[setting])
        assert len(numbers) == 4, numbers  # LLM, LLM on large GPUs, serve, serve on large GPUs
        assert all(n in row for n in numbers), (setting, numbers)
    assert "`LLM`" in row and "`vllm serve`" in row


def test_the_auto_dtype_is_vllms():
    assert "bf16" in VLLM["EngineArgs"]["resolved_defaults"]["dtype"]
    row = table_row("model")
    assert "bf16" in row and "fp16" in row and "fp16 for fp32" not in row
