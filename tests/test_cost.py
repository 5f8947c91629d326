"""condinit_det.launch.cost: the arithmetic of a plan's cost, its table, the step-bench loader, and bad input."""
import ast
import json
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
def run(stage="detection", name="r", steps=10, processes=1, seconds=0.5):
    step = StepTime() if seconds is None else StepTime(seconds, "x")
    return RunCost(stage=stage, name=name, steps=steps, processes=processes, step=step)


def test_run_wall_time_and_gpu_hours():
    cost = estimate([run(name="default/seed0", steps=1000, processes=8, seconds=0.5)])
    assert cost.wall_seconds == 500.0
    assert cost.gpu_hours == pytest.approx(500.0 * 8 / 3600)
    assert (cost.runs, cost.unknown, cost.steps) == (1, 0, 1000)


def test_evaluation_overhead_scales_the_wall_time():
    cost = estimate([run(stage="pretrain", steps=3600, processes=4, seconds=1.0)], eval_overhead=0.25)
    assert cost.wall_seconds == pytest.approx(4500.0)
    assert cost.gpu_hours == pytest.approx(5.0)  # 1.25 h x 4 GPUs


def test_runs_one_after_another():
    pre = [run(stage="pretrain", name=f"{arm}/seed{s}", steps=100_000, processes=8, seconds=0.3)
           for arm in ("default", "mimetic", "conditioned") for s in range(5)]
    det = [run(name=f"{arm}/seed{s}", steps=270_000, processes=4, seconds=0.6)
           for arm in ("default", "mimetic", "conditioned") for s in range(3)]
    p, d, total = estimate(pre), estimate(det), estimate(pre + det)
    assert (p.runs, p.steps, d.runs, d.steps) == (15, 1_500_000, 9, 2_430_000)
    assert p.wall_seconds == pytest.approx(15 * 100_000 * 0.3)
    assert d.gpu_hours == pytest.approx(9 * 270_000 * 0.6 * 4 / 3600)
    assert total.runs == 24 and total.steps == 3_930_000 and total.unknown == 0
    assert total.wall_seconds == pytest.approx(p.wall_seconds + d.wall_seconds)
    assert total.gpu_hours == pytest.approx(p.gpu_hours + d.gpu_hours)


