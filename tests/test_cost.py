"""condinit_det.launch.cost: the arithmetic of a plan's cost, its table, the step-bench loader, and bad input."""
import ast
import json
import math
import os

import pytest

from condinit_det.launch import cost
from condinit_det.launch.cost import (
    RunCost,
    StepTime,
    estimate,
    format_cost,
    format_duration,
    load_step_times,
    resolve_step_time,
)
from condinit_det.utils.errors import UsageError

VITDET = "configs/COCO/mask_rcnn_vitdet_b_100ep.py"
SWIN = "configs/COCO/mask_rcnn_swin_b_3x.py"
XCIT_IN1K = "configs/ImageNet/xcit_s12_p16_400ep.py"


def _arm(median):
    return {"median_step_s": median, "min_step_s": median, "timed_steps": 3, "rounds": 3,
            "peak_memory_bytes": 10 * 2 ** 30, "ratio_to_default": 1.0, "paired_ratio_to_default": 1.0, "sites": 12,
            "params_changed": 24, "parameters": 1000}


def _entry(name, stage, medians, batch_per_gpu=2):
    return {"name": name, "stage": stage, "recipe_gpus": 8, "total_batch": 8 * batch_per_gpu,
            "batch_per_gpu": batch_per_gpu, "image_size": [800, 1333], "amp": True, "error": None,
            "arms": {arm: _arm(m) for arm, m in medians.items()}, "tiny_overrides": []}


def write_bench(path, configs, *, tiny=False, fmt=cost.STEP_BENCH_FORMAT, device_name="NVIDIA H200"):
    """A file laid out as bench/bench_gpu_step.py writes it."""
    payload = {"format": fmt,
               "device": {"type": "cuda", "torch": "2.14.1", "name": device_name, "index": 0, "capability": "9.0",
                          "total_memory_bytes": 150 * 2 ** 30, "driver": "570.00", "cuda_runtime": "13.0",
                          "device_count": 1},
               "torch": "2.14.1", "machine": {}, "tiny": tiny, "input_size": "largest", "budget_s": 240.0,
               "warmup": 3, "seed": 0, "configs": configs, "elapsed_s": 200.0}
    path.write_text(json.dumps(payload))
    return str(path)


@pytest.fixture
def bench_file(tmp_path):
    return write_bench(tmp_path / "step_bench.json", {
        VITDET: _entry("mask_rcnn_vitdet_b_100ep", "detection",
                       {"default": 0.40, "mimetic": 0.41, "conditioned": 0.43}, batch_per_gpu=1),
        SWIN: _entry("mask_rcnn_swin_b_3x", "detection", {"default": 0.55, "mimetic": 0.52, "conditioned": 0.56}),
        XCIT_IN1K: _entry("xcit_s12_p16_400ep", "pretrain", {"default": 0.25, "mimetic": 0.25, "conditioned": 0.26},
                          batch_per_gpu=128),
        "configs/ImageNet/broken.py": {"name": "broken", "stage": "pretrain", "error": "OutOfMemoryError: CUDA out "
                                       "of memory", "arms": {}},
    })


# ---------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------
def test_run_wall_time_and_gpu_hours():
    table = estimate([RunCost(stage="detection", name="default/seed0", steps=1000, processes=8, step_seconds=0.5)])
    (row,) = table.rows
    assert row.wall_seconds == 500.0
    assert row.gpu_hours == pytest.approx(500.0 * 8 / 3600)
    assert table.total.wall_seconds == 500.0 and table.total.gpu_hours == pytest.approx(500.0 * 8 / 3600)
    assert table.eval_overhead == 0.0


def test_evaluation_overhead_scales_the_wall_time():
    run = RunCost(stage="pretrain", name="r", steps=3600, processes=4, step_seconds=1.0)
    table = estimate([run], eval_overhead=0.25)
    assert table.rows[0].wall_seconds == pytest.approx(4500.0)
    assert table.rows[0].gpu_hours == pytest.approx(5.0)  # 1.25 h x 4 GPUs


