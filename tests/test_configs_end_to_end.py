"""
Every config under configs/COCO, configs/yacs, configs/ImageNet and configs/demo trains and evaluates
end to end through tools/train_net.py or tools/pretrain_net.py, on CPU with AMP off.

Data: the COCO configs read a tiny dataset in the COCO 2017 layout (tests/coco_layout.py) as detectron2's
builtin ``coco_2017_train`` / ``coco_2017_val`` through DETECTRON2_DATASETS, which detectron2 reads when
``detectron2.data`` is imported, so the runs happen in a subprocess with that variable set. The ImageNet
configs read a tiny two-class ImageFolder; the demo configs their own embedded data, generated into a
temporary CONDINIT_DATA.

What is changed, and why (sizes only; models, heads, optimizers, augmentation kinds stay the config's):
- schedule: one training step, then the evaluation (ImageNet recipes: one epoch of one step), batch 1 (2 for
  ImageNet: mixup pairs images), no data-loader workers;
- COCO input sizes divided by 8 (LSJ 1024 -> 128 px, multi-scale 480-800 -> 60-100, test 800 -> 100, crops
  and ViTDet's square canvas alike): full-size inputs are far too slow on a CPU;
- Mask R-CNN proposal and RoI counts (RPN top-k, RoIs per image, detections per image) cut, and the test
  score threshold set to 0 so that an untrained model still produces detections and masks to evaluate;
- the ImageNet recipes keep their 224 px input (the fine-tuning configs expect that position grid) and
  read 2 classes of one training and one evaluation image each;
- ``mask_rcnn_vitdet_b_100ep_pretrained.py`` downloads MAE weights: it loads a local file in the layout of
  that release instead (a timm ViT-B state dict under "model", loaded with matching_heuristics).
Each ``*_in1k`` config is fine-tuned from the tiny run of its ImageNet recipe, found through its own
``train.init_checkpoint`` (``output/imagenet/<recipe>/{arm}/seed{seed}``), as a user's two commands would.
The demo configs run with their own settings except the schedule (one step; the demo pretraining: one epoch of one
batch) and, for the demo pretraining on shapes-cls, the number of images (64 + 16 of the same generator).

The two pairs of demo configs (SHARED_RUNS) are not trained here: the docs' demo pair and ``make demo-digits``, run at
tiny size once per test run for their own tests (conftest.py fixtures), train each of them with every arm; this test
reads their conditioned runs. The other runs share two processes (tests/run_tools.py), each on its part of the plan,
so that the imports are paid twice rather than once per config, and both cores work.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TRAIN_NET = str(REPO / "tools" / "train_net.py")
PRETRAIN_NET = str(REPO / "tools" / "pretrain_net.py")
RUN_TOOLS = str(REPO / "tests" / "run_tools.py")

SCALE = 8  # COCO input sizes are divided by this
ARM = "conditioned"
# A few configs run another arm, so that every arm meets a real-size model somewhere.
OTHER_ARM = {
    "COCO/mask_rcnn_swin_t_3x.py": "mimetic",
    "COCO/detr_vitdet_b.py": "mimetic",
    "ImageNet/xcit_m24_p16_400ep.py": "mimetic",
    "demo/mask_rcnn_xcit_tiny.py": "mimetic",
    "ImageNet/deit_b_300ep.py": "default",
}
# ImageNet recipe whose tiny run each fine-tuning config starts from.
IN1K_SOURCE = {
    "COCO/mask_rcnn_vitdet_b_100ep_in1k.py": "ImageNet/vit_b16_deit_300ep.py",
    "COCO/mask_rcnn_swin_b_3x_in1k.py": "ImageNet/swin_b_300ep.py",
    "COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py": "ImageNet/xcit_s12_p16_400ep.py",
}
MAE_LIKE = "mae_layout_vit_base.pth"
MASK_RCNN_LOSSES = {"loss_cls", "loss_box_reg", "loss_mask", "loss_rpn_cls", "loss_rpn_loc"}
DETR_LOSSES = {"loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice"}


def all_configs():
    found = []
    for folder in ("COCO", "yacs", "ImageNet", "demo"):
        found += [
            p.relative_to(CONFIGS).as_posix()
            for p in sorted((CONFIGS / folder).iterdir())
            if p.suffix in (".py", ".yaml")
        ]
    return found


def _arm(name):
    return OTHER_ARM.get(name, ARM)


def _fmt(value):
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def _small(v):
    return max(32, int(round(v / SCALE)))


def _shrink_augmentation(node, key):
    """Overrides that divide every size of one augmentation node (recursing into lists) by SCALE."""
    name = getattr(node.get("_target_"), "__name__", str(node.get("_target_")))
    out = []
    if name == "ResizeScale":
        out += [f"{key}.target_height={_small(node.target_height)}", f"{key}.target_width={_small(node.target_width)}"]
    elif name in ("FixedSizeCrop", "RandomCrop"):
        out.append(f"{key}.crop_size={_fmt([_small(v) for v in node.crop_size])}")
    elif name == "ResizeShortestEdge":
        short = node.short_edge_length
        short = _small(short) if isinstance(short, int) else [_small(v) for v in short]
        out.append(f"{key}.short_edge_length={_fmt(short)}")
        if node.get("max_size") is not None:
            out.append(f"{key}.max_size={_small(node.max_size)}")
    elif name == "RandomApply":
        out += _shrink_augmentation(node.tfm_or_aug, f"{key}.tfm_or_aug")
    elif name == "AugmentationList":
        for i, aug in enumerate(node.augs):
            out += _shrink_augmentation(aug, f"{key}.augs.{i}")
    return out


def lazy_coco_overrides(name):
    """Key=value overrides that size a lazy COCO config for a CPU (module docstring)."""
    from detectron2.config import LazyConfig

    cfg = LazyConfig.load(str(CONFIGS / name))
    out = [
        "train.device=cpu",
        "train.amp.enabled=False",
        "train.max_iter=1",
        "train.eval_period=1",
        "train.log_period=1",
        "dataloader.train.total_batch_size=1",
        "dataloader.train.num_workers=0",
        "dataloader.test.num_workers=0",
    ]
    for split in ("train", "test"):
        for i, aug in enumerate(cfg.dataloader[split].mapper.augmentations):
            out += _shrink_augmentation(aug, f"dataloader.{split}.mapper.augmentations.{i}")
    backbone = cfg.model.backbone
    if backbone.get("square_pad"):
        out.append(f"model.backbone.square_pad={_small(backbone.square_pad)}")
    if "proposal_generator" in cfg.model:
        out += [
            "model.proposal_generator.pre_nms_topk=[200,100]",
            "model.proposal_generator.post_nms_topk=[50,20]",
            "model.roi_heads.batch_size_per_image=32",
            "model.roi_heads.box_predictor.test_score_thresh=0.0",
            "model.roi_heads.box_predictor.test_topk_per_image=10",
        ]
    if name == "COCO/mask_rcnn_vitdet_b_100ep_pretrained.py":
        out.append(f"train.init_checkpoint='{MAE_LIKE}?matching_heuristics=True'")
    if "condinit_analysis" in cfg:  # minutes per measurement at real width on a CPU; the hook is tested elsewhere
        out.append("condinit_analysis.period=0")
    return out


YACS_COCO_OVERRIDES = [
    "MODEL.DEVICE",
    "cpu",
    "SOLVER.IMS_PER_BATCH",
    "1",
    "SOLVER.MAX_ITER",
    "1",
    "SOLVER.STEPS",
    "()",
    "SOLVER.CHECKPOINT_PERIOD",
    "1",
    "TEST.EVAL_PERIOD",
    "1",
    "DATALOADER.NUM_WORKERS",
    "0",
    "INPUT.MIN_SIZE_TRAIN",
    "(60,64,68,72,76,80,84,88,92,96,100)",
    "INPUT.MAX_SIZE_TRAIN",
    "167",
    "INPUT.MIN_SIZE_TEST",
    "100",
    "INPUT.MAX_SIZE_TEST",
    "167",
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN",
    "200",
    "MODEL.RPN.PRE_NMS_TOPK_TEST",
    "100",
    "MODEL.RPN.POST_NMS_TOPK_TRAIN",
    "50",
    "MODEL.RPN.POST_NMS_TOPK_TEST",
    "20",
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE",
    "32",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST",
    "0.0",
    "TEST.DETECTIONS_PER_IMAGE",
    "10",
]
# An untrained model keeps 100 detections of every image: their masks make the evaluation slow.
YACS_DEMO_OVERRIDES = [
    "SOLVER.MAX_ITER",
    "1",
    "SOLVER.CHECKPOINT_PERIOD",
    "1",
    "TEST.EVAL_PERIOD",
    "1",
    "TEST.DETECTIONS_PER_IMAGE",
    "10",
]
DEMO_OVERRIDES = ["train.max_iter=1", "train.eval_period=1", "train.log_period=1"]


def imagenet_overrides(image_folder):
    return [
        f"data.root={image_folder}",
        "data.num_classes=2",
        "train.device=cpu",
        "train.amp=False",
        "train.epochs=1",
        "train.batch_size=2",
        "train.workers=0",
        "train.eval_batch_size=2",
        "train.log_period=1",
    ]


# Configs whose conditioned run the docs' demo pair or `make demo-digits` (at tiny size) makes anyway, in the same test
# run (conftest.py): read from there, not trained again. config -> (fixture, stage folder)
SHARED_RUNS = {
    "demo/pretrain_vit_tiny.py": ("documented_demo_pair_run", "pretrain"),
    "demo/mask_rcnn_vit_tiny_finetune.py": ("documented_demo_pair_run", "finetune"),
    "demo/pretrain_vit_tiny_digits.py": ("demo_digits_run", "pretrain"),
    "demo/mask_rcnn_vit_tiny_digits_finetune.py": ("demo_digits_run", "finetune"),
}
# What a config needs run before it.
NEEDS = {
    **IN1K_SOURCE,
    "demo/mask_rcnn_vit_tiny_finetune.py": "demo/pretrain_vit_tiny.py",
    "demo/mask_rcnn_vit_tiny_digits_finetune.py": "demo/pretrain_vit_tiny_digits.py",
}


def build_plan(work, image_folder, only=None, small_data=None):
    """The steps of tests/run_tools.py, pretraining before the fine-tuning that reads it; ``only``: these
    configs and what they need (default: every config); ``small_data``: {embedded data root: a small folder in its
    layout} that replaces it in the demo pretraining configs."""
    if only is not None:
        only = set(only) | {NEEDS[n] for n in only if n in NEEDS}
    steps = {}
    work = str(work)

    def add(name, tool, argv, drop=None, keep_final=False):
        steps[name] = {
            "name": name,
            "tool": tool,
            "cwd": work,
            "drop_checkpoints": drop,
            "keep_final": keep_final,
            "argv": ["--config-file", str(CONFIGS / name), "--arm", _arm(name), *argv],
        }

    for name in all_configs():
        if name in SHARED_RUNS or only is not None and name not in only:
            continue
        folder, stem = name.split("/")[0], Path(name).stem
        if folder == "ImageNet":
            keep = name in IN1K_SOURCE.values()  # its fine-tuning config reads model_final
            add(name, PRETRAIN_NET, imagenet_overrides(image_folder), drop=f"output/imagenet/{stem}", keep_final=keep)
        elif folder == "demo" and stem.startswith("pretrain_"):
            out = []
            if small_data and _data_root(name) in small_data:
                out.append(f"data.root={small_data[_data_root(name)]}")
            add(name, PRETRAIN_NET, ["train.epochs=1", *out])
        elif folder == "demo":  # tiny: the test reads their weights
            add(name, TRAIN_NET, DEMO_OVERRIDES)
        elif folder == "yacs":
            over = YACS_COCO_OVERRIDES if "coco_2017_train" in (CONFIGS / name).read_text() else YACS_DEMO_OVERRIDES
            add(name, TRAIN_NET, over, drop=f"output/yacs/{stem}")  # its own folder: the two run in parallel
        else:
            add(name, TRAIN_NET, lazy_coco_overrides(name), drop=f"output/COCO/{stem}")
    first = [n for n in steps if n.startswith("ImageNet/") or n.startswith("demo/pretrain_")]
    return [steps[n] for n in first] + [steps[n] for n in steps if n not in first]


WORKERS = 2  # run_tools.py processes that share the plan
# Images of the shapes-cls dataset the demo pretraining configs read here (the embedded one holds 5000 + 1000): one
# batch of the configs' 64 to train on.
SMALL_SHAPES_CLS = {"num_train": 64, "num_val": 16}


def _data_root(name):
    from detectron2.config import LazyConfig

    return LazyConfig.load(str(CONFIGS / name)).data.root


def split_plan(plan, parts):
    """``plan`` cut into ``parts`` lists of about equal length; a step stays after what it needs, in the same list."""
    needed_by = {NEEDS[s["name"]]: s["name"] for s in plan if NEEDS.get(s["name"]) in {t["name"] for t in plan}}
    by_name = {s["name"]: s for s in plan}
    chains = [
        [s] + ([by_name[needed_by[s["name"]]]] if s["name"] in needed_by else [])
        for s in plan
        if s["name"] not in needed_by.values()
    ]
    out = [[] for _ in range(parts)]
    for chain in sorted(chains, key=len, reverse=True):  # the longest first, each into the shortest list
        min(out, key=len).extend(chain)
    return [p for p in out if p]


def write_mae_like_checkpoint(path):
    """A ViT-B/16 encoder in the layout of detectron2's MAE download (timm key names, no head, under "model")."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
    torch.save({"model": model.state_dict()}, path)