def test_unknown_step_time_is_counted_not_summed():
    cost = estimate([run(steps=100, processes=2, seconds=1.0), run(steps=100, processes=2, seconds=None)])
    assert (cost.runs, cost.unknown, cost.steps, cost.wall_seconds) == (2, 1, 200, 100.0)


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00"), (20, "<0:01"), (30, "0:00"), (31, "0:01"), (89, "0:01"), (91, "0:02"),
    (3600, "1:00"), (151.25 * 3600, "151:15"), (59 * 60 + 50, "1:00"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


# ---------------------------------------------------------------------------------------------
# The plan table
# ---------------------------------------------------------------------------------------------
def _cells(line):
    return [c.strip() for c in line.split("|")[1:-1]]


def test_format_cost_rows_subtotals_total_and_sources():
    measured = StepTime(0.5, "measured: bench file b.json on device NVIDIA H200 (x)")
    given = resolve_step_time(VITDET, step_time=0.45)
    runs = [RunCost(stage="pretrain", name="default/seed0", steps=7200, processes=8, step=measured),
            RunCost(stage="detection", name="default/seed0", steps=6000, processes=2, step=given),
            RunCost(stage="pretrain", name="conditioned/seed0", steps=7200, processes=8, step=measured)]
    lines = format_cost(runs).splitlines()
    assert _cells(lines[0]) == ["run", "stage", "steps", "GPUs", "wall h:mm", "GPU-hours"]
    assert set(lines[1]) == {"|", "-"}
    assert len({len(ln) for ln in lines if ln.startswith("|")}) == 1  # aligned columns
    # 7200 x 0.5 s = 1 h on 8 GPUs; 6000 x 0.45 s = 45 min on 2 GPUs; each stage's runs, then its subtotal
    assert [_cells(ln) for ln in lines[2:8]] == [
        ["default/seed0", "pretrain", "7200", "8", "1:00", "8.00"],
        ["conditioned/seed0", "pretrain", "7200", "8", "1:00", "8.00"],
        ["subtotal pretrain (2 runs)", "pretrain", "14400", "", "2:00", "16.0"],
        ["default/seed0", "detection", "6000", "2", "0:45", "1.50"],
        ["subtotal detection (1 run)", "detection", "6000", "", "0:45", "1.50"],
        ["total (3 runs)", "", "20400", "", "2:45", "17.5"],
    ]
    assert lines[8:] == [
        "wall time: steps x step time x (1 + evaluation overhead); subtotals and total: the runs one after another. "
        "GPU-hours: wall time x GPUs.",
        "step time (pretrain): measured: bench file b.json on device NVIDIA H200 (x)",
        "step time (detection): given: --step-time 0.45",
        "evaluation overhead: not included (eval_overhead=0)",
    ]


def test_format_cost_states_the_overhead_and_unknown_runs():
    runs = [run(name="a", steps=3600, seconds=1.0), run(name="b", steps=3600, seconds=None),
            run(stage="pretrain", name="c", steps=3600, seconds=None)]
    lines = format_cost(runs, eval_overhead=0.1).splitlines()
    rows = {_cells(ln)[0]: _cells(ln)[1:] for ln in lines[2:] if ln.startswith("|")}
    assert rows["b"][-2:] == ["?", "?"]
    assert rows["subtotal detection (2 runs)"][-2:] == [">= 1:06", ">= 1.10"]  # 3600 s x 1.1, a lower bound
    assert rows["subtotal pretrain (1 run)"][-2:] == ["?", "?"]
    assert rows["total (3 runs)"][-2:] == [">= 1:06", ">= 1.10"]
    assert "evaluation overhead: +10% of the training time (eval_overhead=0.1)" in lines
    assert "step time (detection): unknown: pass --step-time or --step-bench" in lines
    assert lines[-1] == "2 run(s) without a step time are not summed (>=): pass --step-time or --step-bench"


def test_an_empty_plan_is_an_error():
    _one_line_error(lambda: format_cost([]), "no run to estimate: the plan is empty")


# ---------------------------------------------------------------------------------------------
# Step times and the bench file
# ---------------------------------------------------------------------------------------------
def test_loader_reads_the_default_arms_median(bench_file):
    times = load_step_times(bench_file)
    assert dict(times) == {VITDET: 0.40, SWIN: 0.55, XCIT_IN1K: 0.25}
    assert times.failed == {"configs/ImageNet/broken.py": "OutOfMemoryError: CUDA out of memory"}
    assert times.device == "NVIDIA H200" and times.path == bench_file


@pytest.mark.parametrize("query", [
    SWIN, "mask_rcnn_swin_b_3x.py", "mask_rcnn_swin_b_3x", "COCO/mask_rcnn_swin_b_3x.py",
    "/some/checkout/configs/COCO/mask_rcnn_swin_b_3x.py", "./configs/COCO/mask_rcnn_swin_b_3x.py",
    "zoo:COCO/mask_rcnn_swin_b_3x.py",
])
def test_loader_matches_path_or_file_name(bench_file, query):
    step = load_step_times(bench_file).step_time(query)
    assert step == StepTime(0.55, f"measured: bench file {bench_file} on device NVIDIA H200 (default arm's median "
                                  "step)")


def test_resolve_step_time(bench_file):
    assert resolve_step_time(VITDET, step_time=0.3) == StepTime(0.3, "given: --step-time 0.3")
    assert resolve_step_time(VITDET, step_bench=bench_file).seconds == 0.40
    assert resolve_step_time(VITDET) == StepTime(None, "unknown: pass --step-time or --step-bench")


# ---------------------------------------------------------------------------------------------
# Bad input: one line saying what was wrong and what is accepted
# ---------------------------------------------------------------------------------------------
def _one_line_error(fn, match):
    with pytest.raises(UsageError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("seconds", [0.0, -2.0, float("nan"), float("inf")])
def test_bad_step_time(seconds):
    _one_line_error(lambda: resolve_step_time(VITDET, step_time=seconds),
                    f"--step-time must be a positive number, got {seconds!r}")


def test_step_time_and_step_bench_together(bench_file):
    _one_line_error(lambda: resolve_step_time(VITDET, step_time=0.3, step_bench=bench_file),
                    "--step-time and --step-bench both given; pass one")


def test_bench_file_errors(bench_file, tmp_path):
    missing = str(tmp_path / "nope.json")
    _one_line_error(lambda: resolve_step_time(VITDET, step_bench=missing),
                    f"step bench file {missing} does not exist .write it with bench/bench_gpu_step.py --output PATH")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_line_error(lambda: load_step_times(str(bad)), "is not a step bench file: Expecting")
    bad.write_text("[]")
    _one_line_error(lambda: load_step_times(str(bad)), "format 'list', expected 'condinit_det.step_bench/1'")
    other = write_bench(tmp_path / "other.json", {}, fmt="something/2")
    _one_line_error(lambda: load_step_times(other), "format 'something/2', expected 'condinit_det.step_bench/1'")
    tiny = write_bench(tmp_path / "tiny.json", {SWIN: _entry("s", "detection", {"default": 0.1})}, tiny=True)
    _one_line_error(lambda: load_step_times(tiny), "measured with --tiny: its step times are not the recipes'")
    step = load_step_times(tiny, allow_tiny=True).step_time(SWIN)
    assert step.seconds == 0.1 and step.source.endswith("(default arm's median step, tiny sizes)")
    text = _one_line_error(lambda: resolve_step_time("mask_rcnn_r50_3x.py", step_bench=bench_file),
                           "config mask_rcnn_r50_3x.py is not in bench file .*; it holds: ")
    assert SWIN in text and VITDET in text and "broken.py" in text  # says what it holds
    _one_line_error(lambda: resolve_step_time("broken", step_bench=bench_file),
                    "has no step time for configs/ImageNet/broken.py: its run failed .OutOfMemoryError")


def test_ambiguous_file_name(tmp_path):
    path = write_bench(tmp_path / "b.json", {"configs/COCO/x.py": _entry("x", "detection", {"default": 0.1}),
                                             "configs/LVIS/x.py": _entry("x", "detection", {"default": 0.2})})
    times = load_step_times(path)
    _one_line_error(lambda: times.step_time("x.py"), "matches several configs .*: configs/COCO/x.py, "
                    "configs/LVIS/x.py; give its path")
    assert times.step_time("LVIS/x.py").seconds == 0.2


@pytest.mark.parametrize("entry, match", [
    (_entry("s", "detection", {"default": 0.0}), "arms.default.median_step_s must be a positive number, got 0.0"),
    (_entry("s", "detection", {"default": -1.0}), "must be a positive number, got -1.0"),
    (_entry("s", "detection", {"default": None}), "must be a positive number, got None"),
    (_entry("s", "detection", {"mimetic": 0.3}), "has no measured 'default' arm .arms: mimetic"),
    (_entry("s", "detection", {}), "has no measured 'default' arm .arms: none"),
    ("oops", "has no measured 'default' arm"),
])
def test_bad_values_in_bench_file(tmp_path, entry, match):
    path = write_bench(tmp_path / "b.json", {SWIN: entry})
    _one_line_error(lambda: load_step_times(path), match)


def test_bench_file_without_configs(tmp_path):
    path = write_bench(tmp_path / "b.json", ["x"])
    _one_line_error(lambda: load_step_times(path), "'configs' must map config paths to results")


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