def test_stage_subtotals_and_total():
    runs = [RunCost(stage="pretrain", name=f"{arm}/seed{s}", steps=100_000, processes=8, step_seconds=0.3)
            for arm in ("default", "mimetic", "conditioned") for s in range(5)]
    runs += [RunCost(stage="detection", name=f"{arm}/seed{s}", steps=270_000, processes=8, step_seconds=0.6)
             for arm in ("default", "mimetic", "conditioned") for s in range(3)]
    table = estimate(runs)
    pre, det = table.stages
    assert (pre.stage, pre.runs, det.stage, det.runs) == ("pretrain", 15, "detection", 9)
    assert pre.steps == 1_500_000 and det.steps == 2_430_000
    assert pre.wall_seconds == pytest.approx(15 * 100_000 * 0.3)
    assert det.wall_seconds == pytest.approx(9 * 270_000 * 0.6)
    assert pre.gpu_hours == pytest.approx(15 * 100_000 * 0.3 * 8 / 3600)
    assert table.total.runs == 24 and table.total.steps == 3_930_000
    assert table.total.wall_seconds == pytest.approx(pre.wall_seconds + det.wall_seconds)
    assert table.total.gpu_hours == pytest.approx(pre.gpu_hours + det.gpu_hours)
    assert table.total.complete


def test_unknown_step_time_is_listed_not_summed():
    runs = [RunCost(stage="detection", name="a", steps=100, processes=2, step_seconds=1.0),
            RunCost(stage="detection", name="b", steps=100, processes=2, step_seconds=None)]
    table = estimate(runs)
    assert table.rows[1].wall_seconds is None and table.rows[1].gpu_hours is None
    (stage,) = table.stages
    assert stage.unknown_runs == 1 and not stage.complete
    assert stage.wall_seconds == 100.0 and stage.steps == 200
    assert table.as_dict()["total"]["unknown_runs"] == 1


