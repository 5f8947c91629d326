"""The cost of a plan (condinit_det.launch.plan): its table and arithmetic, the step-bench loader, and bad input."""

import json

import pytest

from condinit_det.launch import plan
from condinit_det.launch.plan import RunCost, StepTime, format_cost, load_step_times, resolve_step_time
from condinit_det.utils.errors import UsageError

VITDET = "configs/COCO/mask_rcnn_vitdet_b_100ep.py"
SWIN = "configs/COCO/mask_rcnn_swin_b_3x.py"
XCIT_IN1K = "configs/ImageNet/xcit_s12_p16_400ep.py"


def _arm(median):
    return {
        "median_step_s": median,
        "min_step_s": median,
        "timed_steps": 3,
        "rounds": 3,
        "peak_memory_bytes": 10 * 2**30,
        "ratio_to_default": 1.0,
        "paired_ratio_to_default": 1.0,
        "sites": 12,
        "params_changed": 24,
        "parameters": 1000,
    }


def _entry(name, stage, medians, batch_per_gpu=2):
    return {
        "name": name,
        "stage": stage,
        "recipe_gpus": 8,
        "total_batch": 8 * batch_per_gpu,
        "batch_per_gpu": batch_per_gpu,
        "image_size": [800, 1333],
        "amp": True,
        "error": None,
        "arms": {arm: _arm(m) for arm, m in medians.items()},
        "tiny_overrides": [],
    }


def write_bench(path, configs, *, tiny=False, fmt=plan.STEP_BENCH_FORMAT, device_name="NVIDIA H200"):
    """A file laid out as bench/bench_gpu_step.py writes it."""
    payload = {
        "format": fmt,
        "device": {
            "type": "cuda",
            "torch": "2.14.1",
            "name": device_name,
            "index": 0,
            "capability": "9.0",
            "total_memory_bytes": 150 * 2**30,
            "driver": "570.00",
            "cuda_runtime": "13.0",
            "device_count": 1,
        },
        "torch": "2.14.1",
        "machine": {},
        "tiny": tiny,
        "input_size": "largest",
        "budget_s": 240.0,
        "warmup": 3,
        "seed": 0,
        "configs": configs,
        "elapsed_s": 200.0,
    }
    path.write_text(json.dumps(payload))
    return str(path)


@pytest.fixture
def bench_file(tmp_path):
    return write_bench(
        tmp_path / "step_bench.json",
        {
            VITDET: _entry(
                "mask_rcnn_vitdet_b_100ep",
                "detection",
                {"default": 0.40, "mimetic": 0.41, "conditioned": 0.43},
                batch_per_gpu=1,
            ),
            SWIN: _entry("mask_rcnn_swin_b_3x", "detection", {"default": 0.55, "mimetic": 0.52, "conditioned": 0.56}),
            XCIT_IN1K: _entry(
                "xcit_s12_p16_400ep",
                "pretrain",
                {"default": 0.25, "mimetic": 0.25, "conditioned": 0.26},
                batch_per_gpu=128,
            ),
            "configs/ImageNet/broken.py": {
                "name": "broken",
                "stage": "pretrain",
                "error": "OutOfMemoryError: CUDA out of memory",
                "arms": {},
            },
        },
    )


# ---------------------------------------------------------------------------------------------
# The plan table and its arithmetic
# ---------------------------------------------------------------------------------------------
def _cells(line):
    return [c.strip() for c in line.split("|")[1:-1]]


def _rows(text):
    return {_cells(ln)[0]: _cells(ln)[1:] for ln in text.splitlines()[2:] if ln.startswith("|")}


def test_format_cost_rows_subtotals_total_and_sources():
    measured = StepTime(0.5, "measured: bench file b.json on device NVIDIA H200 (x)")
    given = resolve_step_time(VITDET, step_time=0.45)
    runs = [
        RunCost("pretrain", "default/seed0", 7200, 8, measured),
        RunCost("detection", "default/seed0", 6000, 2, given),
        RunCost("pretrain", "conditioned/seed0", 7200, 8, measured),
    ]
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
        "wall time: steps x step time; subtotals and total: the runs one after another. GPU-hours: wall time x GPUs. "
        "Evaluations are not included.",
        "step time (pretrain): measured: bench file b.json on device NVIDIA H200 (x)",
        "step time (detection): given: --step-time 0.45",
    ]


