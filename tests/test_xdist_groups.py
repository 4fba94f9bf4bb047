"""`make test-browser` relies on pytest-xdist's --dist loadgroup: a page's tests on one worker, so they
share its loaded tab (tests/conftest.py). pytest 9.2 stores node ids in a form xdist 3.8 cannot
rename (pytest-xdist #1386): every test then went to any worker, nothing failed, and the browser tests
took 205 s instead of 109 here. This runs the pinned pair on two groups of tests and checks that each
group stayed on one worker."""
import json
import subprocess
import sys
import textwrap


def test_loadgroup_keeps_each_group_on_one_worker(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the root: not the course's config
    (tmp_path / "test_groups.py").write_text(textwrap.dedent("""
        import json, os
        import pytest

        @pytest.mark.parametrize("group", ["a", "b"])
        @pytest.mark.parametrize("i", range(6))
        def test_one(group, i):
            with open(os.environ["WHERE"], "a") as f:
                f.write(json.dumps([group, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
    """))
    # marked as tests/conftest.py marks the browser tests: at collection, before xdist reads the marks
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_collection_modifyitems(items):
            for item in items:
                item.add_marker(pytest.mark.xdist_group(item.callspec.params["group"]))
    """))
    where = tmp_path / "where.jsonl"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "test_groups.py"], cwd=tmp_path, capture_output=True, text=True,
                         env={"WHERE": str(where), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = [json.loads(line) for line in where.read_text().splitlines()]
    assert len(seen) == 12
    workers = {group: {w for g, w in seen if g == group} for group in "ab"}
    assert all(len(w) == 1 for w in workers.values()), f"a group ran on several workers: {workers}"