@pytest.mark.parametrize("seconds, text", [
    (None, "?"), (0, "0:00"), (20, "<0:01"), (30, "0:00"), (31, "0:01"), (89, "0:01"), (91, "0:02"),
    (3600, "1:00"), (151.25 * 3600, "151:15"), (59 * 60 + 50, "1:00"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


# ---------------------------------------------------------------------------------------------
# The plan table
# ---------------------------------------------------------------------------------------------
def test_format_cost_rows_subtotals_total_and_sources():
    measured = StepTime(seconds=0.5, origin="measured", detail="bench file b.json on device NVIDIA H200 (x)")
    runs = [RunCost.with_step_time(stage="pretrain", name="default/seed0", steps=7200, processes=8,
                                   step_time=measured),
            RunCost.with_step_time(stage="pretrain", name="conditioned/seed0", steps=7200, processes=8,
                                   step_time=measured),
            RunCost.with_step_time(stage="detection", name="default/seed0", steps=6000, processes=2,
                                   step_time=StepTime.given(0.45))]
    text = format_cost(estimate(runs))
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["run", "stage", "steps", "GPUs", "wall h:mm",
                                                              "GPU-hours"]
    assert len({len(ln) for ln in lines if ln.startswith("|")}) == 1  # aligned columns

    def cells(prefix):
        return [[c.strip() for c in ln.split("|")[1:-1]] for ln in lines if ln.startswith(f"| {prefix}")]

    # 7200 x 0.5 s = 1 h on 8 GPUs; 6000 x 0.45 s = 45 min on 2 GPUs
    assert cells("default/seed0 ") == [["default/seed0", "pretrain", "7200", "8", "1:00", "8.00"],
                                       ["default/seed0", "detection", "6000", "2", "0:45", "1.50"]]
    (subtotal_pretrain,), (subtotal_detection,), (total,) = (cells(p) for p in ("subtotal pretrain",
                                                                                 "subtotal detection", "total"))
    assert subtotal_pretrain == ["subtotal pretrain (2 runs)", "pretrain", "14400", "", "2:00", "16.0"]
    assert subtotal_detection == ["subtotal detection (1 run)", "detection", "6000", "", "0:45", "1.50"]
    assert total == ["total (3 runs)", "", "20400", "", "2:45", "17.5"]
    assert "step time (pretrain): measured: bench file b.json on device NVIDIA H200 (x)" in lines
    assert "step time (detection): given: --step-time 0.45" in lines
    assert "evaluation overhead: not included (eval_overhead=0)" in lines
    # Subtotals follow their stage's runs.
    names = [ln.split("|")[1].strip() for ln in lines[2:] if ln.startswith("|")]
    assert names == ["default/seed0", "conditioned/seed0", "subtotal pretrain (2 runs)", "default/seed0",
                     "subtotal detection (1 run)", "total (3 runs)"]


def test_format_cost_states_the_overhead_and_unknown_runs():
    runs = [RunCost(stage="detection", name="a", steps=3600, processes=1, step_seconds=1.0),
            RunCost.with_step_time(stage="detection", name="b", steps=3600, processes=1, step_time=StepTime.unknown())]
    text = format_cost(estimate(runs, eval_overhead=0.1))
    assert "evaluation overhead: +10% of the training time (eval_overhead=0.1)" in text
    assert "step time (detection): unknown: pass --step-time or --step-bench" in text
    assert "1 run(s) without a step time are not summed" in text
    b_row = [ln for ln in text.splitlines() if ln.startswith("| b ")][0]
    assert [c.strip() for c in b_row.split("|")[1:-1]][-2:] == ["?", "?"]
    total = [ln for ln in text.splitlines() if ln.startswith("| total")][0]
    assert ">= 1:06" in total  # 3600 s x 1.1 = 66 min, a lower bound


# ---------------------------------------------------------------------------------------------
# Step times and the bench file
# ---------------------------------------------------------------------------------------------
def test_step_time_descriptions():
    assert StepTime.given(0.45).describe() == "given: --step-time 0.45"
    assert StepTime.unknown().describe() == "unknown: pass --step-time or --step-bench"
    assert StepTime.unknown().seconds is None


def test_loader_default_and_max_statistics(bench_file):
    times = load_step_times(bench_file)
    assert dict(times) == {VITDET: 0.40, SWIN: 0.55, XCIT_IN1K: 0.25}
    assert times.failed == {"configs/ImageNet/broken.py": "OutOfMemoryError: CUDA out of memory"}
    assert times.device == "NVIDIA H200" and times.path == bench_file
    slowest = load_step_times(bench_file, statistic="max")
    assert dict(slowest) == {VITDET: 0.43, SWIN: 0.56, XCIT_IN1K: 0.26}


@pytest.mark.parametrize("query", [
    SWIN, "mask_rcnn_swin_b_3x.py", "mask_rcnn_swin_b_3x", "COCO/mask_rcnn_swin_b_3x.py",
    "/some/checkout/configs/COCO/mask_rcnn_swin_b_3x.py", "./configs/COCO/mask_rcnn_swin_b_3x.py",
    "zoo:COCO/mask_rcnn_swin_b_3x.py",
])
def test_loader_matches_path_or_file_name(bench_file, query):
    step = load_step_times(bench_file).step_time(query)
    assert step.seconds == 0.55 and step.origin == "measured" and step.batch_per_gpu == 2
    assert step.describe() == (f"measured: bench file {bench_file} on device NVIDIA H200 "
                               "(default arm's median step)")


def test_resolve_step_time(bench_file):
    assert resolve_step_time(VITDET, step_time=0.3) == StepTime.given(0.3)
    assert resolve_step_time(VITDET, step_bench=bench_file).seconds == 0.40
    assert resolve_step_time(VITDET, step_bench=bench_file, statistic="max").seconds == 0.43
    assert resolve_step_time(VITDET).origin == "unknown"
    with pytest.raises(UsageError, match="--step-time and --step-bench both given"):
        resolve_step_time(VITDET, step_time=0.3, step_bench=bench_file)


# ---------------------------------------------------------------------------------------------
# Bad input: one line saying what was wrong and what is accepted
# ---------------------------------------------------------------------------------------------
def _one_line_error(fn, match):
    with pytest.raises(UsageError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bench_file_errors(bench_file, tmp_path):
    missing = str(tmp_path / "nope.json")
    _one_line_error(lambda: load_step_times(missing), f"step bench file {missing} does not exist")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_line_error(lambda: load_step_times(str(bad)), "is not a step bench file: Expecting")
    other = write_bench(tmp_path / "other.json", {}, fmt="something/2")
    _one_line_error(lambda: load_step_times(other), "format 'something/2', expected 'condinit_det.step_bench/1'")
    tiny = write_bench(tmp_path / "tiny.json", {SWIN: _entry("s", "detection", {"default": 0.1})}, tiny=True)
    _one_line_error(lambda: load_step_times(tiny), "measured with --tiny")
    assert load_step_times(tiny, allow_tiny=True)[SWIN] == 0.1
    _one_line_error(lambda: load_step_times(bench_file, statistic="mean"), "accepted: default, max")
    times = load_step_times(bench_file)
    text = _one_line_error(lambda: times.step_time("mask_rcnn_r50_3x.py"), "is not in bench file")
    assert SWIN in text and VITDET in text  # says what it holds
    _one_line_error(lambda: times.step_time("broken"), "its run failed .OutOfMemoryError")
    _one_line_error(lambda: times.step_time(""), "a config path or file name is needed")


def test_ambiguous_file_name(tmp_path):
    path = write_bench(tmp_path / "b.json", {"configs/COCO/x.py": _entry("x", "detection", {"default": 0.1}),
                                             "configs/LVIS/x.py": _entry("x", "detection", {"default": 0.2})})
    times = load_step_times(path)
    _one_line_error(lambda: times.step_time("x.py"), "matches several configs")
    assert times.step_time("LVIS/x.py").seconds == 0.2


@pytest.mark.parametrize("medians, statistic, match", [
    ({"default": 0.0}, "default", "median_step_s must be a positive number, got 0.0"),
    ({"default": -1.0}, "default", "must be a positive number"),
    ({"default": None}, "default", "must be a positive number, got None"),
    ({"mimetic": 0.3}, "default", "has no 'default' arm"),
    ({}, "default", "has no measured arm"),
])
def test_bad_values_in_bench_file(tmp_path, medians, statistic, match):
    path = write_bench(tmp_path / "b.json", {SWIN: _entry("s", "detection", medians)})
    _one_line_error(lambda: load_step_times(path, statistic=statistic), match)


def test_max_statistic_needs_no_default_arm(tmp_path):
    path = write_bench(tmp_path / "b.json", {SWIN: _entry("s", "detection", {"mimetic": 0.3, "conditioned": 0.4})})
    assert load_step_times(path, statistic="max")[SWIN] == 0.4


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0), "steps of run r must be a positive integer, got 0"),
    (dict(steps=-5), "must be a positive integer"),
    (dict(steps=1.5), "must be a positive integer, got 1.5"),
    (dict(steps=True), "must be a positive integer, got True"),
    (dict(processes=0), "processes of run r must be a positive integer"),
    (dict(step_seconds=0.0), "step seconds of run r must be a positive number, got 0.0"),
    (dict(step_seconds=-0.1), "must be a positive number"),
    (dict(step_seconds=math.nan), "must be a positive number, got nan"),
    (dict(step_seconds=math.inf), "must be a positive number, got inf"),
    (dict(stage=""), "a run's stage must be a non-empty string"),
    (dict(name=None), "a run's name must be a non-empty string, got None"),
])
def test_bad_run(kwargs, match):
    args = dict(stage="detection", name="r", steps=10, processes=1, step_seconds=0.5)
    args.update(kwargs)
    _one_line_error(lambda: RunCost(**args), match)


