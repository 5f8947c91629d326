"""kappa of the attention Jacobian along pretraining (condinit_det.pretrain.conditioning), on tiny runs."""

import json
import math
import os

import numpy as np
import pytest
import torch
from test_exact_resume import untimed_metrics
from test_pretrain import DEMO, SPEC, XCIT_DEMO, configure_run, run_cli, tiny

from condinit_det.analysis import ANALYSIS_DEFAULTS
from condinit_det.data.classification import generate_classification_dataset
from condinit_det.pretrain import create_classifier, load_config, node, trainer
from condinit_det.pretrain.checkpoint import last_checkpoint
from condinit_det.pretrain.conditioning import EpochConditioning, conditioning_options
from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.stage import PRETRAIN
from condinit_det.utils.checkpoint_io import load_checkpoint

EPOCHS, PERIOD, STEPS = 4, 2, 12  # 96 training images in batches of 8: 12 steps per epoch
SITES = ["blocks.0.attn", "blocks.1.attn"]  # depth 2: both sites are the first / middle / last


class _Killed(Exception):
    pass


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: tiny models gain nothing from more, and two spinning threads crawl on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The 8-class ImageFolder of tests/test_pretrain.py: 96 training, 16 evaluation images of 32x32."""
    return str(
        generate_classification_dataset(tmp_path_factory.mktemp("cls") / "shapes", num_train=96, num_val=16, spec=SPEC)
    )


def _cfg(root, out, period=PERIOD, **extra):
    return configure_run(
        load_config(DEMO, tiny(root, out, epochs=EPOCHS, **{"condinit_analysis.period": period}, **extra)),
        RunSpec("conditioned", 0),
        out,
    )


def _train(cfg, *, resume=False):
    """One process's run into ``cfg.train.output_dir``: setup, resume from the last epoch checkpoint, train."""
    run_dir = cfg.train.output_dir
    run = trainer.PretrainRun(cfg, run_dir, config_file=DEMO)
    run.setup()
    if resume:
        run.resume(last_checkpoint(run_dir))
    run.train()
    return run_dir


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """The same run with the measurement on (every 2 epochs) and off: {"on": run_dir, "off": run_dir}."""
    base = tmp_path_factory.mktemp("runs")
    return {name: _train(_cfg(data, str(base / name), period=period)) for name, period in (("on", PERIOD), ("off", 0))}


def test_records_at_the_due_epochs(runs):
    run_dir = runs["on"]
    records = ResultsFile(run_dir).records("conditioning")
    assert [(r["epoch"], r["site"]) for r in records] == [(e, s) for e in (0, 2, 4) for s in SITES]
    steps = {r["epoch"]: r["iteration"] for r in ResultsFile(run_dir).records(PRETRAIN.eval_kind)}
    for r in records:
        # The stage's unit in "epoch"; "iteration" counts optimizer steps, as the epoch's evaluation record does.
        assert r["iteration"] == r["epoch"] * STEPS == steps.get(r["epoch"], 0)
        assert math.isfinite(r["kappa"]) and r["kappa"] >= 1 and r["converged"] and r["method"] == "exact"
        assert r["kappa"] == pytest.approx(r["sigma_max"] / r["sigma_min"])
        assert (r["stage"], r["arm"], r["seed"], r["lr_scale"], r["config"]) == (
            "pretrain",
            "conditioned",
            0,
            1.0,
            DEMO,
        )
    # The event storage: the initialization on a line of its own, later points on their epoch's last line.
    lines = _metrics(run_dir)
    its = [line["iteration"] for line in lines]
    assert its == sorted(set(its))
    kappa_at = [line["iteration"] for line in lines if f"conditioning/{SITES[0]}/kappa" in line]
    assert kappa_at == [0, 2 * STEPS, 4 * STEPS]


def test_measuring_does_not_change_training(runs):
    on, off = (
        {(r["epoch"], r["iteration"]): r for r in ResultsFile(runs[k]).records(PRETRAIN.eval_kind)}
        for k in ("on", "off")
    )
    assert on.keys() == off.keys() and len(on) == EPOCHS
    for key in on:
        for field in ("top1", "top5", "train_loss", "eval_loss", "lr"):
            assert on[key][field] == off[key][field], (key, field)
    assert not ResultsFile(runs["off"]).records("conditioning")
    losses = [
        [(m["iteration"], m["total_loss"]) for m in _metrics(runs[k]) if "total_loss" in m] for k in ("on", "off")
    ]
    assert losses[0] == losses[1] and len(losses[0]) == EPOCHS * STEPS // 4
    final = [load_checkpoint(os.path.join(runs[k], "model_final.pth"))["model"] for k in ("on", "off")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[1])


