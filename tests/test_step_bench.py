"""bench/bench_gpu_step.py: its helpers, its input checks, a --tiny CPU run of the four recipes (the JSON it
writes, read back by the launcher's cost model), and on a CUDA device a short run at the recipes' real size."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(ROOT, "bench")
SCRIPT = os.path.join(BENCH_DIR, "bench_gpu_step.py")
sys.path.insert(0, BENCH_DIR)

import bench_gpu_step  # noqa: E402
from common import paired_ratio, rotated  # noqa: E402

from condinit_det.init import ARMS  # noqa: E402
from condinit_det.launch.plan import load_step_times, resolve_step_time  # noqa: E402

RECIPE_PATHS = {
    "mask_rcnn_vitdet_b_100ep": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
    "mask_rcnn_swin_b_3x": "configs/COCO/mask_rcnn_swin_b_3x.py",
    "mask_rcnn_xcit_s12_3x": "configs/COCO/mask_rcnn_xcit_s12_3x.py",
    "xcit_s12_p16_400ep": "configs/ImageNet/xcit_s12_p16_400ep.py",
}
# (total batch of the config, per-GPU batch of the recipe): ViTDet 64 on 64 GPUs, the others on 8.
RECIPE_BATCHES = {
    "mask_rcnn_vitdet_b_100ep": (64, 1),
    "mask_rcnn_swin_b_3x": (16, 2),
    "mask_rcnn_xcit_s12_3x": (16, 2),
    "xcit_s12_p16_400ep": (1024, 128),
}
ROUNDS = 2


def _full_size(path):
    """A copy of a ``--tiny`` bench file without its tiny mark, which the cost model refuses."""
    payload = json.loads(open(path).read())
    copy = f"{path}.full.json"
    with open(copy, "w") as f:
        json.dump(dict(payload, tiny=False), f)
    return copy


def _run_bench(args, timeout=900):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def test_rotated_starts_each_round_one_later():
    items = ["a", "b", "c"]
    assert [rotated(items, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert rotated([], 3) == []


def test_paired_ratio_is_the_median_of_round_ratios():
    assert paired_ratio([2.0, 3.0, 10.0], [1.0, 1.0, 1.0]) == 3.0
    # A slow drift that hits both variants alike cancels in the paired ratio.
    base = [1.0, 2.0, 4.0, 8.0]
    assert paired_ratio([1.1 * b for b in base], base) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="equally many"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([1.0], [0.0])


def test_recipes_cover_the_four_configs_and_their_batches():
    assert {name: r.path for name, r in bench_gpu_step.RECIPES.items()} == RECIPE_PATHS
    for name, (total, per_gpu) in RECIPE_BATCHES.items():
        recipe = bench_gpu_step.RECIPES[name]
        cfg, overrides = bench_gpu_step.load_recipe_config(recipe, tiny=False)
        assert overrides == []
        assert bench_gpu_step.recipe_batch(recipe, cfg) == (total, per_gpu)
        # Every recipe trains with AMP; only a CUDA device runs it.
        assert bench_gpu_step.recipe_amp(recipe, cfg, torch.device("cuda")) is True
        assert bench_gpu_step.recipe_amp(recipe, cfg, torch.device("cpu")) is False


def test_input_sizes():
    vitdet, swin = bench_gpu_step.RECIPES["mask_rcnn_vitdet_b_100ep"], bench_gpu_step.RECIPES["mask_rcnn_swin_b_3x"]
    pretrain = bench_gpu_step.RECIPES["xcit_s12_p16_400ep"]
    assert vitdet.size("largest", False) == vitdet.size("typical", False) == (1024, 1024)
    assert swin.size("largest", False) == (800, 1333) and swin.size("typical", False) == (640, 853)
    assert pretrain.size("typical", False) == (224, 224)
    assert swin.size("largest", True) == swin.tiny_size


def test_detection_batches_shapes_and_instances():
    batches = bench_gpu_step.detection_batches(num=2, batch=3, size=(96, 128), num_classes=80, seed=0)
    assert len(batches) == 2 and all(len(b) == 3 for b in batches)
    n = bench_gpu_step.INSTANCES_PER_IMAGE
    for item in batches[0]:
        assert item["image"].shape == (3, 96, 128) and item["image"].dtype == torch.uint8
        inst = item["instances"]
        assert inst.image_size == (96, 128) and len(inst) == n
        boxes = inst.gt_boxes.tensor
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
        assert (boxes[:, 2] <= 128).all() and (boxes[:, 3] <= 96).all()
        assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
        assert ((inst.gt_classes >= 0) & (inst.gt_classes < 80)).all()
        # The boxes are the polygons' bounding boxes (the recipes recompute boxes from masks).
        torch.testing.assert_close(inst.gt_masks.get_bounding_boxes().tensor, boxes)
        assert all(len(p) == 1 and p[0].shape == (2 * bench_gpu_step.POLYGON_VERTICES,) for p in inst.gt_masks.polygons)
    again = bench_gpu_step.detection_batches(num=2, batch=3, size=(96, 128), num_classes=80, seed=0)
    assert torch.equal(again[1][2]["image"], batches[1][2]["image"])  # fixed by the seed


def test_classification_batches():
    batches = bench_gpu_step.classification_batches(num=2, batch=4, size=(32, 32), num_classes=10, seed=0, pin=False)
    images, labels = batches[0]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (4,) and labels.dtype == torch.int64 and ((labels >= 0) & (labels < 10)).all()
    assert not torch.equal(batches[0][0], batches[1][0])


def test_device_info_on_cpu():
    from common import device_info, format_device_info

    info = device_info("cpu")
    assert info["type"] == "cpu" and info["name"] and info["cores"] >= 1 and info["torch"] == torch.__version__
    assert format_device_info(info).startswith(f"device: CPU {info['name']} ({info['cores']} cores)")


def _timed_variant(arm, times, steps_per_round=1):
    v = bench_gpu_step.Variant(arm, torch.device("cpu"))
    v.times = list(times)
    v.round_times = [sum(times[i : i + steps_per_round]) for i in range(0, len(times), steps_per_round)]
    return v


def test_recipe_entry_ratios_on_known_times():
    recipe = bench_gpu_step.RECIPES["mask_rcnn_swin_b_3x"]
    default = _timed_variant("default", [1.0, 1.2, 1.1, 3.0])
    slower = _timed_variant("conditioned", [2.0, 2.4, 2.2, 6.0])  # twice the default in every round
    drift = _timed_variant("mimetic", [1.0, 1.2, 1.1, 1.0])  # same as the default but its last round
    entry = bench_gpu_step.recipe_entry(
        recipe,
        [default, slower, drift],
        total_batch=16,
        batch_per_gpu=2,
        size=(800, 1333),
        amp=True,
        rounds=4,
        overrides=[],
    )
    arms = entry["arms"]
    assert list(arms) == ["default", "conditioned", "mimetic"]
    assert arms["default"]["median_step_s"] == pytest.approx(1.15) and arms["default"]["min_step_s"] == 1.0
    assert arms["default"]["ratio_to_default"] == 1.0 and arms["default"]["paired_ratio_to_default"] == 1.0
    assert arms["conditioned"]["ratio_to_default"] == pytest.approx(2.0)
    assert arms["conditioned"]["paired_ratio_to_default"] == pytest.approx(2.0)
    assert arms["mimetic"]["paired_ratio_to_default"] == pytest.approx(1.0)  # one slow default round is outvoted
    assert arms["default"]["peak_memory_bytes"] is None and arms["default"]["sites"] is None
    assert entry["image_size"] == [800, 1333] and entry["error"] is None and entry["instances_per_image"] == 7


def test_a_failing_recipe_is_recorded_and_the_others_still_run(monkeypatch, tmp_path, capsys):
    """Control flow of main(): each recipe gets a share of the budget left, a failure is recorded in the JSON
    (readable by the cost model), the exit status is 1."""
    deadlines = []

    def fake_measure(recipe, *, arms, deadline, **kwargs):
        deadlines.append(deadline)
        if recipe.name == "mask_rcnn_swin_b_3x":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(more detail)")
        variants = [_timed_variant(arm, [0.5, 0.5]) for arm in arms]
        return bench_gpu_step.recipe_entry(
            recipe, variants, total_batch=16, batch_per_gpu=2, size=(96, 128), amp=False, rounds=2, overrides=[]
        )

    monkeypatch.setattr(bench_gpu_step, "measure_recipe", fake_measure)
    out = tmp_path / "bench.json"
    status = bench_gpu_step.main(
        ["--tiny", "--device", "cpu", "--arms", "conditioned", "--budget", "400", "--output", str(out)]
    )
    assert status == 1
    stdout = capsys.readouterr().out
    assert "FAILED: mask_rcnn_swin_b_3x: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" in stdout
    payload = json.loads(out.read_text())
    assert list(payload["configs"]) == list(RECIPE_PATHS.values())
    failed = payload["configs"][RECIPE_PATHS["mask_rcnn_swin_b_3x"]]
    assert failed["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" and failed["arms"] == {}
    vitdet = payload["configs"][RECIPE_PATHS["mask_rcnn_vitdet_b_100ep"]]
    assert list(vitdet["arms"]) == ["default", "conditioned"]  # the default arm is always measured
    # Equal shares of what is left: the first recipe's share ends a quarter of the way, the last at the budget.
    assert deadlines == sorted(deadlines)
    assert deadlines[-1] - deadlines[0] == pytest.approx(300, abs=5)
    step_time = lambda name: resolve_step_time(name, step_bench=_full_size(out))  # noqa: E731
    assert step_time("mask_rcnn_vitdet_b_100ep").seconds == 0.5
    with pytest.raises(ValueError, match="its run failed"):
        step_time("mask_rcnn_swin_b_3x")


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cpu"], "--device cpu needs --tiny"),
        (["--tiny", "--device", "cpu", "--configs", "mask_rcnn_r50"], "--configs: unknown mask_rcnn_r50; accepted:"),
        (["--tiny", "--device", "cpu", "--arms", "default,orthogonal"], "--arms: unknown orthogonal; accepted:"),
        (["--tiny", "--device", "cpu", "--arms", "default,default"], "--arms lists a name twice"),
        (["--tiny", "--device", "cpu", "--warmup", "0"], "--warmup must be >= 1"),
        (["--tiny", "--device", "cpu", "--min-rounds", "4", "--max-rounds", "3"], "--max-rounds (3) must be >= --min"),
        (["--tiny", "--device", "cpu", "--budget", "0"], "--budget must be a positive number"),
        (["--tiny", "--device", "tpu"], "--device 'tpu'; accepted: cuda, cuda:N, cpu"),
        (["--tiny", "--device", "cpu", "--output", "/nonexistent/folder/b.json"], "its folder does not exist"),
    ],
)
def test_bad_arguments_exit_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        bench_gpu_step.main(argv)
    assert info.value.code != 0
    text = (str(info.value.code) if isinstance(info.value.code, str) else "") + capsys.readouterr().err
    assert message in text


# ---------------------------------------------------------------------------------------------
# The --tiny CPU run of the four recipes
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("step_bench") / "tiny.json")
    proc = _run_bench(
        [
            "--tiny",
            "--device",
            "cpu",
            "--warmup",
            "1",
            "--min-rounds",
            str(ROUNDS),
            "--max-rounds",
            str(ROUNDS),
            "--budget",
            "1",
            "--output",
            out,
        ]
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out) as f:
        return json.load(f), proc.stdout, out


@pytest.mark.slow
def test_tiny_run_json(tiny_run):
    payload, stdout, _ = tiny_run
    assert payload["format"] == bench_gpu_step.FORMAT == "condinit_det.step_bench/1"
    assert payload["tiny"] is True and payload["input_size"] == "largest"
    assert payload["device"]["type"] == "cpu" and payload["device"]["name"]
    assert payload["torch"] == torch.__version__
    assert list(payload["configs"]) == list(RECIPE_PATHS.values())
    for name, path in RECIPE_PATHS.items():
        entry = payload["configs"][path]
        assert entry["name"] == name and entry["error"] is None
        total, _ = RECIPE_BATCHES[name]
        assert entry["total_batch"] == total and entry["recipe_gpus"] == bench_gpu_step.RECIPES[name].recipe_gpus
        assert entry["batch_per_gpu"] == (2 if entry["stage"] == "pretrain" else 1)
        assert entry["image_size"] == list(bench_gpu_step.RECIPES[name].tiny_size)
        assert entry["amp"] is False  # no AMP on a CPU
        assert entry["tiny_overrides"]
        assert list(entry["arms"]) == list(ARMS)  # every arm, the default arm first
        parameters = {r["parameters"] for r in entry["arms"].values()}
        assert len(parameters) == 1 and parameters.pop() > 0  # an arm rewrites weights, never adds any
        for arm, r in entry["arms"].items():
            assert r["timed_steps"] == ROUNDS and r["rounds"] == ROUNDS
            assert 0 < r["min_step_s"] <= r["median_step_s"] and math.isfinite(r["median_step_s"])
            assert r["peak_memory_bytes"] is None  # CPU: no CUDA allocator to ask
            assert r["ratio_to_default"] > 0 and r["paired_ratio_to_default"] > 0
            assert r["sites"] > 0
            if arm == "default":
                assert r["ratio_to_default"] == 1.0 and r["paired_ratio_to_default"] == 1.0
                assert r["params_changed"] == 0
            else:
                assert r["params_changed"] > 0
        assert name in stdout
    assert "an ImageNet-1k epoch is 1251 steps of 1024 images" in stdout


@pytest.mark.slow
def test_tiny_run_is_read_by_the_cost_model(tiny_run):
    payload, _, path = tiny_run
    with pytest.raises(ValueError, match="measured with --tiny"):
        load_step_times(path)
    path = _full_size(path)
    times, _, _ = load_step_times(path)
    assert set(times) == set(RECIPE_PATHS.values())
    for name, key in RECIPE_PATHS.items():
        assert times[key] == payload["configs"][key]["arms"]["default"]["median_step_s"]
        step = resolve_step_time(name, step_bench=path)
        assert step.seconds == times[key]
        assert step.source.startswith(f"measured: bench file {path} on device CPU ")


# ---------------------------------------------------------------------------------------------
# On a CUDA device: the recipes at their real size
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")
def test_real_size_on_gpu(tmp_path):
    out = str(tmp_path / "step_bench.json")
    proc = _run_bench(["--warmup", "2", "--min-rounds", "2", "--max-rounds", "3", "--budget", "120", "--output", out])
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out) as f:
        payload = json.load(f)
    assert payload["tiny"] is False and payload["device"]["type"] == "cuda"
    for name, path in RECIPE_PATHS.items():
        entry = payload["configs"][path]
        assert entry["error"] is None and entry["amp"] is True
        assert entry["batch_per_gpu"] == RECIPE_BATCHES[name][1]
        for r in entry["arms"].values():
            assert isinstance(r["peak_memory_bytes"], int) and r["peak_memory_bytes"] > 0
            assert r["median_step_s"] > 0
    assert np.isfinite(load_step_times(out)[0][RECIPE_PATHS["mask_rcnn_vitdet_b_100ep"]])
