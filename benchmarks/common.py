"""What every benchmark section shares: the machine's description, statistics, and the engines
under test (the plain model and the same model optimized). Clocks: ``inference_internals.timing``."""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

PLAIN, OPTIMIZED = "plain", "optimized"  # the two engines: Llama as loaded, and optimize(model, kernel="auto")


def load_engines(device, dtype=torch.float32) -> dict:
    """The plain model and an optimized copy (its own weights: optimize works in place)."""
    from inference_internals.model import Llama
    from inference_internals.optimize import optimize

    return {PLAIN: Llama.from_pretrained(device=device, dtype=dtype),
            OPTIMIZED: optimize(Llama.from_pretrained(device=device, dtype=dtype), kernel="auto")}


def machine_info(device: torch.device) -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
        isa = sorted({f for f in flags.split() if f.startswith(("avx512", "amx", "avx2"))})
    except (OSError, StopIteration):
        isa = []
    info = {"cpu": cpu or platform.processor(), "isa": isa, "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(), "device": str(device),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_avg_start": os.getloadavg(), "commit": _commit()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": props.name, "memory_GB": props.total_memory / 1e9,
                       "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    return info


def _commit() -> str:
    """The git commit measured, with '+changes' when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}

