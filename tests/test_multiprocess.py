"""Several processes on the CPU: the gloo path forced, BatchNorm statistics per rank, --eval-only over 2 processes
(one model in every process, also from a checkpoint that lacks some weights)."""

import json
import os

import pytest
import torch
from forked_tool import run_tool
from torch import nn

from condinit_det.records.results import ResultsFile
from condinit_det.utils.distributed import launch, local_buffers, replica_fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
XCIT_DEMO = os.path.join(ROOT, "configs", "demo", "mask_rcnn_xcit_tiny.py")


def _report_process_group(out_dir):
    import torch.distributed as dist

    rank = dist.get_rank()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "backend": str(dist.get_backend()),
                "cuda": torch.cuda.is_available(),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            },
            f,
        )


@pytest.mark.slow
@pytest.mark.e2e
def test_cpu_launch_joins_gloo_with_cuda_hidden(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as on a GPU machine
    launch(_report_process_group, 2, device="cpu", dist_url="auto", args=(str(tmp_path),))
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"backend": "gloo", "cuda": False, "visible": ""}, rank
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"  # restored in the launching process


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.sync = nn.SyncBatchNorm(4)
        self.frozen = nn.BatchNorm1d(4, track_running_stats=False)
        self.register_buffer("table", torch.arange(4.0))


def test_replica_fingerprint_leaves_out_only_unsynchronized_statistics():
    torch.manual_seed(0)
    net = _Net()
    assert local_buffers(net) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    before = replica_fingerprint(net)
    net.bn.running_mean.add_(1.0)
    net.bn.num_batches_tracked.add_(3)
    assert replica_fingerprint(net) == before  # differs per rank by design
    for change in (
        lambda: net.sync.running_var.mul_(2.0),
        lambda: net.table.add_(1.0),
        lambda: net.conv.weight.data[0, 0, 0, 0].add_(1e-7),
        lambda: net.bn.weight.data.add_(1.0),
    ):
        change()
        after = replica_fingerprint(net)
        assert after != before
        before = after


def _run(cwd, *argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = run_tool(TRAIN_NET, "--config-file", XCIT_DEMO, *argv, cwd=cwd, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def _predictions(run_dir):
    with open(os.path.join(run_dir, "inference", "coco_instances_results.json")) as f:
        return sorted(json.load(f), key=lambda p: (p["image_id"], p["category_id"], -p["score"]))


@pytest.mark.slow
@pytest.mark.e2e
def test_xcit_batchnorm_two_processes_and_eval_only(tmp_path):
    # The XCiT demo has BatchNorm (patch embedding, LPI, the neck's stride-4 branch): each rank
    # updates its own running statistics. Training must pass the replica check, and every evaluation
    # (during training and --eval-only, 1 or 2 processes) must score with rank 0's statistics, the
    # ones model_final.pth holds. Score threshold 0: a 6-iteration model then keeps detections.
    detections = [
        "model.roi_heads.box_predictor.test_score_thresh=0.0",
        "model.roi_heads.box_predictor.test_topk_per_image=10",
    ]
    train_dir = tmp_path / "train" / "conditioned" / "seed0"  # where a run of arm X, seed k goes
    log = _run(
        tmp_path,
        "--num-gpus",
        "2",
        "--arm",
        "conditioned",
        f"train.output_dir={tmp_path / 'train'}",
        "train.max_iter=6",
        "train.eval_period=6",
        *detections,
    )
    assert "Replica check after training: all 2 processes hold identical weights" in log
    final = train_dir / "model_final.pth"
    state = torch.load(final, map_location="cpu", weights_only=False)["model"]
    assert int(state["backbone.net.patch_embed.proj.0.1.num_batches_tracked"]) == 6  # trained BatchNorm
    evals = {}
    for procs in (1, 2):
        out = tmp_path / f"eval{procs}"
        _run(
            tmp_path,
            "--num-gpus",
            str(procs),
            "--eval-only",
            f"train.init_checkpoint={final}",
            f"train.output_dir={out}",
            *detections,
        )
        (evals[procs],) = ResultsFile(out / "default" / "seed0").records("eval")  # the config's arm and seed
    (trained,) = ResultsFile(train_dir).records("ap")
    for task in ("bbox", "segm"):
        for metric in ("AP", "AP50", "AP75"):
            values = [trained[task][metric], evals[1][task][metric], evals[2][task][metric]]
            assert values[0] is not None and values == pytest.approx([values[1]] * 3, abs=1e-6), (task, metric)
    predictions = [_predictions(d) for d in (train_dir, *(tmp_path / f"eval{n}" / "default" / "seed0" for n in (1, 2)))]
    assert len(predictions[0]) > 0 and len({len(p) for p in predictions}) == 1
    for p, q, r in zip(*predictions):
        assert (
            (p["image_id"], p["category_id"]) == (q["image_id"], q["category_id"]) == (r["image_id"], r["category_id"])
        )
        assert p["score"] == pytest.approx(q["score"], abs=1e-5) and r["score"] == pytest.approx(q["score"], abs=1e-5)
        assert p["bbox"] == pytest.approx(q["bbox"], abs=1e-3) and r["bbox"] == pytest.approx(q["bbox"], abs=1e-3)
    # A checkpoint without the box predictor (each process draws it from its own seed): still one model for all.
    partial = tmp_path / "partial.pth"
    torch.save({"model": {k: v for k, v in state.items() if "box_predictor" not in k}}, partial)
    out = tmp_path / "eval_partial"
    log = _run(
        tmp_path, "--num-gpus", "2", "--eval-only", f"train.init_checkpoint={partial}", f"train.output_dir={out}"
    )
    assert "Replica check before evaluation: all 2 processes hold identical weights" in log