def test_cpu_runs_are_priced_in_cpu_hours_and_mixed_plans_in_device_hours():
    step = StepTime(1.0, "x")
    cpu = format_cost([RunCost("pretrain", "a", 3600, 2, step, "cpu")])
    assert _cells(cpu.splitlines()[0])[3:] == ["CPUs", "wall h:mm", "CPU-hours"]
    assert _rows(cpu)["a"] == ["pretrain", "3600", "2", "1:00", "2.00"] and "CPU-hours: wall time x CPUs" in cpu
    mixed = format_cost([RunCost("pretrain", "a", 3600, 2, step, "cpu"), RunCost("detection", "b", 3600, 8, step)])
    assert _cells(mixed.splitlines()[0])[3:] == ["devices", "wall h:mm", "device-hours"]
    assert _rows(mixed)["total (2 runs)"][-2:] == ["2:00", "10.0"]


def test_unknown_step_times_are_counted_not_summed():
    runs = [
        RunCost("detection", "a", 3600, 1, StepTime(1.0, "x")),
        RunCost("detection", "b", 3600, 1, StepTime()),
        RunCost("pretrain", "c", 3600, 1, StepTime()),
    ]
    text = format_cost(runs)
    rows = _rows(text)
    assert rows["b"][-2:] == ["?", "?"]
    assert rows["subtotal detection (2 runs)"][-2:] == [">= 1:00", ">= 1.00"]  # a lower bound
    assert rows["subtotal pretrain (1 run)"][-2:] == ["?", "?"]
    assert rows["total (3 runs)"][-2:] == [">= 1:00", ">= 1.00"]
    assert "step time (detection): unknown: pass --step-time or --step-bench" in text.splitlines()
    assert text.splitlines()[-1] == "2 run(s) without a step time are not summed (>=): pass --step-time or --step-bench"


@pytest.mark.parametrize(
    "seconds, text",
    [
        (20, "<0:01"),
        (30, "0:00"),
        (31, "0:01"),
        (89, "0:01"),
        (91, "0:02"),
        (3600, "1:00"),
        (151.25 * 3600, "151:15"),
        (59 * 60 + 50, "1:00"),
    ],
)
def test_wall_times_are_rounded_to_the_minute(seconds, text):
    assert _rows(format_cost([RunCost("detection", "a", 1, 1, StepTime(seconds, "x"))]))["a"][3] == text


def test_an_empty_plan_is_an_error():
    _one_line_error(lambda: format_cost([]), "no run to estimate: the plan is empty")


# ---------------------------------------------------------------------------------------------
# Step times and the bench file
# ---------------------------------------------------------------------------------------------
def test_loader_reads_the_default_arms_median(bench_file):
    seconds, failed, device = load_step_times(bench_file)
    assert seconds == {VITDET: 0.40, SWIN: 0.55, XCIT_IN1K: 0.25}
    assert failed == {"configs/ImageNet/broken.py": "OutOfMemoryError: CUDA out of memory"}
    assert device == "NVIDIA H200"


@pytest.mark.parametrize(
    "query",
    [
        SWIN,
        "mask_rcnn_swin_b_3x.py",
        "mask_rcnn_swin_b_3x",
        "COCO/mask_rcnn_swin_b_3x.py",
        "/some/checkout/configs/COCO/mask_rcnn_swin_b_3x.py",
        "./configs/COCO/mask_rcnn_swin_b_3x.py",
        "zoo:COCO/mask_rcnn_swin_b_3x.py",
    ],
)
def test_step_time_matches_path_or_file_name(bench_file, query):
    step = resolve_step_time(query, step_bench=bench_file)
    assert step == StepTime(
        0.55, f"measured: bench file {bench_file} on device NVIDIA H200 (default arm's median step)"
    )


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
    _one_line_error(
        lambda: resolve_step_time(VITDET, step_time=seconds), f"--step-time must be a positive number, got {seconds!r}"
    )


