"""Bad input to tools/train_net.py: one clear error that says what was wrong and what is accepted, no data lost.

Each row of the bad-input table in the docs is pinned here: most through ``plan_experiment`` (what the
tool runs before any worker starts), the rest, and the one-line CLI form, through the tool itself.
"""

import json
import os
import sys

import pytest
import torch

from condinit_det.engine import DetectionStage
from condinit_det.launch.arguments import build_parser
from condinit_det.launch.plan import plan_experiment
from condinit_det.records.identity import write_arm_report
from condinit_det.utils.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_train_config.py")
PRETRAIN_CONFIG = os.path.join(ROOT, "configs", "demo", "pretrain_vit_tiny.py")


def _check(*argv):
    return plan_experiment(DetectionStage(), build_parser().parse_args(["--config-file", CONFIG, *argv]))


def _cli(tmp_path, monkeypatch, capsys, *argv):
    """The training command's exit status 2 and last error line, from ``tmp_path`` (run here: a process would spend
    its seconds importing torch)."""
    from condinit_det.launch.command import run_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "tools", "train_net.py")])  # the command's name, as run
    status = run_command(DetectionStage, ["--config-file", CONFIG, *argv])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert status == 2 and last.startswith("train_net.py: error: ") and "Traceback" not in err, err[-3000:]
    return last


def _identity(**changes):
    identity = {
        "arm": "conditioned",
        "arm_seed": 0,
        "include": None,
        "exclude": None,
        "options": {"gain_qk": 1.0, "gain_v": 1.0, "value_mode": "identity", "condition_output": False},
        "seed": 0,
        "lr_scale": 1.0,
    }
    return {**identity, **changes}


