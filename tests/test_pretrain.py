"""Classification pretraining (condinit_det.pretrain, tools/pretrain_net.py) on tiny models and datasets."""

import json
import os
import random
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.utils.env import seed_all_rng
from forked_tool import run_tool, start_tool
from test_exact_resume import untimed_metrics  # tests/ is on sys.path (pytest, rootdir mode)

from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset
from condinit_det.init import find_attention
from condinit_det.init.spec import apply_arm_spec
from condinit_det.pretrain import (
    PretrainStage,
    create_classifier,
    load_config,
    node,
    resolve_lr,
    train_run,
    trainer,
)
from condinit_det.pretrain.config import arm_spec
from condinit_det.records.identity import write_arm_report
from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.utils.checkpoint_io import PRETRAIN_FORMAT, load_checkpoint
from condinit_det.utils.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
TOOL = str(REPO / "tools" / "pretrain_net.py")
DEMO = str(REPO / "configs" / "demo" / "pretrain_vit_tiny.py")
XCIT_DEMO = str(REPO / "configs" / "demo" / "pretrain_xcit_tiny.py")
IMAGENET = sorted((REPO / "configs" / "ImageNet").glob("*.py"))
SPEC = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """An 8-class ImageFolder of 32x32 images: 96 training, 16 evaluation."""
    return str(
        generate_classification_dataset(tmp_path_factory.mktemp("cls") / "shapes", num_train=96, num_val=16, spec=SPEC)
    )