def _output_dir(name):
    """Where the config writes (its own train.output_dir / OUTPUT_DIR, relative to the working folder)."""
    if name.startswith("ImageNet/"):
        return f"output/imagenet/{Path(name).stem}"
    if name == "demo/pretrain_xcit_tiny.py":
        return "output/demo_pretrain_xcit"
    if name.startswith("yacs/"):
        return f"output/yacs/{Path(name).stem}"
    return f"output/{Path(name).parent}/{Path(name).stem}"


# A run of a base-size config writes about 3 GB of checkpoints (model_final with its optimizer state, its safetensors,
# model_best) that the plan deletes after its step: on a RAM-backed folder, where one is large enough, writing them
# takes a third of the CPU time that a disk's page cache and fsync take.
RAM_FOLDER, RAM_FOLDER_FREE = "/dev/shm", 16 * 2**30


def _work_folder(tmp_path_factory):
    if os.path.isdir(RAM_FOLDER) and shutil.disk_usage(RAM_FOLDER).free >= RAM_FOLDER_FREE:
        return Path(tempfile.mkdtemp(prefix="condinit_e2e_", dir=RAM_FOLDER)), True
    return tmp_path_factory.mktemp("e2e"), False


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory, coco_layout_root, image_folder_root):
    """Run the plan of the selected configs once; yields (working folder, status per config, combined output)."""
    work, in_ram = _work_folder(tmp_path_factory)
    try:
        yield _run_plan(request, tmp_path_factory, coco_layout_root, image_folder_root, work)
    finally:
        if in_ram:
            shutil.rmtree(work, ignore_errors=True)