@pytest.mark.parametrize(
    "override, message",
    [
        ("condinit.arm=best", "condinit.arm='best' is not an arm; accepted: default, mimetic, conditioned"),
        (
            "condinit.options.mimetic.gain_qk=2",
            "condinit.options.mimetic: option\\(s\\) gain_qk are not accepted by the "
            "'mimetic' arm; accepted: alpha1, beta1, alpha2, beta2, noise",
        ),
        ("condinit.options.gain_qk=2", "condinit.options takes one entry per arm: write condinit.options.conditioned"),
        ("condinit.options.bogus.x=1", "condinit.options.bogus: 'bogus' is not an arm"),
        ("dataloader.train.dataset.names=no_such_set", "dataset 'no_such_set' is not registered; register it"),
        ("train.output_dir=/proc/no/such/dir", "cannot write to the output directory /proc/no/such/dir"),
    ],
)
def test_bad_config_values(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        _check(f"train.output_dir={tmp_path}", override)


@pytest.mark.parametrize(
    "stage, config, override, message",
    [
        (
            "detection",
            CONFIG,
            "train.max_itr=10",
            "train.max_itr: no such key; did you mean train.max_iter\\? "
            "\\(to add a key the config lacks: \\+train.max_itr=10\\)",
        ),
        (
            "detection",
            CONFIG,
            "condinit_analysis.perod=3",
            "condinit_analysis.perod: no such key; did you mean condinit_analysis.period\\?",
        ),
        ("pretrain", PRETRAIN_CONFIG, "train.epocs=3", "train.epocs: no such key; did you mean train.epochs\\?"),
        ("pretrain", PRETRAIN_CONFIG, "optimizer.lrr=3", "optimizer.lrr: no such key; did you mean optimizer.lr\\?"),
    ],
)
def test_a_misspelt_override_is_refused_before_anything_is_built(tmp_path, stage, config, override, message):
    from condinit_det.pretrain import PretrainStage

    make = DetectionStage if stage == "detection" else PretrainStage
    argv = ["--config-file", config, f"train.output_dir={tmp_path}", override]
    with pytest.raises(UsageError, match=message):
        plan_experiment(make(), build_parser().parse_args(argv))
    assert not os.listdir(tmp_path)
    # keys the stage reads though the config lacks them, and keys added on purpose, are accepted
    plan_experiment(make(), build_parser().parse_args([*argv[:-1], "train.seed=3", "+note='x'"]))


def test_overrides_into_a_list_element_are_checked_by_index():
    from omegaconf import OmegaConf

    from condinit_det.utils.overrides import check_override_keys

    cfg = OmegaConf.create({"mapper": {"augmentations": [{"flip": True}, {"target_height": 1024, "ref": "${..0}"}]}})
    check_override_keys(cfg, ["mapper.augmentations.1.target_height=128", "mapper.augmentations.0=x"])
    with pytest.raises(
        UsageError,
        match=r"^mapper.augmentations.1.target_heigt: no such key; did you mean "
        r"mapper.augmentations.1.target_height\?",
    ):
        check_override_keys(cfg, ["mapper.augmentations.1.target_heigt=128"])
    with pytest.raises(UsageError, match="mapper.augmentations.2.flip: no such key"):
        check_override_keys(cfg, ["mapper.augmentations.2.flip=false"])


def _head(*, width, top_k=100):
    return width, top_k


def _loose(**kwargs):
    return kwargs


def test_a_targets_own_arguments_are_accepted_though_the_config_does_not_set_them():
    from omegaconf import OmegaConf

    from condinit_det.utils.overrides import check_override_keys

    cfg = OmegaConf.create(
        {
            "head": {"_target_": f"{__name__}._head", "width": 8},
            "loose": {"_target_": f"{__name__}._loose", "inner": {"_target_": f"{__name__}._head"}},
        }
    )
    check_override_keys(cfg, ["head.top_k=10", "loose.anything=1", "loose.inner.top_k=3"])
    with pytest.raises(UsageError, match=r"head.top_kk: no such key; did you mean head.top_k\?"):
        check_override_keys(cfg, ["head.top_kk=10"])
    with pytest.raises(UsageError, match="loose.inner.top_kk: no such key"):  # **kwargs opens its own node only
        check_override_keys(cfg, ["loose.inner.top_kk=3"])


class _Predictor:
    def __init__(self, *, num_classes, loss_weight=1.0):
        self.num_classes, self.loss_weight = num_classes, loss_weight


class _MaskPredictor(_Predictor):
    def __init__(self, width, *, depth=1, **kwargs):  # passes the rest to _Predictor
        super().__init__(**kwargs)


def test_a_class_taking_kwargs_accepts_the_keyword_arguments_along_its_init_chain():
    from omegaconf import OmegaConf

    from condinit_det.utils.overrides import check_override_keys, target_arguments

    assert target_arguments(_MaskPredictor) == (["width", "depth", "num_classes", "loss_weight"], False)
    assert target_arguments(f"{__name__}._loose") == ([], True)
    head = {"_target_": f"{__name__}._MaskPredictor", "width": 8}
    # an armed node's _target_ takes **kwargs and passes them to its _arm_target_, whose keys count
    armed = {"_target_": f"{__name__}._loose", "_arm_target_": f"{__name__}._MaskPredictor", "width": 8}
    cfg = OmegaConf.create({"head": head, "model": armed})
    check_override_keys(cfg, ["head.depth=2", "head.num_classes=3", "head.loss_weight=2", "model.num_classes=3"])
    for key in ("head", "model"):
        with pytest.raises(UsageError, match=rf"^{key}.num_clases: no such key; did you mean {key}.num_classes\?"):
            check_override_keys(cfg, [f"{key}.num_clases=3"])


def test_a_value_of_the_wrong_type_names_the_override_and_the_type_it_takes():
    from omegaconf import OmegaConf

    from condinit_det.utils.overrides import check_override_keys

    cfg = OmegaConf.create({"train": {"max_iter": 90000, "amp": {"enabled": False}, "lr": 0.1, "name": "x"}})
    optional = {"train.seed": 0}
    for override, message in [
        ("train.max_iter=abc", "train.max_iter=abc: expected an integer (the config's value is 90000)"),
        ("train.max_iter=1e3", "train.max_iter=1e3: expected an integer (the config's value is 90000)"),
        ("train.amp.enabled=1", "train.amp.enabled=1: expected true or false (the config's value is False)"),
        ("train.lr=fast", "train.lr=fast: expected a number (the config's value is 0.1)"),
        ("train.seed=abc", "train.seed=abc: expected an integer (its default is 0)"),
    ]:
        with pytest.raises(UsageError) as e:
            check_override_keys(cfg, [override], optional=optional)
        assert str(e.value) == message
    accepted = ["train.max_iter=10", "train.lr=1", "train.amp.enabled=true", "train.name=3", "train.seed=2"]
    check_override_keys(cfg, [*accepted, "train.max_iter=null", "train.max_iter=${train.seed}"], optional=optional)
    # a rate the config writes as 0 takes a fraction; a key added with + or ++ is not checked
    cfg.train.weight_decay = 0
    check_override_keys(cfg, ["train.weight_decay=0.05", "+train.extra=1", "++train.other=abc"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        (  # StandardROIHeads takes **kwargs and passes them to ROIHeads, whose keys are the accepted ones
            "model.roi_heads.num_clases=3",
            "model.roi_heads.num_clases: no such key; did you mean model.roi_heads.num_classes?",
        ),
        ("train.max_iter=abc", "train.max_iter=abc: expected an integer (the config's value is "),
    ],
)
def test_cli_names_a_misspelt_key_or_a_bad_value_before_anything_is_built(
    tmp_path, monkeypatch, capsys, override, message
):
    last = _cli(tmp_path, monkeypatch, capsys, f"train.output_dir={tmp_path / 'exp'}", override)
    assert message in last
    assert os.listdir(tmp_path) == []


def test_missing_dataset_folder(tmp_path):
    from detectron2.data.datasets import register_coco_instances

    register_coco_instances("condinit_test_missing_folder", {}, str(tmp_path / "nothing.json"), str(tmp_path / "none"))
    with pytest.raises(ValueError, match="dataset 'condinit_test_missing_folder': its image_root .* does not exist"):
        _check(f"train.output_dir={tmp_path}", "dataloader.test.dataset.names=condinit_test_missing_folder")


def test_corrupt_results_file_is_never_overwritten(tmp_path):
    run = tmp_path / "default" / "seed0"  # the run of the config's arm and seed
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"version": 1, "records": [{"kind": "ap", "itera')
    experiment = _check("--resume", "--arm", "default,conditioned", f"train.output_dir={tmp_path}")
    (bad,) = experiment.unreadable.values()  # named and left alone; the other run goes on
    assert "results.json is not valid JSON" in bad and "left as it is" in bad
    from condinit_det.launch.plan import run_actions

    actions = {spec.arm: action for spec, action, _ in run_actions(experiment)}
    assert actions == {"default": f"skip: {bad}", "conditioned": "train"}
    with pytest.raises(ValueError, match=r"seed0 holds a run \(results.json\): continue it with --resume"):
        _check(f"train.output_dir={tmp_path}")  # a fresh run never starts over it either
    assert (run / "results.json").read_text().endswith('"itera')  # untouched


def test_resume_with_another_arm_seed_or_patterns_is_refused(tmp_path):
    run = tmp_path / "conditioned" / "seed0"
    write_arm_report(str(run), {"arm": "conditioned", "sites": []}, _identity())
    with pytest.raises(
        ValueError, match="include=None.* but this run asks for include=\\['backbone.net.blocks.0.\\*'\\]"
    ):
        _check(
            "--resume",
            "--arm",
            "conditioned",
            "condinit.include=[backbone.net.blocks.0.*]",
            f"train.output_dir={tmp_path}",
        )
    _check("--resume", "--arm", "conditioned", f"train.output_dir={tmp_path}")  # the same run: fine
    # Another arm or seed is another run directory (<output_dir>/<arm>/seed<k>): nothing to refuse.
    _check("--resume", "--arm", "mimetic", f"train.output_dir={tmp_path}")
    _check("--resume", "--arm", "conditioned", "train.seed=3", f"train.output_dir={tmp_path}")
    # A run directory whose arm report names another arm or seed (moved by hand) is refused.
    write_arm_report(str(run), {"arm": "mimetic", "sites": []}, _identity(arm="mimetic", seed=3))
    with pytest.raises(
        ValueError, match="was started with arm='mimetic', seed=3 but this run asks for arm='conditioned', seed=0"
    ):
        _check("--resume", "--arm", "conditioned", f"train.output_dir={tmp_path}")
    _check("--resume", "--arm", "conditioned", "--allow-changed-run", f"train.output_dir={tmp_path}")


def test_truncated_checkpoints_are_named(tmp_path):
    run = tmp_path / "default" / "seed0"
    run.mkdir(parents=True)
    torch.save({"model": {"w": torch.zeros(1000)}}, run / "model_final.pth")
    data = (run / "model_final.pth").read_bytes()
    (run / "model_final.pth").write_bytes(data[: len(data) // 2])
    (run / "last_checkpoint").write_text("model_final.pth")
    message = "model_final.pth is truncated or not a PyTorch checkpoint"
    with pytest.raises(ValueError, match=message):
        _check("--resume", f"train.output_dir={tmp_path}")
    with pytest.raises(ValueError, match=message):
        _check("--eval-only", f"train.init_checkpoint={run / 'model_final.pth'}", f"train.output_dir={tmp_path}")
    (run / "last_checkpoint").write_text("")
    with pytest.raises(ValueError, match="last_checkpoint is empty"):
        _check("--resume", f"train.output_dir={tmp_path}")


def test_one_checkpoint_for_every_arm_is_refused(tmp_path):
    torch.save({"model": {}}, tmp_path / "shared.pth")
    with pytest.raises(ValueError, match="every arm would start from the same checkpoint .*shared.pth"):
        _check("--arm", "all", f"train.init_checkpoint={tmp_path / 'shared.pth'}", f"train.output_dir={tmp_path}")
    _check(
        "--arm",
        "all",
        "--allow-shared-checkpoint",
        f"train.init_checkpoint={tmp_path / 'shared.pth'}",
        f"train.output_dir={tmp_path}",
    )


def test_another_arms_pretraining_checkpoint_is_refused(tmp_path):
    for arm in ("default", "mimetic"):
        (tmp_path / arm).mkdir()
        torch.save(
            {"format": "condinit_det.pretrain/v1", "model": {}, "arm": arm, "seed": 0},
            tmp_path / arm / "model_final.pth",
        )
    with pytest.raises(ValueError, match="was pretrained with arm 'default' but this run's arm is 'mimetic'"):
        _check("--arm", "mimetic", f"train.init_checkpoint={tmp_path / 'default'}", f"train.output_dir={tmp_path}")
    # On the command line, a value with {arm} is quoted for the override parser.
    template = f"train.init_checkpoint='{tmp_path / '{arm}'}'"
    _check("--arm", "mimetic", template, f"train.output_dir={tmp_path}")
    (tmp_path / "conditioned").mkdir()
    with pytest.raises(ValueError, match="is a directory without model_final.pth"):
        _check("--arm", "conditioned", template, f"train.output_dir={tmp_path}")


def test_a_dry_run_prices_a_fine_tuning_before_its_pretraining(tmp_path):
    from condinit_det.launch.plan import describe_plan
    from condinit_det.records.layout import plan_runs, write_plan
    from condinit_det.stage import PRETRAIN

    pretrain = tmp_path / "pretrain"
    write_plan(str(pretrain), plan_runs(["default", "mimetic"], [0]), stage=PRETRAIN, config="c.py", length=1)
    (pretrain / "mimetic" / "seed0").mkdir(parents=True)  # started, without its final weights yet
    template = f"train.init_checkpoint='{pretrain / '{arm}' / 'seed{seed}'}'"
    argv = ["--arm", "default,mimetic", template, f"train.output_dir={tmp_path / 'exp'}"]
    lines = describe_plan(_check(*argv, "--dry-run", "--step-time", "1")).splitlines()
    assert f"waits for {pretrain / 'default' / 'seed0'} (not trained yet)" in lines  # planned, not started
    assert f"waits for {pretrain / 'mimetic' / 'seed0'} (not finished yet)" in lines
    assert any(line.startswith("| total (2 runs)") for line in lines)  # priced all the same
    # a real start still refuses
    with pytest.raises(UsageError, match=f"checkpoint {pretrain / 'default' / 'seed0'} does not exist"):
        _check(*argv)
    # a path that no plan lists (a typo) is missing, for a dry run as for a real start
    typo = f"train.init_checkpoint='{tmp_path / 'pretrian' / '{arm}' / 'seed{seed}'}'"
    with pytest.raises(UsageError, match=f"checkpoint {tmp_path / 'pretrian' / 'default' / 'seed0'} does not exist"):
        _check("--arm", "default,mimetic", typo, f"train.output_dir={tmp_path / 'exp'}", "--dry-run")


def test_a_missing_step_bench_file_or_sbatch_is_one_error_line_and_nothing_is_written(tmp_path, capsys, monkeypatch):
    from condinit_det.launch.command import run_command

    argv = ["--config-file", CONFIG, f"train.output_dir={tmp_path / 'exp'}"]
    missing = tmp_path / "no.json"
    assert run_command(DetectionStage, [*argv, "--dry-run", "--step-bench", str(missing)]) == 2
    assert f"error: step bench file {missing} does not exist (write it with " in capsys.readouterr().err
    monkeypatch.setenv("PATH", "")  # no sbatch here
    assert run_command(DetectionStage, [*argv, "--slurm"]) == 2
    assert "error: --slurm: sbatch/srun are not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "exp").exists()


def test_eval_only_needs_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="--eval-only needs train.init_checkpoint=PATH"):
        _check("--eval-only", f"train.output_dir={tmp_path}")
    with pytest.raises(ValueError, match="cannot be combined with several arms"):
        _check("--eval-only", "--arm", "all", f"train.output_dir={tmp_path}")


@pytest.mark.parametrize(
    "seeds, lr, message",
    [
        ("0,x", None, "--seeds '0,x': expected non-negative integers"),
        ("1,1", None, "expected distinct non-negative integers"),
        (None, "0,1", "--lr-scale '0,1': expected distinct positive numbers"),
    ],
)
def test_bad_seed_and_scale_lists(tmp_path, seeds, lr, message):
    argv = (["--seeds", seeds] if seeds else []) + (["--lr-scale", lr] if lr else [])
    with pytest.raises(ValueError, match=message):
        _check(*argv, f"train.output_dir={tmp_path}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        ("condinit.options.mimetic.gain_qk=2", "option(s) gain_qk are not accepted by the 'mimetic' arm"),
        ("condinit.include=[nothing.*]", "include pattern 'nothing.*' matches no attention site"),
        ("model.backbone.net.depth=0", "no attention site found in GeneralizedRCNN"),
        ("model.backbone.net.num_heads=3", "num_heads=3 does not divide the query/key width 32"),
    ],
)
def test_cli_prints_one_error_line(tmp_path, monkeypatch, capsys, override, message):
    exp = tmp_path / "exp"
    run = exp / "mimetic" / "seed0"
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"version": 1, "records": []}')  # an earlier run's results
    last = _cli(tmp_path, monkeypatch, capsys, "--arm", "mimetic", f"train.output_dir={exp}", override)
    assert message in last
    # Nothing was written, launched or moved aside: the earlier results are where they were.
    assert sorted(os.listdir(run)) == ["results.json"] and os.listdir(exp) == ["mimetic"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("condinit.include=[nothing.*]", "include pattern 'nothing.*' matches no attention site"),
        ("model.backbone.net.depth=0", "no attention site found in GeneralizedRCNN"),
        ("model.backbone.net.num_heads=3", "num_heads=3 does not divide the query/key width 32"),
    ],
)
def test_arm_site_errors_come_before_the_launch(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        _check("--arm", "conditioned", f"train.output_dir={tmp_path}", override)
    with pytest.raises(ValueError, match=message):
        _check("--arm", "all", f"train.output_dir={tmp_path}", override)
    assert os.listdir(tmp_path) == []


def test_the_site_check_changes_no_weight_and_leaves_the_rng(tmp_path):
    from detectron2.config import instantiate

    from condinit_det.engine.config import check_arm_sites, load_config, prepare_config

    cfg = prepare_config(load_config(CONFIG, [f"train.output_dir={tmp_path}"]), arm="conditioned")
    torch.manual_seed(3)
    state = torch.get_rng_state()
    check_arm_sites(cfg)
    assert torch.equal(state, torch.get_rng_state())
    model = instantiate(cfg.model)
    assert model.condinit_report.arm == "conditioned" and model.condinit_report.changed_parameters()


def test_arm_report_records_the_identity_checked_on_resume(tmp_path):
    write_arm_report(str(tmp_path), {"arm": "conditioned"}, _identity(lr_scale=0.5))
    saved = json.loads((tmp_path / "condinit_arm_report.json").read_text())
    assert saved["run"]["lr_scale"] == 0.5 and saved["arm"] == "conditioned"


def test_an_arm_set_in_two_disagreeing_places_is_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match="the arm is set in two places that disagree: condinit .*'conditioned'.* and model.condinit .*'mimetic'",
    ):
        _check("--arm", "conditioned", "model.condinit={arm:mimetic}", f"train.output_dir={tmp_path}")
    _check("--arm", "mimetic", "model.condinit={arm:mimetic}", f"train.output_dir={tmp_path}")  # they agree


def test_several_machines_need_the_first_ones_address(tmp_path):
    argv = ["--config-file", CONFIG, f"train.output_dir={tmp_path}", "--num-machines", "2", "--machine-rank", "1"]
    with pytest.raises(UsageError, match="--num-machines 2 needs --dist-url tcp://HOST:PORT, the first machine's"):
        plan_experiment(DetectionStage(), build_parser().parse_args(argv))
    assert not os.listdir(tmp_path)
    experiment = plan_experiment(DetectionStage(), build_parser().parse_args([*argv, "--dist-url", "tcp://h0:29500"]))
    assert experiment.args.dist_url == "tcp://h0:29500"
    assert build_parser().parse_args(argv[:3]).dist_url == "auto"  # one machine: a free port of its own