def test_bad_estimate_and_step_time_input():
    run = RunCost(stage="detection", name="r", steps=10, processes=1, step_seconds=0.5)
    _one_line_error(lambda: estimate([]), "the plan is empty")
    _one_line_error(lambda: estimate([run], eval_overhead=-0.1), "fraction >= 0")
    _one_line_error(lambda: estimate([run], eval_overhead=math.nan), "fraction >= 0")
    _one_line_error(lambda: estimate([("detection", "r", 10, 1, 0.5)]), "takes RunCost objects, got tuple")
    _one_line_error(lambda: StepTime.given(0), "--step-time must be a positive number, got 0")
    _one_line_error(lambda: StepTime.given(-2.0, flag="--pretrain-step-time"), "--pretrain-step-time must be")
    _one_line_error(lambda: StepTime(seconds=1.0, origin="guessed"), "accepted: measured, given, unknown")
    _one_line_error(lambda: format_cost("table"), "takes the CostTable of estimate")
    _one_line_error(lambda: format_duration(-1.0), "finite number of seconds >= 0")


def test_module_imports_no_torch_or_detectron2():
    """The launcher calls it for --dry-run: it must stay cheap to import (no torch, detectron2, timm)."""
    tree = ast.parse(open(cost.__file__).read())
    imported = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            imported |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0:
            imported.add(n.module.split(".")[0])
    assert not imported & {"torch", "detectron2", "timm", "numpy"}, imported
    assert os.path.basename(cost.__file__) == "cost.py"
