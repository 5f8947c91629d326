"""The structure x scale design in the report: the four arms' cells, the effects paired by seed (main effects and
interaction a family of their own), the sentence per metric, the interaction figure, on experiments with planted cell
values; and the families of verdicts of the four arms: asking more takes no answer away."""

import csv
import dataclasses
import json
import math
import os

import numpy as np
import pytest
from forked_tool import run_tool
from scipy import stats as scipy_stats
from table_text import unpadded

from condinit_det.evaluation.bootstrap import image_draws, resampled_mean
from condinit_det.records.per_image import write_classification_eval
from condinit_det.records.results import ResultsFile
from condinit_det.report import Comparison, compare_arms
from condinit_det.report.factorial import EFFECTS, carried_by, design_problem
from condinit_det.report.paired import compare_stage
from condinit_det.report.statistics import BETTER, NO_DIFFERENCE, TOO_FEW_SEEDS, WORSE, two_level_bootstrap

ITERS = (100, 200, 300, 400)
OPTIONS = {"gain_qk": 1.0, "gain_v": 1.0, "value_mode": "identity"}
ARM_OPTIONS = {
    "default": {},
    "conditioned": {**OPTIONS, "condition_output": False},
    "scale_matched": {**OPTIONS, "norm": "frobenius"},
    "structured": {**OPTIONS, "norm": "frobenius"},
}
# Final box AP per arm and seed: the scale adds 2 (+-0.1 by seed), the structure 0.1 on seed 1 only.
SCALE_ONLY = {
    "default": [40.0, 41.0, 42.0],
    "scale_matched": [42.0, 43.1, 43.9],
    "structured": [40.0, 41.1, 42.0],
    "conditioned": [42.1, 43.0, 44.0],
}


def _write_run(path, arm, seed, final_box, options=None):
    """A detection run whose box and mask AP climb to their final values (mask = box - 2)."""
    os.makedirs(path, exist_ok=True)
    identity = {"arm": arm, "seed": seed, "arm_seed": seed, "lr_scale": 1.0, "options": options}
    with open(os.path.join(path, "condinit_arm_report.json"), "w") as f:
        json.dump({"run": identity, "arm": arm, "sites": []}, f)
    rf = ResultsFile(path)
    for it, step in zip(ITERS, (15.0, 8.0, 1.0, 0.0)):
        b, m = final_box - step, final_box - 2.0 - step
        ap = {"bbox": {"AP": b, "AP50": b + 20, "AP75": b + 5}, "segm": {"AP": m, "AP50": m + 20, "AP75": m + 5}}
        rf.add({"kind": "ap", "stage": "detection", "iteration": it, "arm": arm, "seed": seed, **ap})


def _experiment(root, box, options=ARM_OPTIONS):
    for arm, values in box.items():
        for seed, v in enumerate(values):
            _write_run(str(root / arm / f"seed{seed}"), arm, seed, v, options.get(arm))
    return str(root)


def _per_seed(box, effect):
    return [sum(w * box[arm][s] for arm, w in effect.weights) for s in range(len(box["default"]))]