def tiny(root, out, epochs=2, **extra):
    """Overrides that shrink the demo config: depth 2, 32 px, batch 8 (12 steps per epoch), no workers."""
    opts = {
        "data.root": root,
        "data.img_size": 32,
        "model.kwargs.img_size": 32,
        "model.kwargs.depth": 2,
        "train.output_dir": out,
        "train.epochs": epochs,
        "train.batch_size": 8,
        "train.workers": 0,
        "train.log_period": 4,
        "train.eval_batch_size": 16,
        "scheduler.warmup_epochs": 1,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")


class _Stop(Exception):
    pass


def configure_run(cfg, spec, out="."):
    """``cfg`` set up as the launcher sets up the run ``spec`` of an experiment in ``out``."""
    return PretrainStage().configure_run(cfg, spec, spec.path(out))


def _state_at_first_step(root, out, arm, monkeypatch, seed=0):
    """Run train_run up to its first step; return (model state, first two batches, arm report)."""
    seen = {}

    def spy(self, epoch):
        self.start_epoch(epoch)
        seen["state"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        seen["batches"] = [b for _, b in zip(range(2), self.loader)]
        seen["step"] = self.step
        raise _Stop

    monkeypatch.setattr(trainer.PretrainRun, "train_epoch", spy)
    run = RunSpec(arm, seed)
    cfg = configure_run(load_config(DEMO, tiny(root, out)), run, out)
    run_dir = run.path(out)
    os.makedirs(run_dir)  # what a start killed before its first checkpoint wrote: a fresh start keeps none of it
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        f.write('{"iteration": 0, "conditioning/blocks.0.attn/kappa": 2.0}\n')
    with pytest.raises(_Stop):
        train_run(cfg, run_dir=run_dir, config_file=DEMO, resume=False)
    with open(os.path.join(run_dir, "metrics.json")) as f:
        assert f.read() == ""
    with open(os.path.join(run_dir, "condinit_arm_report.json")) as f:
        report = json.load(f)
    (environment,) = ResultsFile(run_dir).records("environment")  # what the run started on, before its first step
    assert environment["iteration"] == 0 and environment["torch"] == torch.__version__ and environment["gpus"] == 0
    return seen, report


def test_arm_is_applied_before_the_first_step(tiny_data, tmp_path, monkeypatch):
    seen, report = _state_at_first_step(tiny_data, str(tmp_path), "conditioned", monkeypatch)
    assert seen["step"] == 0
    assert report["arm"] == "conditioned" and report["run"]["arm"] == "conditioned" and report["stage"] == "pretrain"
    dim, heads = 96, 3
    dh = dim // heads
    for b in range(2):
        w = seen["state"][f"blocks.{b}.attn.qkv.weight"].double()
        for role in range(2):  # Q, K: every head block has orthonormal rows
            for h in range(heads):
                block = w[role * dim + h * dh : role * dim + (h + 1) * dh]
                s = torch.linalg.svdvals(block)
                assert torch.allclose(s, torch.ones_like(s), atol=1e-5), (b, role, h, s)
        assert torch.equal(w[2 * dim :], torch.eye(dim, dtype=w.dtype))  # V = identity
        assert not seen["state"][f"blocks.{b}.attn.qkv.bias"].any()


def test_same_seed_same_data_and_non_attention_weights_across_arms(tiny_data, tmp_path, monkeypatch):
    runs = {
        arm: _state_at_first_step(tiny_data, str(tmp_path / arm), arm, monkeypatch)
        for arm in ("default", "mimetic", "conditioned")
    }
    ref_state, ref_batches = runs["default"][0]["state"], runs["default"][0]["batches"]
    for arm in ("mimetic", "conditioned"):
        seen, report = runs[arm]
        changed = {n for site in report["sites"] for n in site["changed"]}
        assert changed, arm
        for name, value in seen["state"].items():
            if name in changed:  # (the conditioned arm zeroes q/k/v biases, which timm already inits to 0)
                assert name.endswith("bias") or not torch.equal(value, ref_state[name]), (arm, name)
            else:
                assert torch.equal(value, ref_state[name]), (arm, name)
        for (x, y), (x0, y0) in zip(seen["batches"], ref_batches):  # same images, same augmentation, same order
            assert torch.equal(x, x0) and torch.equal(y, y0)
    # Another seed: other data order and other weights.
    other, _ = _state_at_first_step(tiny_data, str(tmp_path / "s1"), "default", monkeypatch, seed=1)
    assert not torch.equal(other["batches"][0][1], ref_batches[0][1]) or not torch.equal(
        other["batches"][0][0], ref_batches[0][0]
    )
    assert not torch.equal(other["state"]["blocks.0.mlp.fc1.weight"], ref_state["blocks.0.mlp.fc1.weight"])


def test_the_arm_never_moves_the_global_rng(tiny_data, tmp_path):
    cfg = load_config(DEMO, tiny(tiny_data, str(tmp_path)))
    for arm in ("mimetic", "conditioned"):
        configure_run(cfg, RunSpec(arm, 0))
        seed_all_rng(0)
        model = create_classifier(node(cfg, "model"), 8)
        before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
        apply_arm_spec(model, arm_spec(cfg, 0))
        assert torch.equal(torch.get_rng_state(), before[0])
        assert np.array_equal(np.random.get_state()[1], before[1]) and random.getstate() == before[2]


def test_config_nodes_and_learning_rate():
    with pytest.raises(UsageError, match=r"augment.mixpu: no such key; did you mean augment.mixup\?"):
        load_config(DEMO, ["augment.mixpu=0.5"])
    cfg = load_config(DEMO, ["+augment.mixpu=0.5"])  # added on purpose: the node's own check still refuses it
    with pytest.raises(UsageError, match="augment has unknown key.*mixpu.*accepted: scale"):
        node(cfg, "augment")
    assert resolve_lr({"lr": None, "lr_base": 5e-4, "lr_base_size": 512, "lr_base_scale": "linear"}, 1024) == 1e-3
    assert resolve_lr({"lr": None, "lr_base": 5e-4, "lr_base_size": 512, "lr_base_scale": "sqrt"}, 2048, 0.5) == 5e-4
    assert resolve_lr({"lr": 0.1}, 64, 2.0) == 0.2
    # condinit.seed follows train.seed unless set.
    cfg = configure_run(load_config(DEMO, []), RunSpec("mimetic", 7))
    assert arm_spec(cfg, 7).seed == 7
    cfg = configure_run(load_config(DEMO, ["condinit.seed=3"]), RunSpec("mimetic", 7))
    assert arm_spec(cfg, 7).seed == 3


@pytest.mark.parametrize(
    "path", IMAGENET + [Path(DEMO), REPO / "configs" / "demo" / "pretrain_xcit_tiny.py"], ids=lambda p: p.name
)
def test_recipes_load_and_build(path):
    import timm

    cfg = load_config(str(path), [])
    nodes = {k: node(cfg, k) for k in ("model", "data", "augment", "optimizer", "scheduler", "train")}
    assert timm.is_model(nodes["model"]["name"])
    with torch.device("meta"):
        model = timm.create_model(
            nodes["model"]["name"],
            pretrained=False,
            num_classes=nodes["data"]["num_classes"],
            **nodes["model"]["kwargs"],
        )
    assert find_attention(model)  # the arm has attention sites to act on
    if "ImageNet" in str(path):
        assert nodes["data"]["num_classes"] == 1000 and nodes["train"]["batch_size"] == 1024
        lr = resolve_lr(nodes["optimizer"], nodes["train"]["batch_size"])
        assert lr == pytest.approx(1e-3), path.name  # every recipe: 5e-4 x 1024 / 512


# ---------------------------------------------------------------------------------------------
# The command line: bad input is one line on stderr, exit status 2, nothing written
# ---------------------------------------------------------------------------------------------
def run_cli(argv, capsys):
    old = sys.argv
    sys.argv = ["pretrain_net.py", *argv]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(TOOL, run_name="__main__")
    finally:
        sys.argv = old
    err = capsys.readouterr().err.strip()
    return e.value.code, err


def _one_error_line(code, err):
    assert code == 2, err
    assert err.startswith("pretrain_net.py: error: ") and "\n" not in err, err
    return err


def test_cli_rejects_an_image_folder_without_images(tmp_path, capsys):
    for split in ("train", "val"):
        (tmp_path / "empty" / split / "cat").mkdir(parents=True)
    out = tmp_path / "out"
    err = _one_error_line(
        *run_cli(["--config-file", DEMO, f"data.root={tmp_path / 'empty'}", f"train.output_dir={out}"], capsys)
    )
    assert "holds no images in class folders" in err and "<class>/<image>" in err and ".png" in err
    assert not out.exists()


def test_cli_suggests_close_model_names(tiny_data, tmp_path, capsys):
    out = tmp_path / "out"
    err = _one_error_line(
        *run_cli(
            [
                "--config-file",
                DEMO,
                "model.name=vit_tiny_patch16_22",
                f"data.root={tiny_data}",
                f"train.output_dir={out}",
            ],
            capsys,
        )
    )
    assert "is not a timm model" in err and "vit_tiny_patch16_224" in err
    assert not out.exists()


def test_cli_names_an_override_of_the_wrong_type(tmp_path, capsys):
    out = tmp_path / "out"
    for override, message in [
        ("train.epochs=abc", "train.epochs=abc: expected an integer (the config's value is 6)"),
        ("augment.vflip=no", "augment.vflip=no: expected a number (its default is 0.0)"),
    ]:
        err = _one_error_line(*run_cli(["--config-file", DEMO, f"train.output_dir={out}", override], capsys))
        assert err == f"pretrain_net.py: error: {message}"
    assert not out.exists()


def test_cli_rejects_a_class_count_mismatch(tiny_data, tmp_path, capsys):
    out = tmp_path / "out"
    err = _one_error_line(
        *run_cli(
            ["--config-file", DEMO, "data.num_classes=10", f"data.root={tiny_data}", f"train.output_dir={out}"], capsys
        )
    )
    assert "data.num_classes=10" in err and "has 8 class folders" in err and "data.num_classes=8" in err
    assert not out.exists()


def test_cli_refuses_to_resume_another_arm_or_seed(tiny_data, tmp_path, capsys):
    out = tmp_path / "out"
    run_dir = RunSpec("conditioned", 0).path(str(out))
    os.makedirs(run_dir)
    theirs = {
        "arm": "mimetic",
        "arm_seed": 1,
        "include": None,
        "exclude": None,
        "options": {},
        "seed": 1,
        "lr_scale": 1.0,
    }
    write_arm_report(run_dir, {"arm": "mimetic", "sites": []}, theirs)
    before = sorted(os.listdir(out))
    err = _one_error_line(
        *run_cli(["--config-file", DEMO, "--arm", "conditioned", "--resume", *tiny(tiny_data, str(out))], capsys)
    )
    assert "arm='mimetic'" in err and "arm='conditioned'" in err and "seed=1" in err and "seed=0" in err
    assert "--allow-changed-run" in err
    assert sorted(os.listdir(out)) == before  # no plan written


# ---------------------------------------------------------------------------------------------
# End to end, in subprocesses
# ---------------------------------------------------------------------------------------------
def _run(argv):
    return run_tool(TOOL, *argv, cwd=REPO, env=_env(), timeout=300)


@pytest.mark.slow
@pytest.mark.e2e
def test_resume_after_sigkill_matches_an_uninterrupted_run(tiny_data, tmp_path):
    epochs = 2  # one evaluation before the kill, one after the resume
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    argv = ["--config-file", DEMO, "--arm", "mimetic"]
    done = _run([*argv, *tiny(tiny_data, a, epochs=epochs)])
    assert done.returncode == 0, done.stderr[-3000:]

    run_b = RunSpec("mimetic", 0).path(b)
    proc = start_tool(
        TOOL,
        *argv,
        *tiny(tiny_data, b, epochs=epochs),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target = os.path.join(run_b, "checkpoint_epoch0001.pth")
    deadline = time.time() + 240
    while not os.path.exists(target) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(target) and not os.path.exists(os.path.join(run_b, "model_final.pth")), (
        "the run finished before it could be killed"
    )
    resumed = _run([*argv, "--resume", *tiny(tiny_data, b, epochs=epochs)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stdout

    run_a = RunSpec("mimetic", 0).path(a)
    fa = load_checkpoint(os.path.join(run_a, "model_final.pth"))
    fb = load_checkpoint(os.path.join(run_b, "model_final.pth"))
    assert fa["format"] == PRETRAIN_FORMAT and fa["weights"] == "model" and fa["timm_model"] == "vit_tiny_patch16_224"
    assert fa["model_kwargs"]["patch_size"] == 8 and fa["num_classes"] == 8 and fa["epoch"] == epochs
    assert fa["arm"] == "mimetic" and fa["seed"] == 0 and fa["img_size"] == 32
    assert fa["data_config"]["mean"] == [0.5, 0.5, 0.5] and fa["data_config"]["input_size"] == [3, 32, 32]
    # Bitwise: same code path, same thread count, and every epoch re-seeds from (seed, epoch).
    assert fa["model"].keys() == fb["model"].keys()
    for k in fa["model"]:
        assert torch.equal(fa["model"][k], fb["model"][k]), k
    ra, rb = ResultsFile(run_a).records("cls"), ResultsFile(run_b).records("cls")
    assert [r["epoch"] for r in rb] == list(range(1, epochs + 1))  # none lost, none duplicated
    assert [(r["epoch"], r["iteration"], r["top1"], r["train_loss"]) for r in ra] == [
        (r["epoch"], r["iteration"], r["top1"], r["train_loss"]) for r in rb
    ]
    assert set(ra[-1]) >= {
        "kind",
        "iteration",
        "epoch",
        "top1",
        "top5",
        "train_loss",
        "eval_loss",
        "lr",
        "arm",
        "seed",
        "lr_scale",
        "config",
    }
    with open(os.path.join(run_b, "metrics.json")) as f:
        its = [json.loads(line)["iteration"] for line in f]
    assert its == sorted(set(its)) and its[-1] == epochs * 12
    assert untimed_metrics(run_a) == untimed_metrics(run_b)  # the smoothed losses too: the checkpoint carries them
    with open(os.path.join(run_b, "eval_predictions.json")) as f:
        pred = json.load(f)
    assert pred["epoch"] == epochs and len(pred["labels"]) == len(pred["top1"]) == len(pred["top5_hit"]) == 16
    last_name = f"checkpoint_epoch{epochs:04d}.pth"
    assert [os.path.basename(p) for p in Path(run_b).glob("checkpoint_epoch*.pth")] == [last_name]
    # Every file loads weights-only; model_final.safetensors holds the same weights, the rest as metadata.
    last = torch.load(os.path.join(run_b, last_name), map_location="cpu", weights_only=True)
    assert all(isinstance(last["rng"][k], torch.Tensor) for k in ("python", "numpy", "torch"))
    shared = load_checkpoint(os.path.join(run_b, "model_final.safetensors"))
    assert shared.keys() == fb.keys() and all(shared[k] == fb[k] for k in fb if k != "model")
    assert all(torch.equal(shared["model"][k], fb["model"][k]) for k in fb["model"])
    # A finished run is skipped on --resume.
    again = _run([*argv, "--resume", *tiny(tiny_data, b, epochs=epochs)])
    assert again.returncode == 0 and "already finished" in again.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_two_process_cpu_run_matches_single_process_evaluation(tiny_data, tmp_path):
    # XCiT, the harder case of the demo backbones: it has BatchNorm (patch embedding, LPI), and each process keeps its
    # own running statistics; the parameters must still agree, and the evaluation and model_final.pth use rank 0's.
    out = str(tmp_path / "ddp")
    argv = ["--config-file", XCIT_DEMO, "--arm", "conditioned", *tiny(tiny_data, out, epochs=1)]
    ddp = _run(["--num-gpus", "2", "--dist-url", "auto", *argv])
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    run_dir = RunSpec("conditioned", 0).path(out)
    with open(os.path.join(run_dir, "log.txt")) as f:
        log = f.read()
    assert "Replica check at initialization: all 2 processes hold identical weights" in log
    assert "Replica check at the end: all 2 processes hold identical weights" in log
    single = _run(["--eval-only", *argv])
    assert single.returncode == 0, single.stderr[-3000:]
    (train_rec,) = ResultsFile(run_dir).records("cls")
    (eval_rec,) = ResultsFile(run_dir).records("cls_eval")
    assert train_rec["top1"] == eval_rec["top1"] and train_rec["top5"] == eval_rec["top5"]
    assert eval_rec["eval_loss"] == pytest.approx(train_rec["eval_loss"], rel=1e-5)
    assert train_rec["iteration"] == 96 // 8  # 12 steps of 4 images on each of 2 processes


def test_eval_only_records_the_checkpoints_own_arm(tiny_data, tmp_path):
    cfg = configure_run(load_config(DEMO, tiny(tiny_data, str(tmp_path))), RunSpec("default", 0), str(tmp_path))
    torch.manual_seed(0)
    weights = create_classifier(node(cfg, "model"), 8).state_dict()
    run_dir = RunSpec("default", 0).path(str(tmp_path))
    for name, extra, arm in (
        ("final.pth", {"arm": "mimetic"}, "mimetic"),  # a model_final file names its arm
        ("epoch.pth", {"identity": {"arm": "conditioned"}}, "conditioned"),  # an epoch file too
        ("bare.pth", {}, "default"),
    ):  # none: the config's, said in the log
        torch.save({"model": weights, **extra}, tmp_path / name)
        record = trainer.evaluate_checkpoint(cfg, run_dir=run_dir, checkpoint=str(tmp_path / name), config_file=DEMO)
        assert (record["arm"], record["stage"]) == (arm, "pretrain")
    assert [r["arm"] for r in ResultsFile(run_dir).records("cls_eval")] == ["default"]  # one key: (kind, iteration)
    log = Path(run_dir, "log.txt").read_text()
    assert f"{tmp_path / 'bare.pth'} does not name its arm: recorded under the config's arm 'default'" in log
    assert "\x1b[" not in log and "Run ended at" in log.rstrip().splitlines()[-1]


@pytest.mark.slow
def test_tiny_run_prints_no_deprecation_notice(tiny_data, tmp_path):
    env = dict(_env(), PYTHONWARNINGS="default")
    # (the kappa measurements, tested in test_pretrain_conditioning.py, are off: torch scripts its forward-mode
    # decompositions on their first use)
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "default",
            TOOL,
            "--config-file",
            DEMO,
            "--arm",
            "conditioned",
            *tiny(tiny_data, str(tmp_path), epochs=1),
            "condinit_analysis.period=0",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    noise = [
        line
        for line in proc.stderr.splitlines()
        if "DeprecationWarning" in line or "FutureWarning" in line or "deprecated" in line
    ]
    assert not noise, "\n".join(noise)
    assert "eta:" in proc.stdout
    log = Path(RunSpec("conditioned", 0).path(str(tmp_path)), "log.txt").read_text()
    assert "\x1b[" not in log and "Run ended at" in log.rstrip().splitlines()[-1]