def test_resumed_runs_never_measure_an_epoch_twice(data, runs, tmp_path, monkeypatch):
    cfg = _cfg(data, str(tmp_path / "resumed"))
    measured, stop = [], {"at": None}
    measure, train_epoch = trainer.EpochConditioning.measure, trainer.PretrainRun.train_epoch

    def spy(self, model, *, epoch, step, **kwargs):
        measured.append(epoch)
        return measure(self, model, epoch=epoch, step=step, **kwargs)

    def stopping(self, epoch):
        if epoch == stop["at"]:
            raise _Killed  # killed after the checkpoint of `epoch` completed epochs
        return train_epoch(self, epoch)

    monkeypatch.setattr(trainer.EpochConditioning, "measure", spy)
    monkeypatch.setattr(trainer.PretrainRun, "train_epoch", stopping)
    segments = []
    for resume, stop_at in ((False, 1), (True, 2), (True, None)):
        stop["at"], measured[:] = stop_at, []
        if stop_at is None:
            run_dir = _train(cfg, resume=resume)
        else:
            with pytest.raises(_Killed):
                _train(cfg, resume=resume)
        segments.append(list(measured))
    # Killed at epoch 1 (not due), then at epoch 2 (measured already): the points of the uninterrupted run, bitwise.
    assert segments == [[0], [2], [4]]
    records = ResultsFile(run_dir).records("conditioning")
    assert [(r["epoch"], r["site"]) for r in records] == [(e, s) for e in (0, 2, 4) for s in SITES]
    its = [line["iteration"] for line in _metrics(run_dir)]
    assert its == sorted(set(its))  # no second metrics.json line for a step
    assert records == ResultsFile(runs["on"]).records("conditioning")
    assert untimed_metrics(run_dir) == untimed_metrics(runs["on"])


def test_the_options_are_the_detection_ones(data, tmp_path, capsys):
    from omegaconf import OmegaConf

    from condinit_det.analysis.hooks import build_conditioning_hook

    assert conditioning_options(_cfg(data, str(tmp_path), period=0)) is None
    assert conditioning_options(_cfg(data, str(tmp_path))) == {**ANALYSIS_DEFAULTS, "period": PERIOD}
    cfg = _cfg(data, str(tmp_path), **{"+condinit_analysis.perod": 3})  # past the override check: the node's own
    with pytest.raises(ValueError) as pretrain_error:
        trainer.PretrainRun(cfg, str(tmp_path / "run"), config_file=DEMO)
    detection = OmegaConf.create({"condinit_analysis": {"period": 2, "perod": 3}, "train": {"output_dir": ""}})
    with pytest.raises(ValueError) as detection_error:
        build_conditioning_hook(detection, batch=[{}])
    assert str(pretrain_error.value) == str(detection_error.value)
    assert "unknown key(s) ['perod']; accepted: ['block_size'," in str(pretrain_error.value)
    # The command line: one line, exit status 2, before anything is written.
    out = tmp_path / "cli"
    code, err = run_cli(["--config-file", DEMO, *tiny(data, str(out)), "condinit_analysis.perod=3"], capsys)
    assert (
        code == 2
        and "\n" not in err
        and "condinit_analysis.perod: no such key; did you mean condinit_analysis.period?" in err
    )
    assert not out.exists()


def test_class_attention_and_no_rng_moved(tmp_path):
    # XCiT's default sites end with a class-attention layer: one query token, kappa measured, no bound.
    cfg = load_config(XCIT_DEMO, tiny(str(tmp_path), str(tmp_path)))
    model = create_classifier(node(cfg, "model"), 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = EpochConditioning(
        torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
        conditioning_options(cfg),
        num_epochs=6,
        meta={"arm": "default"},
    )
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy())
    records = probe.measure(model, epoch=0, step=0)
    assert torch.equal(rng[0], torch.get_rng_state()) and np.array_equal(rng[1], np.random.get_state()[1])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert [r["site"] for r in records] == ["blocks.0.attn", "cls_attn_blocks.0.attn", "cls_attn_blocks.1.attn"]
    assert all(math.isfinite(r["kappa"]) for r in records)
    assert math.isnan(records[-1]["bound"]) and math.isfinite(records[0]["bound"])
    assert probe.measure(model, epoch=0, step=0) == []  # never twice at one epoch


def test_the_report_draws_the_measured_points(runs, tmp_path):
    pytest.importorskip("matplotlib")
    from condinit_det.report import compare_arms

    report, _ = compare_arms([os.path.dirname(os.path.dirname(runs["on"]))], str(tmp_path), bootstrap=0)
    (stage,) = report.stages
    assert stage.stage.name == "pretrain"
    x, median, low, high = stage.kappa["conditioned"]
    records = ResultsFile(runs["on"]).records("conditioning")
    # The curve's x is the stage's unit, the epoch: one point per measured epoch.
    assert PRETRAIN.unit == "epoch"
    assert list(x) == [r["epoch"] for r in records if r["site"] == SITES[0]] == [0, 2, 4]
    assert np.all(low <= median) and np.all(median <= high)
    assert os.path.isfile(tmp_path / PRETRAIN.kappa_plot)
