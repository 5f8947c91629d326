"""XCiT's own detection neck (XCiTDeconvPyramid): strides, layers, FPN on top, and one training step
of the reproduction config (configs/COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py) at CPU size."""

import os
import re

import pytest
import torch
import torch.nn as nn
from detectron2.config import LazyConfig, instantiate
from detectron2.modeling import FPN
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage

from condinit_det.init import find_attention
from condinit_det.modeling.xcit import XCiT, XCiTDeconvPyramid

torch.set_num_threads(min(2, torch.get_num_threads()))

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "COCO", "mask_rcnn_xcit_s12_p16_3x_in1k.py"
)
TINY = dict(embed_dim=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))
NAMES = ["s4", "s8", "s16", "s32"]


def _neck(patch_size=16, **kw):
    torch.manual_seed(0)
    return XCiTDeconvPyramid(XCiT(patch_size=patch_size, **TINY), **kw).eval()


def test_strides_and_shapes_on_a_non_square_input_and_fpn_on_top():
    neck = _neck()
    spec = neck.output_shape()
    assert list(spec) == NAMES
    assert [spec[n].stride for n in NAMES] == [4, 8, 16, 32] and {spec[n].channels for n in NAMES} == {64}
    assert neck.size_divisibility == 32
    x = torch.randn(2, 3, 96, 160)
    with torch.no_grad():
        out = neck(x)
    assert {n: tuple(v.shape) for n, v in out.items()} == {
        "s4": (2, 64, 24, 40),
        "s8": (2, 64, 12, 20),
        "s16": (2, 64, 6, 10),
        "s32": (2, 64, 3, 5),
    }

    fpn = FPN(bottom_up=neck, in_features=NAMES, out_channels=32, top_block=LastLevelMaxPool()).eval()
    assert fpn.size_divisibility == 32
    assert {n: s.stride for n, s in fpn.output_shape().items()} == {"p2": 4, "p3": 8, "p4": 16, "p5": 32, "p6": 64}
    with torch.no_grad():
        feats = fpn(x)
    assert {n: tuple(v.shape[2:]) for n, v in feats.items()} == {
        "p2": (24, 40),
        "p3": (12, 20),
        "p4": (6, 10),
        "p5": (3, 5),
        "p6": (2, 3),
    }
    assert all(v.shape[:2] == (2, 32) for v in feats.values())


def test_layers_follow_xcit_detection_code():
    neck = _neck()
    assert [type(m) for m in neck.fpn1] == [nn.ConvTranspose2d, nn.BatchNorm2d, nn.GELU, nn.ConvTranspose2d]
    assert [type(m) for m in neck.fpn2] == [nn.ConvTranspose2d]
    for deconv in (neck.fpn1[0], neck.fpn1[3], neck.fpn2[0]):
        assert deconv.kernel_size == (2, 2) and deconv.stride == (2, 2) and deconv.bias is not None
        assert deconv.in_channels == deconv.out_channels == 64
    assert isinstance(neck.fpn3, nn.Identity)
    assert isinstance(neck.fpn4, nn.MaxPool2d) and neck.fpn4.kernel_size == 2 and neck.fpn4.stride == 2
    assert isinstance(_neck(sync_bn=True).fpn1[1], nn.SyncBatchNorm)
    # Shallowest listed block -> finest level: stride 16 is block 2 as is, stride 32 block 3 max-pooled.
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        blocks, out = neck.net(x), neck(x)
    assert list(blocks) == ["block0", "block1", "block2", "block3"]
    torch.testing.assert_close(out["s16"], blocks["block2"])
    torch.testing.assert_close(out["s32"], nn.functional.max_pool2d(blocks["block3"], 2))
    torch.testing.assert_close(out["s8"], neck.fpn2(blocks["block1"]))


def test_patch8_variant():
    neck = _neck(patch_size=8)
    assert [type(m) for m in neck.fpn1] == [nn.ConvTranspose2d] and isinstance(neck.fpn2, nn.Identity)
    assert neck.fpn3[0].kernel_size == 2 and neck.fpn4[0].kernel_size == 4
    with torch.no_grad():
        out = neck(torch.randn(1, 3, 64, 96))
    shapes = {n: tuple(v.shape[2:]) for n, v in out.items()}
    assert shapes == {"s4": (16, 24), "s8": (8, 12), "s16": (4, 6), "s32": (2, 3)}