def _run_plan(request, tmp_path_factory, coco_layout_root, image_folder_root, work):
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_config_trains_and_evaluates"
    } - set(SHARED_RUNS)
    from condinit_det.data.classification import generate_classification_dataset

    small_data = {"embedded:shapes-cls": generate_classification_dataset(work / "shapes-cls-small", **SMALL_SHAPES_CLS)}
    plan = build_plan(work, image_folder_root, only=selected, small_data=small_data)
    if any(step["name"] == "COCO/mask_rcnn_vitdet_b_100ep_pretrained.py" for step in plan):
        write_mae_like_checkpoint(work / MAE_LIKE)
    env = dict(
        os.environ,
        DETECTRON2_DATASETS=str(coco_layout_root),
        CONDINIT_DATA=str(tmp_path_factory.mktemp("condinit_data")),
        PYTHONWARNINGS="ignore",
    )
    env.pop("IMAGENET_ROOT", None)
    # Two processes, each on its share of the plan (and, under pytest-xdist, on one thread: conftest.py), finish in
    # about half the wall time on two cores.
    procs = []
    for k, part in enumerate(split_plan(plan, WORKERS)):
        (work / f"plan{k}.json").write_text(json.dumps(part, indent=1))
        log = open(work / f"output{k}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, RUN_TOOLS, str(work / f"plan{k}.json"), str(work / f"status{k}.json")],
                    cwd=work,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    for proc, log in procs:
        try:
            proc.wait(timeout=3600)
        finally:
            proc.kill()
            log.close()
    status, output = {}, ""
    for k in range(len(procs)):
        if (work / f"status{k}.json").exists():
            status.update(json.loads((work / f"status{k}.json").read_text()))
        output += (work / f"output{k}.log").read_text()
    return work, status, output


def _step_output(log, name):
    marker = f"=== step {name}\n"
    start = log.find(marker)
    if start < 0:
        return "(the step did not start)"
    end = log.find("=== step ", log.find(f"=== step {name} done", start) + 1)
    return log[start : end if end > 0 else None][-6000:]


def _results(folder):
    """Every record of every results.json under ``folder``."""
    records = []
    for path in sorted(Path(folder).rglob("results.json")):
        records += json.loads(path.read_text())["records"]
    return records


def test_every_config_is_in_the_plan(tmp_path):
    names = [s["name"] for s in build_plan(tmp_path, tmp_path)]
    assert sorted(names + list(SHARED_RUNS)) == sorted(all_configs()) and len(names) == len(set(names))
    assert not set(names) & set(SHARED_RUNS)  # read from the demo runs, not trained again
    assert len([n for n in names if n.startswith("COCO/")]) >= 10 and any(n.endswith(".yaml") for n in names)
    for fine_tune, recipe in IN1K_SOURCE.items():
        assert names.index(recipe) < names.index(fine_tune)
    assert set(IN1K_SOURCE) == {n for n in names if n.endswith("_in1k.py")}
    # A selection runs what it needs first.
    only = [s["name"] for s in build_plan(tmp_path, tmp_path, only=["COCO/mask_rcnn_swin_b_3x_in1k.py"])]
    assert only == ["ImageNet/swin_b_300ep.py", "COCO/mask_rcnn_swin_b_3x_in1k.py"]


def test_the_plan_splits_with_each_step_after_what_it_needs(tmp_path):
    plan = build_plan(tmp_path, tmp_path)
    parts = split_plan(plan, 2)
    names = [[s["name"] for s in part] for part in parts]
    assert sorted(n for part in names for n in part) == sorted(s["name"] for s in plan)
    assert abs(len(names[0]) - len(names[1])) <= 2
    for fine_tune, recipe in IN1K_SOURCE.items():
        part = next(p for p in names if fine_tune in p)
        assert recipe in part and part.index(recipe) < part.index(fine_tune)
    assert split_plan(plan[:1], 2) == [plan[:1]]


def test_coco_sizes_are_divided(tmp_path):
    over = dict(o.split("=", 1) for o in lazy_coco_overrides("COCO/mask_rcnn_vitdet_b_100ep.py"))
    assert over["dataloader.train.mapper.augmentations.1.target_height"] == "128"
    assert over["dataloader.train.mapper.augmentations.2.crop_size"] == "[128,128]"
    assert over["model.backbone.square_pad"] == "128"
    over = dict(o.split("=", 1) for o in lazy_coco_overrides("COCO/mask_rcnn_swin_t_3x.py"))
    assert over["dataloader.train.mapper.augmentations.1.tfm_or_aug.augs.1.crop_size"] == "[48,75]"
    assert over["dataloader.train.mapper.augmentations.2.short_edge_length"] == _fmt(list(range(60, 101, 4)))
    assert over["dataloader.test.mapper.augmentations.0.max_size"] == "167"


def _shared_run(request, name):
    """The folder of ``name``'s conditioned run in the demo run that trains it (SHARED_RUNS)."""
    fixture, stage = SHARED_RUNS[name]
    made = request.getfixturevalue(fixture)
    base = Path(made[stage]) if isinstance(made, dict) else made / "output" / "demo_digits" / stage
    return base / ARM / "seed0"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", all_configs())
def test_config_trains_and_evaluates(request, name):
    if name in SHARED_RUNS:  # the demo run that made it asserted its commands' exit status
        folder, checkpoints = _shared_run(request, name), []
    else:
        work, status, log = request.getfixturevalue("runs")
        assert name in status, f"{name} did not run:\n{log[-3000:]}"
        assert status[name]["ok"], f"{name} failed ({status[name]}):\n{_step_output(log, name)}"
        folder, checkpoints = work / _output_dir(name), status[name].get("checkpoints") or []
    records = _results(folder)
    arm = _arm(name)
    assert records and all(r["arm"] == arm for r in records if r["kind"] != "environment"), records
    assert [r["iteration"] for r in records if r["kind"] == "environment"] == [0], records
    if name.startswith("ImageNet/") or Path(name).stem.startswith("pretrain_"):  # tools/pretrain_net.py
        final = [r for r in records if r["kind"] == "cls" and r["epoch"] == 1]
        assert final and 0.0 <= final[-1]["top1"] <= 100.0, records
        assert list(folder.rglob("model_final.pth")) or checkpoints, "no model_final.pth written"
        return
    final = [r for r in records if r["kind"] == "ap" and r["iteration"] == 1]
    assert final, records
    # The training step logged every loss of the detector, finite.
    logged = [
        json.loads(line)
        for path in folder.rglob("metrics.json")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    step = next((m for m in logged if "total_loss" in m), {})
    losses = DETR_LOSSES if "detr" in name else MASK_RCNN_LOSSES
    assert losses <= set(step) and all(math.isfinite(step[k]) for k in losses | {"total_loss"}), logged
    if name.startswith("demo/"):  # the step left finite weights
        (weights,) = folder.rglob("model_final.pth")
        state = torch.load(weights, map_location="cpu", weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    else:
        assert any(os.path.basename(c) == "model_final.pth" for c in checkpoints), checkpoints
    if name.startswith("COCO/") and "detr" not in name:
        # Evaluated with detections (score threshold 0): numbers, not "no predictions".
        assert final[-1]["bbox"]["AP"] is not None and final[-1]["segm"]["AP"] is not None, final[-1]
    if name in NEEDS:  # a fine-tuning config: every site from the pretraining run of its own arm
        report = next(folder.rglob("condinit_arm_report.json"))
        sites = json.loads(report.read_text())["sites"]
        assert sites and all(s["weights_from"].endswith(f"(pretrained with arm {arm})") for s in sites), sites


def test_coco_layout_reads_as_coco_2017(coco_layout_root):
    """The fixture's files are what detectron2's builtin coco_2017_* expect: its metadata accepts the
    categories, polygons and crowd RLE decode, and empty images stay in the evaluation split."""
    import numpy as np
    import pycocotools.mask as mask_util
    from coco_layout import COCO_CATEGORY_OF_SHAPE
    from detectron2.data import MetadataCatalog
    from detectron2.data.datasets import load_coco_json
    from detectron2.data.datasets.builtin_meta import _get_builtin_metadata

    meta = _get_builtin_metadata("coco")
    for split in ("train", "val"):
        coco_dir = coco_layout_root / "coco"
        raw = json.loads((coco_dir / "annotations" / f"instances_{split}2017.json").read_text())
        assert [c["id"] for c in raw["categories"]] == sorted(meta["thing_dataset_id_to_contiguous_id"])
        assert [c["name"] for c in raw["categories"]] == meta["thing_classes"]
        # A name the builtin registration does not know would be refused here.
        dicts = load_coco_json(
            str(coco_dir / "annotations" / f"instances_{split}2017.json"),
            str(coco_dir / f"{split}2017"),
            f"coco_2017_{split}",
        )
        assert MetadataCatalog.get(f"coco_2017_{split}").thing_classes == meta["thing_classes"]
        assert len(dicts) == len(raw["images"]) and all(os.path.exists(d["file_name"]) for d in dicts)
        assert any(not d["annotations"] for d in dicts)  # an empty image
        annos = [a for d in dicts for a in d["annotations"]]
        crowd = [a for a in annos if a["iscrowd"]]
        polys = [a for a in annos if not a["iscrowd"]]
        assert crowd and polys
        assert all(isinstance(a["segmentation"], list) and all(len(p) >= 6 for p in a["segmentation"]) for a in polys)
        contiguous = {meta["thing_dataset_id_to_contiguous_id"][i] for i in COCO_CATEGORY_OF_SHAPE.values()}
        assert {a["category_id"] for a in annos} <= contiguous
        # Crowd regions in COCO's uncompressed RLE (run lengths), which detectron2 compresses on loading.
        assert all(isinstance(a["segmentation"]["counts"], list) for a in raw["annotations"] if a["iscrowd"])
        for a in crowd:  # decodes to a mask whose box matches the record
            mask = mask_util.decode(a["segmentation"])
            ys, xs = np.nonzero(mask)
            assert mask.sum() > 0 and a["bbox"][0] == xs.min() and a["bbox"][1] == ys.min()
        image = dicts[0]
        assert (image["height"], image["width"]) == (96, 128)


def test_run_tools_runs_every_step_and_records_failures(tmp_path):
    """The driver runs each command line as __main__ in its folder, goes on after a failure, deletes the
    named checkpoints after recording them (but model_final.* with keep_final), and exits 1 when a step failed."""
    tool = tmp_path / "tool.py"
    tool.write_text(
        "import os, sys\n"
        "if __name__ == '__main__':\n"
        "    what = sys.argv[1]\n"
        "    os.makedirs('out/run', exist_ok=True)\n"
        "    for name in ('model_final.pth', 'model_final.safetensors', 'checkpoint_epoch0001.pth'):\n"
        "        open(os.path.join('out/run', name), 'w').write(what)\n"
        "    if what == 'bad-input':\n"
        "        sys.exit(2)\n"
        "    if what == 'crash':\n"
        "        raise RuntimeError('boom')\n"
    )
    plan = [
        {"name": n, "tool": str(tool), "argv": [n], "cwd": str(tmp_path / n), "drop_checkpoints": "out"}
        for n in ("ok", "bad-input", "crash", "kept")
    ]
    plan[-1]["keep_final"] = True
    for step in plan:
        os.makedirs(step["cwd"])
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run(
        [sys.executable, RUN_TOOLS, str(tmp_path / "plan.json"), str(tmp_path / "status.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    written = ["out/run/checkpoint_epoch0001.pth", "out/run/model_final.pth", "out/run/model_final.safetensors"]
    assert status["ok"]["ok"] and status["ok"]["checkpoints"] == written
    assert not status["bad-input"]["ok"] and status["bad-input"]["exit"] == 2
    assert not status["crash"]["ok"] and "RuntimeError: boom" in status["crash"]["error"]
    assert not any(list((tmp_path / n / "out" / "run").iterdir()) for n in ("ok", "bad-input", "crash"))
    assert status["kept"]["checkpoints"] == written
    kept = sorted(p.name for p in (tmp_path / "kept" / "out" / "run").iterdir())
    assert kept == ["model_final.pth", "model_final.safetensors"]
    assert proc.stdout.count("=== step ") == 8  # a start and an end line per step


def test_padded_simple_pyramid_pads_multiscale_images_for_xcit():
    """Images whose sides are not multiples of the patch size are padded to the pyramid's coarsest stride
    (detectron2's own SimpleFeaturePyramid leaves them as they are without a square canvas)."""
    from detectron2.modeling import SimpleFeaturePyramid
    from detectron2.structures import ImageList

    from condinit_det.modeling.backbones import PaddedSimpleFeaturePyramid
    from condinit_det.modeling.xcit import XCiT

    torch.manual_seed(0)
    kwargs = dict(in_feature="last_feat", out_channels=8, scale_factors=(2.0, 1.0, 0.5), norm="LN", square_pad=0)
    net = XCiT(patch_size=16, embed_dim=32, depth=1, num_heads=2, out_feature="last_feat")
    padded = PaddedSimpleFeaturePyramid(net=net, **kwargs)
    images = [torch.rand(3, 80, 107), torch.rand(3, 64, 90)]
    batch = ImageList.from_tensors(images, padded.size_divisibility, padding_constraints=padded.padding_constraints)
    assert padded.size_divisibility == 32 and tuple(batch.tensor.shape[-2:]) == (96, 128)
    assert batch.image_sizes == [(80, 107), (64, 90)]
    out = padded(batch.tensor)
    assert tuple(out["p4"].shape[-2:]) == (96 // 16, 128 // 16) and tuple(out["p5"].shape[-2:]) == (3, 4)
    plain = SimpleFeaturePyramid(net=net, **kwargs)
    unpadded = ImageList.from_tensors(images, plain.size_divisibility, padding_constraints=plain.padding_constraints)
    with pytest.raises(ValueError, match="multiples of patch_size"):
        plain(unpadded.tensor)