def test_step_time_and_step_bench_together(bench_file):
    _one_line_error(
        lambda: resolve_step_time(VITDET, step_time=0.3, step_bench=bench_file),
        "--step-time and --step-bench both given; pass one",
    )


def test_bench_file_errors(bench_file, tmp_path):
    missing = str(tmp_path / "nope.json")
    _one_line_error(
        lambda: resolve_step_time(VITDET, step_bench=missing),
        f"step bench file {missing} does not exist .write it with bench/bench_gpu_step.py --output PATH",
    )
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_line_error(lambda: load_step_times(str(bad)), "is not a step bench file: Expecting")
    bad.write_text("[]")
    _one_line_error(lambda: load_step_times(str(bad)), "format 'list', expected 'condinit_det.step_bench/1'")
    other = write_bench(tmp_path / "other.json", {}, fmt="something/2")
    _one_line_error(lambda: load_step_times(other), "format 'something/2', expected 'condinit_det.step_bench/1'")
    tiny = write_bench(tmp_path / "tiny.json", {SWIN: _entry("s", "detection", {"default": 0.1})}, tiny=True)
    _one_line_error(lambda: load_step_times(tiny), "measured with --tiny: its step times are not the recipes'")
    text = _one_line_error(
        lambda: resolve_step_time("mask_rcnn_r50_3x.py", step_bench=bench_file),
        "config mask_rcnn_r50_3x.py is not in bench file .*: ",
    )
    assert SWIN in text and VITDET in text and "broken.py" in text  # says what it holds
    _one_line_error(
        lambda: resolve_step_time("broken", step_bench=bench_file),
        "has no step time for configs/ImageNet/broken.py: its run failed .OutOfMemoryError",
    )


def test_ambiguous_file_name(tmp_path):
    path = write_bench(
        tmp_path / "b.json",
        {
            "configs/COCO/x.py": _entry("x", "detection", {"default": 0.1}),
            "configs/LVIS/x.py": _entry("x", "detection", {"default": 0.2}),
        },
    )
    _one_line_error(
        lambda: resolve_step_time("x.py", step_bench=path),
        "matches several configs in bench file .*: configs/COCO/x.py, configs/LVIS/x.py; give its path",
    )
    assert resolve_step_time("LVIS/x.py", step_bench=path).seconds == 0.2


# ---------------------------------------------------------------------------------------------
# A dry run prices runs whose data is not on this machine
# ---------------------------------------------------------------------------------------------
def test_a_dry_run_prices_imagenet_without_the_data(tmp_path, caplog):
    from condinit_det.launch.arguments import build_parser
    from condinit_det.launch.plan import describe_plan, plan_experiment
    from condinit_det.pretrain import PretrainStage

    argv = [
        "--config-file",
        XCIT_IN1K,
        "--dry-run",
        "--step-time",
        "0.5",
        "data.root=/no/such/imagenet",
        f"train.output_dir={tmp_path}",
    ]
    text = describe_plan(plan_experiment(PretrainStage(), build_parser().parse_args(argv)))
    assert "ImageNet-1k's 1,281,167 training images" in caplog.text
    steps = 400 * (1_281_167 // 1024)  # the recipe's epochs x full batches
    assert f"({steps} optimizer steps) each" in text and _rows(text.split("\n\n", 1)[1])["default/seed0"][1] == str(
        steps
    )
    # another dataset's size is not guessed: one line says how to give it
    argv[-2:-1] = ["data.root=/no/such/imagenet", "data.num_classes=10"]
    with pytest.raises(UsageError, match="set data.num_train_images=N to price the runs without the data"):
        describe_plan(plan_experiment(PretrainStage(), build_parser().parse_args(argv)))
    assert not list(tmp_path.iterdir())  # nothing written
