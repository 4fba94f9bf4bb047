"""benchmarks.run --only ... --merge: the sections run replace theirs in the committed file, the rest
stays, and each replaced section records the run that measured it (the pages name it)."""
import json

import pytest

from benchmarks.run import main, merged


def test_merge_replaces_only_the_sections_run_and_records_their_run(tmp_path):
    path = tmp_path / "latest.json"
    path.write_text(json.dumps({"machine": {"date": "2026-12-04"}, "decode": {"a": 1}, "step_parts": {"old": True}}))
    run = {"machine": {"date": "2026-12-06 21:51 UTC", "commit": "abc", "cpu": "AMD EPYC", "cores": 2}, "note": "",
           "step_parts": {"contexts": {}}, "decode": {"a": 2}}
    out = merged(path, run, ["step_parts"])
    assert out["decode"] == {"a": 1} and out["machine"] == {"date": "2026-12-04"}  # the rest as committed
    assert out["step_parts"] == {"contexts": {}}
    assert out["step_parts_run"] == {"date": "2026-12-06 21:51 UTC", "commit": "abc", "note": "the section alone",
                                     "cpu": "AMD EPYC", "cores": 2}
    with pytest.raises(SystemExit, match="does not exist"):
        merged(tmp_path / "none.json", run, ["step_parts"])


def test_merge_needs_the_sections_it_replaces(capsys):
    with pytest.raises(SystemExit):
        main(["--merge"])
    assert "--merge takes --only" in capsys.readouterr().err
