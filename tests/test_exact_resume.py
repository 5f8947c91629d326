"""A detection run stopped at any checkpoint and resumed ends as the uninterrupted run: on the CPU bitwise (weights,
losses, evaluations), with one process and two, with loader workers and without; on any device the same images at
every iteration (docs/training.md#exact-resume)."""

import json
import os
import random
import signal
import subprocess
import time

import pytest
import torch
from forked_tool import run_tool, start_tool

from condinit_det.records.results import ResultsFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_recorded_config.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
# Drop-path and flips draw from the global RNGs; a checkpoint every 4 iterations, an evaluation every 8, a write of
# metrics.json every 3.
SCHEDULE = [
    "train.max_iter=16",
    "train.eval_period=8",
    "train.checkpointer.period=4",
    "train.log_period=3",  # evaluations and kappa wait for the next write: a checkpoint carries them
    "model.backbone.net.drop_path_rate=0.2",
    "condinit_analysis.period=8",  # kappa at 0, 8 and 16: a resumed run measures no more
]
WALL_TIMES = {"time", "data_time", "rank_data_time", "eta_seconds"}

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _command(out, *, processes, workers, device):
    return [
        TRAIN_NET,
        "--config-file",
        CONFIG,
        "--num-gpus",
        str(processes),
        "--arm",
        "conditioned",
        f"train.output_dir={out}",
        f"train.device={device}",
        f"dataloader.train.num_workers={workers}",
        *SCHEDULE,
    ]


def _env(images):
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TRAINED_IMAGES=str(images))


def _train(out, images, *, resume=False, **kwargs):
    argv = _command(out, **kwargs) + (["--resume"] if resume else [])
    proc = run_tool(*argv, cwd=os.getcwd(), env=_env(images), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def untimed_metrics(run_dir):
    """A run's ``metrics.json`` lines without their wall times, as JSON text (NaN equals NaN): what a resumed run
    repeats bitwise (also read by the pretraining and faults tests)."""
    with open(os.path.join(run_dir, "metrics.json")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [json.dumps({k: v for k, v in line.items() if k not in WALL_TIMES}, sort_keys=True) for line in lines]


def _trained_images(path):
    """(rank, iteration) -> the image ids it trained on; an iteration trained twice (before a kill, then after the
    resume) counts as the last time."""
    with open(path) as f:
        return {(rank, it): ids for rank, it, ids in (json.loads(line) for line in f)}


def _stop_after_a_checkpoint(argv, images, run, at_least):
    """Start ``argv`` and SIGKILL its processes two iterations after a checkpoint of iteration >= ``at_least``;
    returns that checkpoint's iteration."""
    proc = start_tool(
        *argv,
        cwd=os.getcwd(),
        env=_env(images),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 600
    while True:
        assert proc.poll() is None and time.time() < deadline, "the run ended before the moment to stop it"
        try:
            last = int((run / "last_checkpoint").read_text().removeprefix("model_").removesuffix(".pth"))
            trained = max(it for _, it in _trained_images(images))
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        if last >= at_least and trained >= last + 2:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return last
        time.sleep(0.05)


@pytest.mark.parametrize(
    "processes, workers, device",
    [
        (1, (0, 2), "cpu"),
        (2, (0, 0), "cpu"),
        pytest.param(1, (0, 2), "cuda", marks=pytest.mark.gpu),
    ],
)
def test_a_run_stopped_at_a_checkpoint_ends_as_the_uninterrupted_run(tmp_path, processes, workers, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    _train(whole, tmp_path / "whole.jsonl", processes=processes, workers=workers[0], device=device)
    run_whole, run_stopped = whole / "conditioned" / "seed0", stopped / "conditioned" / "seed0"
    argv = _command(stopped, processes=processes, workers=workers[1], device=device)
    at = _stop_after_a_checkpoint(argv, tmp_path / "stopped.jsonl", run_stopped, random.choice([3, 7, 11]))
    log = _train(
        stopped, tmp_path / "stopped.jsonl", resume=True, processes=processes, workers=workers[0], device=device
    )
    assert f"model_{at:07d}.pth" in log and "earlier version" not in log

    # The same images at every iteration, on every device.
    trained = _trained_images(tmp_path / "stopped.jsonl")
    assert trained == _trained_images(tmp_path / "whole.jsonl")
    assert sorted(trained) == [(rank, it) for rank in range(processes) for it in range(16)]
    if device != "cpu":
        return
    # On the CPU, bitwise: the final weights, every loss logged, every evaluation.
    weights = [
        torch.load(r / "model_final.pth", map_location="cpu", weights_only=True)["model"]
        for r in (run_whole, run_stopped)
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert untimed_metrics(run_stopped) == untimed_metrics(run_whole)
    # every third iteration and the last; evaluations at 7 (written with 8) and after the end, at 16
    assert [json.loads(line)["iteration"] for line in untimed_metrics(run_whole)] == [0, 2, 5, 7, 8, 11, 14, 15, 16]
    records = [
        [r for r in ResultsFile(run).records() if r["kind"] != "environment"] for run in (run_whole, run_stopped)
    ]
    assert records[0] == records[1] and [r["iteration"] for r in records[0] if r["kind"] == "ap"] == [8, 16]
    assert sorted({r["iteration"] for r in records[0] if r["kind"] == "conditioning"}) == [0, 8, 16]
    environment = [r["iteration"] for r in ResultsFile(run_stopped).records("environment")]
    assert environment == [0, at + 1]  # each start records the machine it ran on