def test_effects_are_the_planted_cell_sums_with_their_paired_intervals_in_the_holm_family(tmp_path):
    report, text = compare_arms([_experiment(tmp_path / "exp", SCALE_ONLY)], output_dir=str(tmp_path / "report"))
    sr = report.primary
    assert sr.has_factorial and sr.factorial_problem is None
    effects = sr.effects("bbox")
    assert list(effects) == [e.name for e in EFFECTS]
    for effect in EFFECTS:
        row = effects[effect.name]
        assert row.differences == pytest.approx(_per_seed(SCALE_ONLY, effect), abs=1e-9), effect.name
        # bootstrap on, but no per-image data: the paired t over the per-seed sums
        d = np.asarray(row.differences)
        half = scipy_stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
        assert (row.interval.low, row.interval.high) == pytest.approx((d.mean() - half, d.mean() + half))
    # the simple effects are the rows of two arms; the main effects and the interaction rows of their own
    assert effects["structure_at_conditioned_scale"].label == "conditioned vs scale_matched"
    assert effects["scale_at_random_structure"].label == "scale_matched"
    joint = [s for s in sr.comparisons if s.reference == "factorial"]
    assert [(s.label, s.metric) for s in joint] == [
        ("structure (main effect)", "AP^b"),
        ("scale (main effect)", "AP^b"),
        ("structure × scale (interaction)", "AP^b"),
        ("structure (main effect)", "AP^m"),
        ("scale (main effect)", "AP^m"),
        ("structure × scale (interaction)", "AP^m"),
    ]
    # a family per question: 3 arms against default, 2 contrasts (conditioned vs scale_matched / structured), the
    # 3 effects, x {AP^b, AP^m}; each row's p times its family's size
    assert {f: len(rows) for f, rows in sr.families.items()} == {
        "against default": 6,
        "between two arms": 4,
        "structure × scale": 6,
    }
    for s in sr.comparisons:
        assert s.p_adjusted == pytest.approx(min(1.0, s.family_size * s.interval.p_value))
    assert (
        "  - structure × scale: structure (main effect) × {AP^b, AP^m}; scale (main effect) × {AP^b, AP^m}; "
        "structure × scale (interaction) × {AP^b, AP^m} (6 comparisons, intervals at 99.17%)" in text
    )
    assert effects["scale"].verdict == BETTER and effects["structure"].verdict == NO_DIFFERENCE
    assert effects["interaction"].verdict == NO_DIFFERENCE
    flat = unpadded(text)
    assert "**AP^b**: the difference is carried by the scale (main effect +2.0 [" in text
    assert "| random | 41.0 ± 1.0 (default) | 43.0 ± 1.0 (scale_matched) |" in flat
    assert "| conditioned | 41.0 ± 1.0 (structured) | 43.0 ± 1.0 (conditioned) |" in flat
    assert "| structure (main effect) | ½ (conditioned − scale_matched + structured − default) |" in flat
    # the first table stays first, and holds the effects
    assert flat.index("| structure (main effect) | AP^b |") < flat.index("## Detection")
    assert flat.index("## Detection") < flat.index("### What the gain is made of: structure × scale")
    assert "![interaction.png](interaction.png)" in text
    assert os.path.getsize(tmp_path / "report" / "interaction.png") > 10_000
    with open(tmp_path / "report" / "stats.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["reference"] == "factorial"]
    assert [(r["arm"], r["metric"], r["family"], r["family_size"]) for r in rows[:3]] == [
        ("structure", "AP^b", "structure × scale", "6"),
        ("scale", "AP^b", "structure × scale", "6"),
        ("interaction", "AP^b", "structure × scale", "6"),
    ]
    assert float(rows[1]["mean_difference"]) == pytest.approx(np.mean(_per_seed(SCALE_ONLY, EFFECTS[5])))


def test_an_interaction_is_said_as_such_and_a_reversed_contrast_still_reads_as_the_effect(tmp_path):
    # only the conditioned cell gains: structure and scale each +1 as main effects, interaction +2
    box = {
        "default": [40.0, 41.0, 42.0],
        "scale_matched": [40.1, 40.9, 42.0],
        "structured": [40.0, 41.1, 41.9],
        "conditioned": [42.0, 43.1, 43.9],
    }
    root = _experiment(tmp_path / "exp", box)
    report, text = compare_arms([root], bootstrap=0, contrasts=[("scale_matched", "conditioned")])
    effects = report.primary.effects("bbox")
    turned = effects["structure_at_conditioned_scale"]  # the table's row is scale_matched vs conditioned
    assert (turned.arm, turned.reference) == ("conditioned", "scale_matched")
    assert turned.differences == pytest.approx([1.9, 2.2, 1.9])
    assert turned.interval.low > 0 and turned.verdict == BETTER
    assert effects["interaction"].verdict == BETTER
    assert "**AP^b**: the factors interact (interaction +2.0 [" in text
    assert "read the simple effects, not the main effects" in text


NUM_IMAGES = 600
TOP1 = {"default": 0.45, "scale_matched": 0.65, "structured": 0.47, "conditioned": 0.67}  # each image's chance


def _cls_experiment(root, arms=tuple(TOP1)):
    """Pretraining runs of ``arms`` on 3 seeds with per-image top-1 data; returns (image, run) -> correct."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, size=NUM_IMAGES)
    correct = {}
    for arm in arms:
        for s in range(3):
            hit = rng.uniform(size=NUM_IMAGES) < TOP1[arm]
            correct[(arm, s)] = hit
            run = root / arm / f"seed{s}"
            path = write_classification_eval(
                str(run), 4, labels=labels, top1=np.where(hit, labels, (labels + 1) % 5), top5_hit=np.ones(NUM_IMAGES)
            )
            with open(run / "condinit_arm_report.json", "w") as f:
                json.dump({"run": {"arm": arm, "seed": s, "options": ARM_OPTIONS[arm]}}, f)
            record = {"kind": "cls", "stage": "pretrain", "iteration": 40, "epoch": 4, "top1": 100 * hit.mean()}
            record.update(top5=100.0, arm=arm, seed=s, per_image=os.path.relpath(path, str(run)))
            ResultsFile(str(run)).add(record)
    return correct


def test_with_per_image_data_an_effect_resamples_the_same_images_in_every_cell(tmp_path):
    num_images, bootstrap, seed = NUM_IMAGES, 200, 2
    correct = _cls_experiment(tmp_path / "pre")
    report, _ = compare_arms([str(tmp_path / "pre")], bootstrap=bootstrap, seed=seed)
    sr = report.stage("pretrain")
    row = sr.effects("top1")["interaction"]
    effect = next(e for e in EFFECTS if e.name == "interaction")
    draws = image_draws(np.random.default_rng(seed), num_images, bootstrap)
    per_seed = [sum(w * 100 * correct[(a, s)].mean() for a, w in effect.weights) for s in range(3)]
    reps = np.stack(
        [sum(w * resampled_mean(100.0 * correct[(a, s)], draws) for a, w in effect.weights) for s in range(3)]
    )
    assert row.differences == pytest.approx(per_seed)
    two = two_level_bootstrap(np.asarray(per_seed), reps, np.random.default_rng(0))
    # the t-scaled interval depends on the variances only, not on the seed resamples' generator; the verdict reads it
    # at the family's level (3 effects x top-1)
    assert (row.interval.low, row.interval.high) == pytest.approx((two.interval().low, two.interval().high))
    assert (row.adjusted.low, row.adjusted.high) == pytest.approx(
        (two.interval(1 - 0.05 / 3).low, two.interval(1 - 0.05 / 3).high)
    )
    assert row.interval.unit == "training runs and evaluation images"


def test_asking_more_takes_no_answer_away(tmp_path):
    # the arms against default of the four arms, with the contrasts' and the design's families and without: the same
    # adjusted p-values, intervals and verdicts
    _cls_experiment(tmp_path / "pre")
    sr = compare_arms([str(tmp_path / "pre")], bootstrap=200, seed=2)[0].stage("pretrain")
    assert list(sr.families) == ["against default", "between two arms", "structure × scale"]
    alone = [s for s in compare_stage(sr.stage, sr.arms, [], bootstrap=200, seed=2) if s.kind == "metric"]
    asked = sr.families["against default"]
    assert [(s.label, s.family, s.family_size) for s in alone] == [(s.label, s.family, s.family_size) for s in asked]
    assert [(s.p_adjusted, s.adjusted, s.verdict) for s in alone] == [
        (s.p_adjusted, s.adjusted, s.verdict) for s in asked
    ]
    assert {s.verdict for s in asked} == {"better", "no difference shown"}


def test_a_reversed_comparison_turns_every_field_it_carries(tmp_path):
    # conditioned vs scale_matched read backwards against scale_matched vs conditioned asked for (the same generators)
    _cls_experiment(tmp_path / "pre", arms=("default", "scale_matched", "conditioned"))
    forward = compare_arms([str(tmp_path / "pre")], bootstrap=200, seed=2)[0].stage("pretrain")
    backward = compare_arms(
        [str(tmp_path / "pre")], bootstrap=200, seed=2, contrasts=[("scale_matched", "conditioned")]
    )[0].stage("pretrain")
    turned = next(s for s in forward.comparisons if s.reference == "scale_matched").reversed()
    asked = next(s for s in backward.comparisons if s.reference == "conditioned")
    assert turned.percentile is not None and turned.improvement is not None and turned.interval.low < 0
    for f in dataclasses.fields(Comparison):
        mine, theirs = getattr(turned, f.name), getattr(asked, f.name)
        if f.name in ("values", "mean", "std", "n", "speedup"):  # the arm's own, which do not turn: left out
            assert mine in ({}, 0, None) or math.isnan(mine), f.name
        elif dataclasses.is_dataclass(mine):  # every interval, P(improvement)
            for g in dataclasses.fields(mine):
                assert getattr(mine, g.name) == pytest.approx(getattr(theirs, g.name), nan_ok=True), (f.name, g.name)
        else:
            assert mine == pytest.approx(theirs) if isinstance(mine, (float, list)) else mine == theirs, f.name


def test_arms_that_differ_in_more_than_their_factors_give_no_effects(tmp_path):
    options = {**ARM_OPTIONS, "structured": {**OPTIONS, "norm": "spectral"}}
    report, text = compare_arms([_experiment(tmp_path / "exp", SCALE_ONLY, options)], bootstrap=0)
    sr = report.primary
    assert sr.has_factorial and not any(s.reference == "factorial" for s in sr.stats)
    assert (
        "The four arms of the structure × scale design ran, but no effect is computed: scale_matched and structured "
        "matched different norms (frobenius, spectral)." in text
    )
    assert design_problem({"default": [{}], "conditioned": [ARM_OPTIONS["conditioned"]]}) == (
        "no finished scale_matched or structured run"
    )
    gains = {**ARM_OPTIONS, "scale_matched": {**OPTIONS, "gain_v": 0.5, "norm": "frobenius"}}
    assert design_problem({arm: [o] for arm, o in gains.items()}) == (
        "the conditioned and scale_matched runs have different gain_v (0.5, 1.0)"
    )
    output = {**ARM_OPTIONS, "conditioned": {**OPTIONS, "condition_output": True}}
    assert "also conditioned W_O" in design_problem({arm: [o] for arm, o in output.items()})
    assert design_problem({arm: [None] for arm in ARM_OPTIONS}) is None  # runs that recorded no options


def test_without_all_four_arms_there_is_no_section_and_one_seed_says_so(tmp_path):
    three = {arm: values for arm, values in SCALE_ONLY.items() if arm != "structured"}
    report, text = compare_arms([_experiment(tmp_path / "three", three)], bootstrap=0)
    assert not report.primary.has_factorial and "structure × scale" not in text
    one = {arm: values[:1] for arm, values in SCALE_ONLY.items()}
    report, text = compare_arms([_experiment(tmp_path / "one", one)], bootstrap=0)
    assert report.primary.effects("bbox")["scale"].verdict == TOO_FEW_SEEDS
    assert "**AP^b**: one seed common to the four cells, so no factor can be shown" in text


@pytest.mark.parametrize(
    "verdicts, said",
    [
        ((NO_DIFFERENCE, NO_DIFFERENCE, NO_DIFFERENCE), "neither"),
        ((BETTER, NO_DIFFERENCE, NO_DIFFERENCE), "structure"),
        ((NO_DIFFERENCE, WORSE, NO_DIFFERENCE), "scale"),
        ((BETTER, BETTER, NO_DIFFERENCE), "both"),
        ((BETTER, NO_DIFFERENCE, WORSE), "interaction"),
        ((TOO_FEW_SEEDS, TOO_FEW_SEEDS, TOO_FEW_SEEDS), TOO_FEW_SEEDS),
    ],
)
def test_which_factor_the_verdicts_show(verdicts, said):
    assert carried_by(*verdicts) == said


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool(name, argv, work, data_dir, expect=0):
    env = dict(os.environ, CONDINIT_DATA=str(data_dir), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = run_tool(os.path.join(ROOT, "tools", name), *argv, cwd=work, env=env, timeout=900)
    assert proc.returncode == expect, proc.stderr[-5000:]
    return proc


@pytest.mark.slow
@pytest.mark.e2e
def test_the_factorial_end_to_end_on_the_tiny_digits_demo_in_both_stages(tmp_path):
    """``--arm factorial`` in both stages of the digits demo at tiny size, two seeds: every arm of the design
    pretrains, each detector starts from its own arm's run, the report holds the design's section in both stages,
    and an extension with another gain is refused."""
    from coco_layout import small_digits_cls

    tiny = small_digits_cls(tmp_path / "digits-cls", {"train": 2, "val": 1})
    data = tmp_path / "condinit_data"
    pretrain = ["--config-file", os.path.join(ROOT, "configs/demo/pretrain_vit_tiny_digits.py"), "--arm", "factorial"]
    pretrain += ["--seeds", "0,1", "train.output_dir=out/pretrain", f"data.root={tiny}", "train.epochs=1"]
    pretrain += ["scheduler.warmup_epochs=0", "train.batch_size=8", "train.eval_batch_size=10", "train.workers=0"]
    _tool("pretrain_net.py", pretrain + ["--bootstrap", "0"], tmp_path, data)
    finetune = ["--config-file", os.path.join(ROOT, "configs/demo/mask_rcnn_vit_tiny_digits_finetune.py")]
    finetune += ["--arm", "factorial", "--seeds", "0,1", "--bootstrap", "0", "train.output_dir=out/finetune"]
    finetune += ["train.init_checkpoint='out/pretrain/{arm}/seed{seed}'", "train.max_iter=1", "train.eval_period=1"]
    finetune += ["condinit_analysis.period=0", "dataloader.train.total_batch_size=2"]
    _tool("train_net.py", finetune, tmp_path, data)
    out = tmp_path / "out"
    for arm in ("default", "scale_matched", "structured", "conditioned"):
        for seed in (0, 1):
            report = json.loads((out / "finetune" / arm / f"seed{seed}" / "condinit_arm_report.json").read_text())
            assert all(s["weights_from"].endswith(f"(pretrained with arm {arm})") for s in report["sites"])
            own = json.loads((out / "pretrain" / arm / f"seed{seed}" / "condinit_arm_report.json").read_text())
            assert own["run"]["arm"] == arm and own["run"]["seed"] == seed
    structured = json.loads((out / "pretrain" / "structured" / "seed0" / "condinit_arm_report.json").read_text())
    assert structured["run"]["options"] == {
        "gain_qk": 1.0,
        "gain_v": 1.0,
        "value_mode": "identity",
        "norm": "frobenius",
    }
    _tool(
        "compare_arms.py",
        ["out/pretrain", "out/finetune", "--output", "out/report", "--bootstrap", "50"],
        tmp_path,
        data,
    )
    text = (out / "report" / "report.md").read_text()
    assert text.count("### What the gain is made of: structure × scale") == 2
    assert "**top-1**: " in text and "**AP^b**: " in text and "**AP^m**: " in text
    assert unpadded(text).count("| structure × scale (interaction) |") >= 3 + 3  # first table and the sections
    assert (out / "report" / "interaction.png").is_file()
    # the design's options hold across an extension: another gain for more seeds is refused before any run
    proc = _tool(
        "pretrain_net.py",
        [*pretrain[:5], "2", *pretrain[6:], "condinit.options.conditioned.gain_v=0.5", "--dry-run"],
        tmp_path,
        data,
        expect=2,
    )
    assert "holds runs of another setup (condinit.options.conditioned.gain_v" in proc.stderr


def test_the_sentence_quotes_the_intervals_its_verdicts_read():
    from types import SimpleNamespace

    from condinit_det.report.factorial import reading
    from condinit_det.report.statistics import Interval

    def row(estimate, low, high, verdict=NO_DIFFERENCE):
        interval = Interval(estimate, low, high, "two-level t", "both", 3, level=1 - 0.05 / 3)
        return SimpleNamespace(mean_difference=estimate, adjusted=interval, verdict=verdict)

    rows = {"structure": row(-0.6, -4.2, 3.0), "scale": row(29.5, -1.8, 60.8), "interaction": row(-4.0, -35.5, 27.5)}
    rows.update({e.name: row(0.5, -1.0, 2.0) for e in EFFECTS if e.pair})
    text = reading("top-1", rows, 3)
    assert text == (
        "neither factor is shown to change it over 3 seeds (structure -0.6 [-4.2, +3.0], scale +29.5 [-1.8, +60.8], "
        "interaction -4.0 [-35.5, +27.5])."
    )
    # a simple effect shown where no main effect is: the sentence names it rather than saying "neither"
    rows["scale_at_random_structure"] = row(2.0, 1.9, 2.1, BETTER)
    text = reading("top-1", rows, 3)
    assert text.startswith("no main effect or interaction is shown over 3 seeds (structure -0.6 [-4.2, +3.0], scale")
    assert text.endswith("), only simple effects: scale at the random structure +2.0 [+1.9, +2.1].")
    unpaired = SimpleNamespace(mean_difference=float("nan"), adjusted=None, verdict=TOO_FEW_SEEDS)
    assert reading("top-1", dict.fromkeys(rows, unpaired), 0).startswith("no seed is common to the four cells")


def test_a_factorial_whose_controls_match_different_norms_is_refused_before_any_run(tmp_path):
    from condinit_det.engine import DetectionStage
    from condinit_det.launch.arguments import build_parser
    from condinit_det.launch.plan import plan_experiment
    from condinit_det.utils.errors import UsageError

    config = os.path.join(ROOT, "tests", "tiny_train_config.py")
    argv = ["--config-file", config, "--arm", "factorial", "--dry-run", f"train.output_dir={tmp_path}"]
    plan = plan_experiment(
        DetectionStage(),
        build_parser().parse_args(
            [*argv, "condinit.options.structured.norm=spectral", "condinit.options.scale_matched.norm=spectral"]
        ),
    )
    assert [spec.arm for spec in plan.runs] == ["default", "scale_matched", "structured", "conditioned"]
    with pytest.raises(
        UsageError, match=r"scale_matched and structured would match different norms \(frobenius, spectral\)"
    ):
        plan_experiment(
            DetectionStage(), build_parser().parse_args([*argv, "condinit.options.structured.norm=spectral"])
        )
    assert not os.listdir(tmp_path)
