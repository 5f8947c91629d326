import csv
import importlib.util
import json
import math
import os

import pytest

from condinit_det.engine.results import ResultsFile
from condinit_det.report import compare_arms, find_runs, summarize_runs

ITERS = (100, 200, 300, 400)
# arm -> seed -> (box AP curve, mask AP curve)
CURVES = {
    "default": {0: ([10, 20, 30, 40], [8, 16, 24, 32]), 1: ([12, 22, 32, 42], [10, 18, 26, 34])},
    "conditioned": {0: ([15, 30, 41.5, 45], [12, 25, 33, 36]), 1: ([17, 32, 40.5, 47], [14, 27, 35, 38])},
    "mimetic": {0: ([5, 10, 20, 30], [4, 8, 16, 24])},
}


def _write_run(path, arm, seed, box, mask, kappa=None):
    os.makedirs(path)
    with open(os.path.join(path, "condinit_arm_report.json"), "w") as f:
        json.dump({"arm": arm, "seed": seed, "options": {}, "sites": []}, f)
    rf = ResultsFile(path)
    for it, b, m in zip(ITERS, box, mask):
        rf.add({"kind": "ap", "iteration": it, "arm": arm, "seed": seed, "config": "cfg.py",
                "bbox": {"AP": b, "AP50": b + 20, "AP75": b + 5, "APs": float("nan"), "APm": b, "APl": b},
                "segm": {"AP": m, "AP50": m + 20, "AP75": m + 5, "APs": m, "APm": m, "APl": m}})
        if kappa is not None:
            rf.extend({"kind": "conditioning", "iteration": it, "site": f"blocks.{i}.attn",
                       "kappa": kappa * (i + 1) * it, "arm": arm, "seed": seed} for i in range(2))


@pytest.fixture
def experiment(tmp_path):
    exp = tmp_path / "exp"
    for arm, seeds in CURVES.items():
        for seed, (box, mask) in seeds.items():
            _write_run(str(exp / f"{arm}_s{seed}"), arm, seed, box, mask,
                       kappa=1.0 if arm == "conditioned" else (10.0 if arm == "default" else None))
    return exp


def test_table_numbers_and_convergence(experiment):
    report = summarize_runs(find_runs([str(experiment)]))
    assert [a.arm for a in report.arms] == ["default", "mimetic", "conditioned"]
    d, m, c = (report.arm(a) for a in ("default", "mimetic", "conditioned"))
    assert d.seeds == [0, 1] and m.seeds == [0] and c.seeds == [0, 1]
    assert d.final["AP^b"] == pytest.approx((41.0, math.sqrt(2)))
    assert d.final["AP^b_50"] == pytest.approx((61.0, math.sqrt(2)))
    assert c.final["AP^b_75"] == pytest.approx((51.0, math.sqrt(2)))
    assert c.final["AP^m"] == pytest.approx((37.0, math.sqrt(2)))
    assert m.final["AP^m_50"] == pytest.approx((44.0, 0.0))
    assert report.default_final == {"bbox": (400, pytest.approx(41.0)), "segm": (400, pytest.approx(33.0))}
    # seed-averaged conditioned box curve [16, 31, 41, 46] first reaches 41 at 300
    assert c.reach_iteration == {"bbox": 300, "segm": 300}
    assert c.speedup["bbox"] == pytest.approx(25.0) and c.speedup["segm"] == pytest.approx(25.0)
    assert d.reach_iteration["bbox"] == 400 and d.speedup["bbox"] == pytest.approx(0.0)
    assert m.reach_iteration == {"bbox": None, "segm": None} and m.speedup["bbox"] is None
    its, mean, std = c.curves["bbox"]
    assert list(its) == list(ITERS) and list(mean) == pytest.approx([16, 31, 41, 46])
    assert list(std) == pytest.approx([math.sqrt(2), math.sqrt(2), math.sqrt(0.5), math.sqrt(2)])
    # κ: median over sites and seeds per iteration
    k_its, k_med, k_lo, k_hi = report.kappa["conditioned"]
    assert list(k_its) == list(ITERS)
    assert k_med[0] == pytest.approx(150.0) and k_lo[0] == 100.0 and k_hi[0] == 200.0
    assert "mimetic" not in report.kappa


