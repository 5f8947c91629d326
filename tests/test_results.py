import json
import math
import os

import pytest

from condinit_det.records.results import METRICS_FILENAME, RESULTS_FILENAME, ResultsFile, truncate_metrics


def _ap(iteration, ap, kind="ap", **extra):
    return {
        "kind": kind,
        "iteration": iteration,
        "arm": "conditioned",
        "seed": 0,
        "config": "c.py",
        "bbox": {"AP": ap},
        **extra,
    }


def test_add_writes_strict_json_sorted_by_iteration(tmp_path):
    rf = ResultsFile(tmp_path)
    rf.add(_ap(20, 2.0))
    rf.add(_ap(10, 1.0))
    rf.add({"kind": "conditioning", "iteration": 10, "site": "b.attn", "kappa": 3.0})
    with open(tmp_path / RESULTS_FILENAME) as f:
        data = json.load(f)
    assert data["version"] == 1
    assert [r["iteration"] for r in data["records"]] == [10, 10, 20]
    assert [r["iteration"] for r in rf.records("ap")] == [10, 20]
    assert [r["bbox"]["AP"] for r in rf.records("ap")] == [1.0, 2.0]
    assert [r["kind"] for r in rf.records()] == ["ap", "conditioning", "ap"]
    # no temporary files left behind
    assert sorted(os.listdir(tmp_path)) == [RESULTS_FILENAME]


def test_same_key_replaces_and_sites_are_distinct(tmp_path):
    rf = ResultsFile(tmp_path)
    rf.add(_ap(10, 1.0))
    rf.add(_ap(10, 1.5))
    rf.extend(
        [
            {"kind": "conditioning", "iteration": 10, "site": "a", "kappa": 2.0},
            {"kind": "conditioning", "iteration": 10, "site": "b", "kappa": 4.0},
        ]
    )
    rf.add({"kind": "conditioning", "iteration": 10, "site": "a", "kappa": 5.0})
    aps = rf.records("ap")
    assert len(aps) == 1 and aps[0]["bbox"]["AP"] == 1.5
    kappas = {r["site"]: r["kappa"] for r in rf.records("conditioning")}
    assert kappas == {"a": 5.0, "b": 4.0}


def test_resume_keeps_earlier_points(tmp_path):
    first = ResultsFile(tmp_path)
    for it, ap in ((100, 1.0), (200, 2.0), (300, 3.0)):
        first.add(_ap(it, ap))
    # A resumed run (new object, as in a new process) re-evaluates 300 and goes on.
    resumed = ResultsFile(str(tmp_path))
    resumed.add(_ap(300, 3.25))
    resumed.add(_ap(400, 4.0))
    recs = ResultsFile(tmp_path).records("ap")
    assert [(r["iteration"], r["bbox"]["AP"]) for r in recs] == [(100, 1.0), (200, 2.0), (300, 3.25), (400, 4.0)]


def test_failed_write_leaves_previous_file_intact(tmp_path, monkeypatch):
    rf = ResultsFile(tmp_path)
    rf.add(_ap(10, 1.0))
    before = (tmp_path / RESULTS_FILENAME).read_text()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    # Fails after the temp file was written, before the rename.
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        rf.add(_ap(20, 2.0))
    monkeypatch.undo()
    assert (tmp_path / RESULTS_FILENAME).read_text() == before
    assert sorted(os.listdir(tmp_path)) == [RESULTS_FILENAME]


def test_non_finite_values_are_stored_as_null(tmp_path):
    rf = ResultsFile(tmp_path)
    rf.add({"kind": "ap", "iteration": 5, "bbox": {"AP": 1.0, "APl": float("nan"), "APm": math.inf}})
    text = (tmp_path / RESULTS_FILENAME).read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = rf.records()[0]
    assert rec["bbox"] == {"AP": 1.0, "APl": None, "APm": None}


@pytest.mark.parametrize(
    "record, match",
    [
        ({"iteration": 1}, "kind"),
        ({"kind": "ap"}, "iteration"),
        ({"kind": "ap", "iteration": -1}, "iteration"),
        ({"kind": "ap", "iteration": 1.5}, "iteration"),
        ({"kind": "ap", "iteration": True}, "iteration"),
    ],
)
def test_invalid_records_are_rejected(tmp_path, record, match):
    with pytest.raises(ValueError, match=match):
        ResultsFile(tmp_path).add(record)
    assert not (tmp_path / RESULTS_FILENAME).exists()


def test_corrupt_file_is_not_overwritten(tmp_path):
    (tmp_path / RESULTS_FILENAME).write_text("{not json")
    rf = ResultsFile(tmp_path)
    with pytest.raises(ValueError, match="not valid JSON"):
        rf.add(_ap(1, 1.0))
    assert (tmp_path / RESULTS_FILENAME).read_text() == "{not json"
    (tmp_path / RESULTS_FILENAME).write_text("[]")
    with pytest.raises(ValueError, match="'records' list"):
        rf.records()


def test_truncate_metrics_keeps_the_lines_up_to_the_checkpoint(tmp_path):
    truncate_metrics(str(tmp_path), max_iteration=5)  # no metrics.json: nothing to do
    assert os.listdir(tmp_path) == []
    lines = [json.dumps({"iteration": i, "total_loss": 1.0 / (i + 1)}) for i in (0, 4, 5, 6, 9)]
    (tmp_path / METRICS_FILENAME).write_text("\n".join(lines[:3]) + "\n" + "\n".join(lines[3:]) + '\n{"iteration": 1')
    truncate_metrics(str(tmp_path), max_iteration=5)
    assert (tmp_path / METRICS_FILENAME).read_text() == "\n".join(lines[:3]) + "\n"  # the torn last line goes too
    assert sorted(os.listdir(tmp_path)) == [METRICS_FILENAME]  # replaced through a temporary file, none left
    assert truncate_metrics(str(tmp_path), max_iteration=4) == 4  # the writers continue after it
    assert (tmp_path / METRICS_FILENAME).read_text() == "\n".join(lines[:2]) + "\n"
    # With the file's length at the checkpoint: what was written later goes, whatever its iteration.
    (tmp_path / METRICS_FILENAME).write_text("\n".join(lines[:2] + lines[3:4] + lines[1:2]) + "\n")
    assert truncate_metrics(str(tmp_path), max_iteration=0, size=len(lines[0]) + len(lines[1]) + 2) == 4
    assert (tmp_path / METRICS_FILENAME).read_text() == "\n".join(lines[:2]) + "\n"
    assert truncate_metrics(str(tmp_path), max_iteration=0, size=0) == -1
    assert (tmp_path / METRICS_FILENAME).read_text() == ""