def test_out_indices_and_neck_arguments_are_checked():
    trunk = XCiT(embed_dim=64, depth=4, num_heads=4, out_indices=(-1, 0))
    assert trunk.out_indices == (0, 3) and list(trunk.output_shape()) == ["block0", "block3"]
    assert list(XCiT(embed_dim=64, depth=2, num_heads=4).output_shape()) == ["last_feat"]  # default unchanged
    for bad in ((1, 4), (3, -1), ()):  # out of range, the same block twice, none
        expected = rf"out_indices must be distinct blocks in 0\.\.3 .*got {re.escape(str(bad))} for depth 4"
        with pytest.raises(ValueError, match=expected):
            XCiT(embed_dim=64, depth=4, num_heads=4, out_indices=bad)
    with pytest.raises(ValueError, match="needs an XCiT with four out_indices"):
        XCiTDeconvPyramid(XCiT(embed_dim=64, depth=4, num_heads=4))
    with pytest.raises(TypeError, match="takes an XCiT trunk"):
        XCiTDeconvPyramid(nn.Linear(2, 2))


def _tiny_config():
    cfg = LazyConfig.load(CONFIG)
    LazyConfig.apply_overrides(cfg, ["condinit.arm=conditioned"])
    net = cfg.model.backbone.bottom_up.net
    net.embed_dim, net.depth, net.num_heads, net.out_indices = 64, 4, 4, (0, 1, 2, 3)
    fpn_dim = 32
    cfg.model.backbone.out_channels = fpn_dim
    rpn = cfg.model.proposal_generator
    rpn.head.in_channels = fpn_dim
    rpn.batch_size_per_image, rpn.pre_nms_topk, rpn.post_nms_topk = 64, (200, 100), (50, 25)
    roi = cfg.model.roi_heads
    roi.num_classes, roi.batch_size_per_image = 2, 32
    roi.box_head.input_shape.channels = fpn_dim
    roi.box_head.fc_dims = [64, 64]
    roi.box_predictor.input_shape.channels = 64
    roi.mask_head.input_shape.channels = fpn_dim
    roi.mask_head.conv_dims = [16, 16]
    return cfg


def _instances(h, w, boxes, classes):
    inst = Instances((h, w))
    inst.gt_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32))
    inst.gt_classes = torch.tensor(classes)
    masks = torch.zeros(len(boxes), h, w, dtype=torch.bool)
    for m, (x0, y0, x1, y1) in zip(masks, boxes):
        m[int(y0) : int(y1), int(x0) : int(x1)] = True
    inst.gt_masks = BitMasks(masks)
    return inst


def test_reproduction_config_trains_one_step_at_cpu_size():
    cfg = _tiny_config()
    assert list(cfg.condinit.include) == ["backbone.bottom_up.net.*"]
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    assert isinstance(model.backbone.bottom_up, XCiTDeconvPyramid)
    sites = [s.name for s in find_attention(model)]
    assert sites == [f"backbone.bottom_up.net.blocks.{i}.attn" for i in range(4)]
    assert [s.name for s in model.condinit_report.sites] == sites and model.condinit_report.arm == "conditioned"
    assert isinstance(model.backbone.bottom_up.fpn1[1], nn.SyncBatchNorm)  # falls back to BatchNorm without DDP

    model.train()
    gen = torch.Generator().manual_seed(0)
    batch = [
        {
            "image": torch.randint(0, 256, (3, 96, 128), generator=gen).float(),
            "instances": _instances(96, 128, [[8, 10, 60, 70], [70, 20, 120, 90]], [0, 1]),
        },
        {
            "image": torch.randint(0, 256, (3, 128, 96), generator=gen).float(),
            "instances": _instances(128, 96, [[20, 30, 80, 110]], [1]),
        },
    ]
    with EventStorage(0):
        losses = model(batch)
    assert {"loss_cls", "loss_box_reg", "loss_mask", "loss_rpn_cls", "loss_rpn_loc"} <= set(losses)
    total = sum(losses.values())
    assert all(torch.isfinite(v) for v in losses.values()) and torch.isfinite(total)
    total.backward()
    bottom_up = model.backbone.bottom_up
    for param in (
        bottom_up.net.blocks[0].attn.qkv.weight,
        bottom_up.net.blocks[3].attn.qkv.weight,
        bottom_up.fpn1[0].weight,
        bottom_up.fpn2[0].weight,
    ):
        assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0
