import json
import os

import numpy as np
import pytest
from table_text import unpadded

from condinit_det.records.results import ResultsFile
from condinit_det.report import compare_arms, read_training_loss, smooth


def _line(it, loss=None, **extra):
    obj = {"iteration": it, "lr": 0.001, **extra}
    if loss is not None:
        obj.update(total_loss=loss, loss_cls=loss / 2)
    return json.dumps(obj, sort_keys=True)


def test_loss_extraction_resumed_and_garbled(tmp_path):
    first = [_line(it, 3.0 - it / 100) for it in range(19, 260, 20)]  # 19 ... 259
    lines = first[:5] + [_line(99, None, **{"bbox/AP": 12.0})] + first[5:]  # an eval line: no total_loss
    # killed while writing 279; the resumed run (from the checkpoint at 200) appends right after it
    lines.append('{"iteration": 279, "lr": 0.001, "total_l' + _line(219, 0.5))
    lines += [_line(it, 0.4) for it in (239, 259, 279)]
    lines.append("")
    lines.append('{"iteration": 299, "lr": 0.0')  # killed again: truncated last line
    path = tmp_path / "metrics.json"
    path.write_text("\n".join(lines))
    its, loss = read_training_loss(str(path))
    assert its.tolist() == [19, 39, 59, 79, 99, 119, 139, 159, 179, 199, 219, 239, 259, 279]
    assert loss[:10] == pytest.approx([3.0 - it / 100 for it in range(19, 200, 20)])
    assert loss[10:].tolist() == [0.5, 0.4, 0.4, 0.4]  # the later lines won
    assert read_training_loss(str(tmp_path))[0].tolist() == its.tolist()  # a run directory works too


def test_resume_without_garbled_line(tmp_path):
    lines = [_line(it, 1.0) for it in (19, 39, 59, 79)] + [_line(it, 2.0) for it in (39, 59)]
    (tmp_path / "metrics.json").write_text("\n".join(lines) + "\n")
    its, loss = read_training_loss(str(tmp_path / "metrics.json"))
    assert its.tolist() == [19, 39, 59] and loss.tolist() == [1.0, 2.0, 2.0]


def test_smoothing_is_a_trailing_median():
    assert smooth(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), window=3).tolist() == [5.0, 3.0, 4.0, 2.0, 3.0]
    v = np.ones(40)
    v[25] = 100.0  # one spike vanishes in a median of 20
    assert np.all(smooth(v) == 1.0)
    v = np.r_[np.full(10, 3.0), np.full(30, 0.5)]
    s = smooth(v)
    assert s[19] == pytest.approx(1.75) and s[20] == 0.5  # 10 of 20 vs 11 of 20 points at 0.5
    assert s[:10].tolist() == [3.0] * 10
    assert smooth(np.zeros(0)).shape == (0,)


def _run(path, arm, losses, its):
    os.makedirs(path)
    ResultsFile(str(path)).add(
        {
            "kind": "ap",
            "stage": "detection",
            "iteration": int(its[-1]) + 1,
            "arm": arm,
            "seed": 0,
            "bbox": {"AP": 30.0},
            "segm": {"AP": 25.0},
        }
    )
    with open(os.path.join(path, "metrics.json"), "w") as f:
        for it, loss in zip(its, losses):
            f.write(_line(int(it), float(loss)) + "\n")


def test_loss_convergence_known_answer(tmp_path):
    its = np.arange(19, 800, 20)  # 40 logged points, last at 799
    _run(tmp_path / "exp" / "default", "default", np.full(40, 1.0), its)
    # 3.0 for 10 points, then 0.5: the trailing median of 20 is 1.75 at point 19 and first reaches
    # 0.5 <= 1.0 (the default's final smoothed loss) at point 20, i.e. iteration 419
    _run(tmp_path / "exp" / "conditioned", "conditioned", np.r_[np.full(10, 3.0), np.full(30, 0.5)], its)
    report, text = compare_arms([str(tmp_path / "exp")], bootstrap=0)
    det = report.stage("detection")
    assert det.target["loss"] == (799, pytest.approx(1.0))
    c = det.arm("conditioned")
    assert c.reach["loss"] == 419
    assert c.speedup["loss"] == pytest.approx((1 - 419 / 799) * 100)  # 47.6 %
    assert det.arm("default").reach["loss"] == 19
    assert det.arm("default").speedup["loss"] == pytest.approx((1 - 19 / 799) * 100)
    assert "| LOSS | 1 at iteration 799 | 19 (97.6%) | 419 (47.6%) |" in unpadded(text)
    loss_row = [s for s in det.stats if s.arm == "conditioned" and s.key == "loss_speedup"][0]
    assert loss_row.values == {0: pytest.approx(47.559, abs=1e-3)} and loss_row.n == 1
