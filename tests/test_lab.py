"""`make lab` starts JupyterLab on 127.0.0.1 with the chapters open, as root too (containers and
rented GPU machines run as root, where Jupyter refuses to start without --allow-root)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# `-o setup`: the venv is there already; never reinstall it from a test.
MAKE = ["make", "--no-print-directory", "-o", "setup", "lab"]

pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (ROOT / ".venv/bin/jupyter").exists(),
                                reason="needs make and the venv's jupyter")


def test_recipe_binds_localhost_and_allows_root_only_as_root():
    recipe = subprocess.run(["make", "-n", *MAKE[1:]], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "jupyter lab" in recipe and "--ip=127.0.0.1" in recipe and "chapters/" in recipe
    assert ("--allow-root" in recipe) == (os.geteuid() == 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


def test_make_lab_answers_over_http_with_the_chapters(tmp_path):
    port, token = _free_port(), "lab-test-token"
    env = {**os.environ, "JUPYTER_PORT": str(port), "JUPYTER_PORT_RETRIES": "0", "JUPYTER_TOKEN": token,
           "BROWSER": "true",  # the browser it opens: a no-op
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    log = open(tmp_path / "lab.log", "w+")
    lab = subprocess.Popen(MAKE, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)  # its own process group, stopped as one below
    try:
        deadline, answer = time.monotonic() + 90, None
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                answer = _get(f"http://127.0.0.1:{port}/api/contents?token={token}")
                break
            except OSError:
                time.sleep(0.5)
        log.seek(0)
        assert answer is not None, f"make lab did not answer on port {port} (exit {lab.poll()}):\n{log.read()[-3000:]}"
        status, body = answer
        names = {item["name"] for item in json.loads(body)["content"]}
        assert status == 200 and "01_inference_flow.ipynb" in names, names
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
            try:
                lab.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.wait()
        log.close()
