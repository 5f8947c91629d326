"""Loading a checkpoint never runs code from it; final weights are also written as safetensors.

A "malicious" file here is a checkpoint whose unpickling would create a marker file. Every entry
point that reads a checkpoint must refuse it with one error line (the file, why, what to do), a
non-zero exit and no marker; ``.pkl`` files only load with ``--trust-pickle``.
"""

import json
import os
import pickle
import runpy
import subprocess
import sys

import pytest
import timm
import torch

from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset
from condinit_det.engine.checkpoint import RunCheckpointer, pretrain_checkpoint_file
from condinit_det.init import apply_init
from condinit_det.modeling.convert import convert_timm_checkpoint
from condinit_det.pretrain.checkpoint import save_final
from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.utils.checkpoint_io import (
    PRETRAIN_FORMAT,
    UnsafeCheckpointError,
    check_loadable,
    final_weights_file,
    load_checkpoint,
    save_safetensors,
    torch_load,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_train_config.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
PRETRAIN_NET = os.path.join(ROOT, "tools", "pretrain_net.py")
CONDITIONING = os.path.join(ROOT, "tools", "attention_conditioning.py")
DEMO = os.path.join(ROOT, "configs", "demo", "pretrain_vit_tiny.py")
# The trunk of tests/tiny_train_config.py as a timm classifier (what tools/pretrain_net.py saves).
TIMM_NAME = "vit_tiny_patch16_224"
TIMM_KWARGS = dict(patch_size=16, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, qkv_bias=True, img_size=64)


class _RunsCode:
    """Unpickling this creates ``marker`` (any code could run instead)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _malicious(path, marker):
    """A checkpoint that looks ordinary but holds an object whose unpickling creates ``marker``."""
    data = {"model": {"w": torch.zeros(3)}, "__author__": "someone", "extra": _RunsCode(marker)}
    if str(path).endswith(".pkl"):
        with open(path, "wb") as f:
            pickle.dump(data, f)
    else:
        torch.save(data, path)
    return str(path)


@pytest.fixture()
def marker(tmp_path):
    path = tmp_path / "code_ran"
    yield path
    assert not path.exists(), "loading the checkpoint ran code stored in it"


def _timm_model(arm="conditioned"):
    torch.manual_seed(0)
    model = timm.create_model(TIMM_NAME, pretrained=False, num_classes=4, **TIMM_KWARGS)
    apply_init(model, arm, seed=7)
    return model


def _pretrain_payload(model, arm):
    return {
        "format": PRETRAIN_FORMAT,
        "model": model.state_dict(),
        "weights": "model",
        "timm_model": TIMM_NAME,
        "model_kwargs": TIMM_KWARGS,
        "num_classes": 4,
        "img_size": 64,
        "arm": arm,
        "seed": 0,
        "epoch": 1,
        "classes": ["a", "b", "c", "d"],
        "data_config": {"mean": [0.5] * 3, "input_size": [3, 64, 64]},
    }


def _tool(script, argv, capsys):
    """Run a tool in this process (its ``__main__``); returns (exit code, stderr)."""
    old = sys.argv
    sys.argv = [os.path.basename(script), *argv]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = old
    return e.value.code, capsys.readouterr().err.strip()


def _one_error_line(code, err, tool, path, why):
    assert code == 2, err
    assert err.startswith(f"{tool}: error: ") and "\n" not in err, err
    assert str(path) in err and why in err and "--trust-pickle" in err, err


# ---------------------------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------------------------
def test_loader_refuses_code_and_reads_weights(tmp_path, marker):
    evil_pth, evil_pkl = _malicious(tmp_path / "evil.pth", marker), _malicious(tmp_path / "evil.pkl", marker)
    why = r"needs full unpickling \(it refers to (builtins\.)?exec\)"
    for load in (load_checkpoint, check_loadable, torch_load):
        with pytest.raises(UnsafeCheckpointError, match=why) as e:
            load(evil_pth)
        assert "\n" not in str(e.value) and "evil.pth" in str(e.value) and "--trust-pickle" in str(e.value)
    for load in (load_checkpoint, check_loadable):
        with pytest.raises(UnsafeCheckpointError, match="evil.pkl is a pickle file: loading it runs any code"):
            load(evil_pkl)

    torch.save({"model": {"w": torch.arange(3.0)}, "iteration": 4, "name": "x", "shape": (1, 2)}, tmp_path / "ok.pth")
    assert load_checkpoint(tmp_path / "ok.pth")["shape"] == (1, 2)
    benign = tmp_path / "benign.pkl"
    with open(benign, "wb") as f:
        pickle.dump({"model": {"w": [1.0, 2.0]}, "__author__": "d2"}, f)
    assert load_checkpoint(benign, trust_pickle=True)["model"]["w"] == [1.0, 2.0]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_loadable(tmp_path / "missing.pth")


def test_safetensors_round_trip_with_metadata(tmp_path):
    shared = torch.randn(4, 3)
    tensors = {"a": shared, "b": shared, "c": torch.arange(6).view(2, 3).t(), "d": torch.zeros(0)}
    meta = {
        "format": "x/v1",
        "arm": "mimetic",
        "seed": 3,
        "lr": 0.5,
        "kwargs": {"depth": 2, "sizes": [1, 2]},
        "looks_like_json": "0",
        "none": None,
        "flag": True,
    }
    path = str(tmp_path / "w.safetensors")
    save_safetensors(tensors, path, meta)
    got = load_checkpoint(path)
    loaded = got.pop("model")
    assert got == meta  # every value comes back with its type, strings stay strings
    assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert [p for p in os.listdir(tmp_path)] == ["w.safetensors"]  # no temp file left
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:  # readable by any safetensors tool: plain strings as they are
        assert f.metadata()["arm"] == "mimetic" and f.metadata()["looks_like_json"] == '"0"'
    (tmp_path / "cut.safetensors").write_bytes(open(path, "rb").read()[:40])
    with pytest.raises(ValueError, match="cut.safetensors is truncated or not a safetensors file"):
        check_loadable(tmp_path / "cut.safetensors")


# ---------------------------------------------------------------------------------------------
# Detection: tools/train_net.py
# ---------------------------------------------------------------------------------------------
def _detection_case(tmp_path, marker, case):
    out = tmp_path / "out"
    out.mkdir()
    if case == "init_file":
        bad = _malicious(tmp_path / "evil.pth", marker)
        return bad, [f"train.init_checkpoint={bad}"]
    if case == "init_run_dir":
        (tmp_path / "pre").mkdir()
        bad = _malicious(tmp_path / "pre" / "model_final.pth", marker)
        return bad, [f"train.init_checkpoint={tmp_path / 'pre'}"]
    if case == "resume":  # the run of the config's arm and seed: <output_dir>/default/seed0
        (out / "default" / "seed0").mkdir(parents=True)
        bad = _malicious(out / "default" / "seed0" / "model_0000004.pth", marker)
        (out / "default" / "seed0" / "last_checkpoint").write_text("model_0000004.pth")
        return bad, ["--resume"]
    if case == "eval_only":
        bad = _malicious(tmp_path / "evil.pth", marker)
        return bad, ["--eval-only", f"train.init_checkpoint={bad}"]
    if case == "pkl_init":
        bad = _malicious(tmp_path / "evil.pkl", marker)
        return bad, [f"train.init_checkpoint={bad}"]
    if case == "pkl_eval_only":
        bad = _malicious(tmp_path / "evil.pkl", marker)
        return bad, ["--eval-only", f"train.init_checkpoint={bad}"]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["init_file", "init_run_dir", "resume", "eval_only", "pkl_init", "pkl_eval_only"])
def test_train_net_refuses_a_checkpoint_that_runs_code(tmp_path, marker, capsys, case):
    bad, argv = _detection_case(tmp_path, marker, case)
    code, err = _tool(TRAIN_NET, ["--config-file", CONFIG, *argv, f"train.output_dir={tmp_path / 'out'}"], capsys)
    _one_error_line(code, err, "train_net.py", bad, "pickle file" if case.startswith("pkl") else "full unpickling")
    if case == "resume":
        assert sorted(os.listdir(tmp_path / "out" / "default" / "seed0")) == ["last_checkpoint", "model_0000004.pth"]
    assert sorted(os.listdir(tmp_path / "out")) == (["default"] if case == "resume" else [])


def test_detection_checkpointer_refuses_in_the_worker_too(tmp_path, marker):
    """The pre-launch check aside, the checkpointer itself never unpickles code (e.g. a file swapped later)."""
    model = torch.nn.Linear(3, 1)
    for name in ("evil.pth", "evil.pkl"):
        with pytest.raises(UnsafeCheckpointError, match=name):
            RunCheckpointer(model).load(_malicious(tmp_path / name, marker))
    benign = tmp_path / "benign.pkl"
    with open(benign, "wb") as f:
        pickle.dump(
            {"model": {"weight": torch.ones(1, 3).numpy(), "bias": torch.zeros(1).numpy()}, "__author__": "d2"}, f
        )
    with pytest.raises(UnsafeCheckpointError, match="benign.pkl is a pickle file"):
        RunCheckpointer(model).load(str(benign))
    RunCheckpointer(model, trust_pickle=True).load(str(benign))  # detectron2's pickle path, opted in
    assert torch.equal(model.weight.detach(), torch.ones(1, 3))


def test_trust_pickle_lets_a_pkl_through_the_pre_launch_check(tmp_path):
    from condinit_det.engine import DetectionStage
    from condinit_det.launch.arguments import build_parser
    from condinit_det.launch.plan import plan_experiment

    def check_invocation(args):
        plan_experiment(DetectionStage(), args)

    benign = tmp_path / "zoo.pkl"
    with open(benign, "wb") as f:
        pickle.dump({"model": {"w": [0.0]}, "__author__": "d2"}, f)
    argv = ["--config-file", CONFIG, f"train.init_checkpoint={benign}", f"train.output_dir={tmp_path / 'out'}"]
    with pytest.raises(ValueError, match="zoo.pkl is a pickle file"):
        check_invocation(build_parser().parse_args(argv))
    check_invocation(build_parser().parse_args(["--trust-pickle", *argv]))
    with pytest.raises(ValueError, match="R-50.pkl is a pickle file"):  # model-zoo URLs too
        check_invocation(
            build_parser().parse_args([*argv, "train.init_checkpoint=detectron2://ImageNetPretrained/MSRA/R-50.pkl"])
        )


# ---------------------------------------------------------------------------------------------
# Pretraining: tools/pretrain_net.py
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cls_data(tmp_path_factory):
    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    return str(
        generate_classification_dataset(tmp_path_factory.mktemp("cls") / "shapes", num_train=16, num_val=8, spec=spec)
    )


def _pretrain_opts(data, out, **extra):
    opts = {
        "data.root": data,
        "data.img_size": 32,
        "model.kwargs.img_size": 32,
        "model.kwargs.depth": 2,
        "train.output_dir": out,
        "train.epochs": 1,
        "train.batch_size": 8,
        "train.workers": 0,
        "train.eval_batch_size": 8,
        **extra,
    }
    return [f"{k}={v}" for k, v in opts.items()]


@pytest.mark.parametrize("case", ["eval_only", "resume", "pkl_eval_only"])
def test_pretrain_net_refuses_a_checkpoint_that_runs_code(tmp_path, marker, capsys, cls_data, case):
    out = tmp_path / "out"
    run_dir = RunSpec("conditioned", 0).path(str(out))
    os.makedirs(run_dir)
    if case == "eval_only":  # the run's own final weights replaced by a malicious file
        bad = _malicious(os.path.join(run_dir, "model_final.pth"), marker)
        argv = ["--eval-only"]
    elif case == "resume":
        bad = _malicious(os.path.join(run_dir, "checkpoint_epoch0001.pth"), marker)
        argv = ["--resume"]
    else:
        bad = _malicious(tmp_path / "evil.pkl", marker)
        argv = ["--eval-only", f"train.init_checkpoint={bad}"]
    before = sorted(os.listdir(run_dir))
    argv = ["--config-file", DEMO, "--arm", "conditioned", *argv[:1], *_pretrain_opts(cls_data, str(out)), *argv[1:]]
    code, err = _tool(PRETRAIN_NET, argv, capsys)
    _one_error_line(code, err, "pretrain_net.py", bad, "pickle file" if case.startswith("pkl") else "full unpickling")
    assert sorted(os.listdir(run_dir)) == before


def test_pretrain_eval_only_reads_model_final_safetensors(tmp_path, capsys, cls_data):
    from condinit_det.pretrain import create_classifier, load_config, node

    out = tmp_path / "out"
    run_dir = RunSpec("conditioned", 0).path(str(out))
    os.makedirs(run_dir)
    cfg = load_config(DEMO, _pretrain_opts(cls_data, str(out)))
    model = create_classifier(node(cfg, "model"), 8)
    payload = {
        "format": PRETRAIN_FORMAT,
        "model": model.state_dict(),
        "weights": "model",
        "arm": "conditioned",
        "seed": 0,
        "epoch": 3,
        "iteration": 6,
    }
    save_final(payload, run_dir)
    os.remove(os.path.join(run_dir, "model_final.pth"))  # only the shareable file is left
    assert final_weights_file(run_dir).endswith("model_final.safetensors")
    loaded = load_checkpoint(final_weights_file(run_dir))
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())
    runpy_argv = ["--config-file", DEMO, "--arm", "conditioned", "--eval-only", *_pretrain_opts(cls_data, str(out))]
    old = sys.argv
    sys.argv = ["pretrain_net.py", *runpy_argv]
    try:
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(PRETRAIN_NET, run_name="__main__")
    finally:
        sys.argv = old
    assert exited.value.code == 0
    (record,) = ResultsFile(run_dir).records("cls_eval")
    assert record["checkpoint"].endswith("model_final.safetensors") and record["epoch"] == 3
    assert record["iteration"] == 6 and record["arm"] == "conditioned" and 0 <= record["top1"] <= 100


def test_pretrain_resume_with_ema_from_weights_only_checkpoints(tmp_path, cls_data, monkeypatch):
    """Epoch checkpoints hold the EMA and RNG states as tensors; resuming from one is still bitwise exact."""
    from condinit_det.pretrain import PretrainStage, load_config, train_run, trainer
    from condinit_det.pretrain.checkpoint import periodic_checkpointer

    spec = RunSpec("conditioned", 0)
    opts = {"train.epochs": 2, "scheduler.warmup_epochs": 1, "train.ema.enabled": True, "train.ema.decay": 0.5}

    def train(out, resume=False):
        cfg = PretrainStage().configure_run(
            load_config(DEMO, _pretrain_opts(cls_data, out, **opts)), spec, spec.path(out)
        )
        train_run(cfg, run_dir=spec.path(out), config_file=DEMO, resume=resume)
        return spec.path(out)

    a = train(str(tmp_path / "a"))
    with monkeypatch.context() as m:  # keep the first epoch's checkpoint, then forget the second epoch
        m.setattr(
            trainer, "periodic_checkpointer", lambda checkpointer, keep: periodic_checkpointer(checkpointer, keep=10)
        )
        b = train(str(tmp_path / "b"))
    for name in ("checkpoint_epoch0002.pth", "model_final.pth", "model_final.safetensors"):
        os.remove(os.path.join(b, name))
    state = torch.load(os.path.join(b, "checkpoint_epoch0001.pth"), map_location="cpu", weights_only=True)
    assert state["ema"].keys() == state["model"].keys()
    assert all(isinstance(state["rng"][k], torch.Tensor) for k in ("python", "numpy", "torch"))
    train(str(tmp_path / "b"), resume=True)
    fa = load_checkpoint(os.path.join(a, "model_final.safetensors"))
    fb = load_checkpoint(os.path.join(b, "model_final.safetensors"))
    assert fa["weights"] == fb["weights"] == "ema" and fa["epoch"] == 2
    assert all(torch.equal(fa["model"][k], fb["model"][k]) for k in fa["model"])


# ---------------------------------------------------------------------------------------------
# Converters and the conditioning tool
# ---------------------------------------------------------------------------------------------
def test_converters_refuse_code_and_read_safetensors(tmp_path, marker):
    from detectron2.modeling import ViT

    trunk = ViT(
        img_size=64,
        patch_size=16,
        embed_dim=32,
        depth=2,
        num_heads=2,
        mlp_ratio=2.0,
        window_size=0,
        use_rel_pos=False,
        out_feature="last_feat",
    )
    holder = torch.nn.Module()
    holder.net = trunk
    for name in ("evil.pth", "evil.pkl"):
        bad = _malicious(tmp_path / name, marker)
        with pytest.raises(UnsafeCheckpointError, match=name):
            convert_timm_checkpoint(bad, holder)
    timm_model = _timm_model()
    save_final(_pretrain_payload(timm_model, "conditioned"), str(tmp_path))
    from_dict = convert_timm_checkpoint(
        timm_model.state_dict(), holder, timm_model_name=TIMM_NAME, timm_model_kwargs=TIMM_KWARGS
    )
    for name in ("model_final.safetensors", "model_final.pth"):  # name and kwargs come from the file
        from_file = convert_timm_checkpoint(str(tmp_path / name), holder)
        assert from_file.keys() == from_dict.keys() and all(torch.equal(from_file[k], from_dict[k]) for k in from_dict)


@pytest.mark.parametrize("name, why", [("evil.pth", "full unpickling"), ("evil.pkl", "pickle file")])
def test_conditioning_tool_refuses_code(tmp_path, marker, capsys, name, why):
    bad = _malicious(tmp_path / name, marker)
    code, err = _tool(CONDITIONING, ["--config-file", CONFIG, "--arm", "default", "--weights", bad], capsys)
    _one_error_line(code, err, "attention_conditioning.py", bad, why)


# ---------------------------------------------------------------------------------------------
# The fine-tune hand-off from safetensors
# ---------------------------------------------------------------------------------------------
def test_run_directory_prefers_safetensors_and_both_convert_alike(tmp_path):
    from detectron2.config import LazyConfig, instantiate

    weights = _timm_model().state_dict()
    save_final(_pretrain_payload(_timm_model(), "conditioned"), str(tmp_path))
    assert pretrain_checkpoint_file(str(tmp_path)).endswith("model_final.safetensors")
    cfg = LazyConfig.load(CONFIG)
    states, metas = {}, {}
    for name in ("model_final.pth", "model_final.safetensors"):
        torch.manual_seed(0)
        model = instantiate(cfg.model)
        checkpointer = RunCheckpointer(model)
        checkpointer.load(str(tmp_path / name))
        states[name], metas[name] = model.state_dict(), checkpointer.pretrain_meta
    pth, st = states["model_final.pth"], states["model_final.safetensors"]
    assert pth.keys() == st.keys() and all(torch.equal(pth[k], st[k]) for k in pth)
    assert torch.equal(st["backbone.net.blocks.1.attn.qkv.weight"], weights["blocks.1.attn.qkv.weight"])
    assert metas["model_final.pth"] == metas["model_final.safetensors"]


@pytest.mark.slow
def test_fine_tune_from_a_run_directory_with_only_safetensors(tmp_path):
    pretrained = _timm_model("mimetic")
    run = tmp_path / "pretrain" / "mimetic" / "seed0"
    save_final(_pretrain_payload(pretrained, "mimetic"), str(run))
    os.remove(run / "model_final.pth")
    exp = tmp_path / "finetune" / "mimetic" / "seed0"  # the run of arm mimetic, seed 0
    # lr 0: the weights after one step are the weights the run started from.
    proc = subprocess.run(
        [
            sys.executable,
            TRAIN_NET,
            "--config-file",
            CONFIG,
            "--arm",
            "mimetic",
            f"train.output_dir={tmp_path / 'finetune'}",
            f"train.init_checkpoint='{tmp_path / 'pretrain' / '{arm}' / 'seed{seed}'}'",
            "train.max_iter=1",
            "train.eval_period=1",
            "optimizer.lr=0.0",
            "optimizer.weight_decay=0.0",
        ],
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads((exp / "condinit_arm_report.json").read_text())
    assert report["init_checkpoint"].endswith("pretrain/mimetic/seed0/model_final.safetensors")
    # The same per-site provenance as from model_final.pth (tests/test_finetune_handoff.py).
    sites = report["sites"]
    assert sites and all(s["weights_from"].endswith("(pretrained with arm mimetic)") for s in sites)
    assert "pretrained with arm 'mimetic'" in (exp / "log.txt").read_text()
    # The detection run's own final weights: .pth and the shareable .safetensors, equal, with metadata.
    final = torch_load(exp / "model_final.pth")["model"]
    meta = load_checkpoint(str(exp / "model_final.safetensors"))
    shared = meta.pop("model")
    assert shared.keys() == final.keys() and all(torch.equal(shared[k], final[k]) for k in final)
    assert meta["format"] == "condinit_det.detection/v1" and meta["arm"] == "mimetic" and meta["seed"] == 0
    assert meta["iteration"] == 0 and meta["config"] == CONFIG
    for block in range(2):
        assert torch.equal(
            final[f"backbone.net.blocks.{block}.attn.qkv.weight"],
            pretrained.state_dict()[f"blocks.{block}.attn.qkv.weight"],
        )