def test_written_files(experiment, tmp_path):
    out = tmp_path / "report"
    _, text = compare_arms([str(experiment)], output_dir=str(out))
    assert sorted(os.listdir(out)) == sorted(
        ["report.md", "summary.csv", "curves.csv", "bbox_ap.png", "segm_ap.png", "kappa.png"])
    assert (out / "report.md").read_text() == text
    table = text.split("## Convergence")[0]
    rows = {r[0]: r for r in [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]}
    assert rows["| default"][1:4] == ["41.0 ± 1.4", "61.0 ± 1.4", "46.0 ± 1.4"]
    assert rows["| mimetic"][1] == "30.0"  # one seed: no ±
    assert rows["| conditioned"][1:7] == ["46.0 ± 1.4", "66.0 ± 1.4", "51.0 ± 1.4",
                                          "37.0 ± 1.4", "57.0 ± 1.4", "42.0 ± 1.4"]
    assert "| conditioned | 300 | 25.0% | 300 | 25.0% |" in text
    assert "| mimetic | not reached | not reached | not reached | not reached |" in text

    with open(out / "summary.csv") as f:
        summary = {r["arm"]: r for r in csv.DictReader(f)}
    assert float(summary["conditioned"]["AP^b"]) == pytest.approx(46.0)
    assert float(summary["conditioned"]["AP^b_std"]) == pytest.approx(math.sqrt(2))
    assert float(summary["conditioned"]["bbox_speedup_percent"]) == pytest.approx(25.0)
    assert summary["mimetic"]["bbox_reach_iteration"] == ""
    assert summary["default"]["num_seeds"] == "2" and summary["default"]["final_iteration"] == "400"
    with open(out / "curves.csv") as f:
        curves = list(csv.DictReader(f))
    assert len(curves) == 5 * 4 * 2  # runs x iterations x tasks
    for name in ("bbox_ap.png", "segm_ap.png", "kappa.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_run_dirs_can_be_listed_individually(experiment):
    runs = find_runs([str(experiment / "default_s0"), str(experiment / "conditioned_s1")])
    report = summarize_runs(runs)
    assert report.arm("conditioned").final["AP^b"] == pytest.approx((47.0, 0.0))
    # 47-seed curve [17, 32, 40.5, 47] vs default final 40: first >= 40 is 300
    assert report.arm("conditioned").reach_iteration["bbox"] == 300


def test_without_default_arm_there_is_no_speedup(experiment):
    report, text = compare_arms([str(experiment / "mimetic_s0")])
    assert report.default_final == {} and report.arm("mimetic").speedup == {}
    assert "No runs of the default arm" in text


def test_errors(tmp_path, experiment):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="No runs under"):
        find_runs([str(empty)])
    with pytest.raises(ValueError, match="not a directory"):
        find_runs([str(tmp_path / "missing")])
    _write_run(str(tmp_path / "dup"), "default", 0, [1, 2, 3, 4], [1, 2, 3, 4])
    with pytest.raises(ValueError, match="several runs with seed"):
        summarize_runs(find_runs([str(experiment), str(tmp_path / "dup")]))


def _load_cli():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "compare_arms.py")
    spec = importlib.util.spec_from_file_location("compare_arms_cli", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli(experiment, tmp_path, capsys):
    cli = _load_cli()
    assert cli.main([str(experiment)]) == 0
    out = capsys.readouterr().out
    assert "| conditioned | 300 | 25.0% |" in out
    assert (experiment / "report" / "report.md").is_file()
    # the report dir inside the experiment is not mistaken for a run on a second pass
    assert cli.main([str(experiment), "--output", str(tmp_path / "r2")]) == 0
    assert (tmp_path / "r2" / "summary.csv").is_file()
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert cli.main([str(empty)]) == 2
    assert "No runs under" in capsys.readouterr().err
