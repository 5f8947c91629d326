import copy
from functools import partial

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import COCOEvaluator
from detectron2.modeling import META_ARCH_REGISTRY, ViT
from detectron2.structures import BitMasks, Boxes, Instances, pairwise_iou
from torch import nn

from condinit_det.modeling.detr import (
    DETRInstanceSeg,
    HungarianMatcher,
    MaskHead,
    PositionEmbeddingSine,
    SetCriterion,
    Transformer,
)
from condinit_det.modeling.detr.criterion import num_boxes_for_normalization as num_boxes

NUM_CLASSES = 3


def tiny_detr(num_queries=6, mask=True, mask_train="joint", seed=0, reference_points=False, query_groups=1):
    torch.manual_seed(seed)
    backbone = ViT(
        img_size=64,
        patch_size=8,
        embed_dim=32,
        depth=1,
        num_heads=2,
        mlp_ratio=2,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        pretrain_img_size=64,
        pretrain_use_cls_token=False,
        out_feature="last_feat",
    )
    return DETRInstanceSeg(
        backbone=backbone,
        in_feature="last_feat",
        transformer=Transformer(
            d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=64, dropout=0.0
        ),
        num_classes=NUM_CLASSES,
        num_queries=num_queries,
        criterion=SetCriterion(num_classes=NUM_CLASSES, matcher=HungarianMatcher()),
        pixel_mean=[128.0, 128.0, 128.0],
        pixel_std=[64.0, 64.0, 64.0],
        mask_head=MaskHead(hidden_dim=32, num_heads=2, num_upsample=2, conv_dims=[16, 16, 8, 8]) if mask else None,
        mask_train=mask_train,
        reference_points=reference_points,
        query_groups=query_groups,
    )


def make_input(boxes, classes, size=(64, 64), out_size=None, seed=0):
    """An image with a flat-coloured rectangle per box (colour from the class) and its annotations."""
    h, w = size
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(3, h, w, generator=g) * 40
    masks = torch.zeros(len(boxes), h, w, dtype=torch.bool)
    colors = torch.tensor([[250.0, 40, 40], [40, 250, 40], [40, 40, 250]])
    for i, ((x0, y0, x1, y1), c) in enumerate(zip(boxes, classes)):
        img[:, y0:y1, x0:x1] = colors[c][:, None, None]
        masks[i, y0:y1, x0:x1] = True
    inst = Instances((h, w))
    inst.gt_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
    inst.gt_classes = torch.tensor(classes, dtype=torch.int64)
    inst.gt_masks = BitMasks(masks)
    oh, ow = out_size or size
    return {"image": img, "instances": inst, "height": oh, "width": ow}


def test_registered_meta_arch():
    assert META_ARCH_REGISTRY.get("DETRInstanceSeg") is DETRInstanceSeg


@pytest.mark.parametrize("num_objects", [0, 1, 4])
def test_training_losses(num_objects):
    model = tiny_detr().train()
    boxes = [(2, 2, 20, 20), (30, 5, 60, 25), (5, 35, 25, 60), (35, 35, 62, 62)][:num_objects]
    batch = [
        make_input(boxes, [i % 3 for i in range(num_objects)]),
        make_input([(10, 10, 40, 30)], [2], size=(48, 56), seed=1),
    ]
    losses = model(batch)
    expected = {
        "loss_ce",
        "loss_bbox",
        "loss_giou",
        "loss_ce_0",
        "loss_bbox_0",
        "loss_giou_0",
        "loss_mask",
        "loss_dice",
    }
    assert set(losses) == expected
    assert all(torch.isfinite(v) and v.dim() == 0 for v in losses.values())
    assert all(v.item() > 0 for k, v in losses.items())


def test_gradients_reach_every_module():
    model = tiny_detr().train()
    batch = [make_input([(2, 2, 20, 20), (30, 30, 60, 60)], [0, 1]), make_input([], [], seed=3)]
    sum(model(batch).values()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    # The first decoder layer's self-attention acts on the all-zero decoder input: its value path
    # is zero and (with zero-initialized biases) so is its output, hence no gradient reaches its
    # weights or the following LayerNorm scale at initialization. Everything else must get some.
    assert missing == [
        "transformer.decoder.layers.0.self_attn.in_proj_weight",
        "transformer.decoder.layers.0.self_attn.out_proj.weight",
        "transformer.decoder.layers.0.norm1.weight",
    ]
    for prefix in (
        "class_head",
        "box_head",
        "mask_head.attention",
        "mask_head.predictor",
        "input_proj",
        "transformer.encoder",
        "transformer.decoder",
        "query_embed",
        "backbone",
    ):
        assert any(n.startswith(prefix) for n, _ in model.named_parameters())


def test_reference_points_anchor_queries_and_boxes():
    model = tiny_detr(num_queries=5, reference_points=True).train()
    assert model.query_embed is None and model.reference_points.weight.shape == (5, 2)
    ref = model.reference_points.weight.sigmoid()
    assert ((ref > 0) & (ref < 1)).all() and ref.std() > 0.1  # spread over the image
    # With a zero box head every query predicts a box centred on its point, half the image wide.
    last = model.box_head.layers[-1]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)
    batch = [make_input([(2, 2, 20, 20)], [0]), make_input([(30, 30, 60, 60)], [1], seed=1)]
    images, pad = model.preprocess_image(batch)
    with torch.no_grad():
        boxes = model._detect(images, pad)["boxes"]  # [layers, B, Q, 4] cxcywh
    assert torch.allclose(boxes[..., :2], ref.expand_as(boxes[..., :2]), atol=1e-6)
    assert torch.allclose(boxes[..., 2:], torch.full_like(boxes[..., 2:], 0.5))
    # The points are learned: the box loss reaches them, and every query starts somewhere else.
    nn.init.normal_(last.weight, std=0.01)
    sum(model(batch).values()).backward()
    assert model.reference_points.weight.grad.abs().sum() > 0
    assert not any(n.startswith("query_embed") for n, _ in model.named_parameters())


@pytest.mark.parametrize("reference_points", [False, True])
def test_query_groups_are_independent_and_training_only(reference_points):
    model = tiny_detr(num_queries=4, query_groups=3, reference_points=reference_points).eval()
    embed = model.reference_points if reference_points else model.query_embed
    assert embed.weight.shape[0] == 12
    batch = [make_input([(2, 2, 20, 20), (30, 30, 60, 60)], [0, 1]), make_input([(5, 30, 25, 60)], [2], seed=1)]
    images, pad = model.preprocess_image(batch)
    with torch.no_grad():
        out = model._detect(images, pad, groups=3)
        assert out["logits"].shape == (2, 2, 12, NUM_CLASSES + 1) and out["boxes"].shape == (2, 2, 12, 4)
        # Group 0 alone computes exactly what it computes next to the other groups ...
        alone = model._detect(images, pad, groups=1)
        assert torch.allclose(alone["boxes"], out["boxes"][:, :, :4], atol=1e-5)
        # ... and changing another group's queries leaves it untouched (no attention across groups).
        embed.weight[4:] += 3.0
        moved = model._detect(images, pad, groups=3)
        assert torch.allclose(moved["logits"][:, :, :4], out["logits"][:, :, :4], atol=1e-5)
        assert not torch.allclose(moved["logits"][:, :, 4:], out["logits"][:, :, 4:], atol=1e-3)
        # Inference is a plain 4-query detector.
        assert all(len(r["instances"]) == 4 for r in model([{"image": x["image"]} for x in batch]))
    # Training: the class/box losses average the groups' one-to-one losses; every group learns.
    model.train()
    losses = model(batch)
    assert {"loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice"} <= set(losses)
    with torch.no_grad():
        out = model._detect(images, pad, groups=3)
        targets = model.prepare_targets(batch, images)
        per_group = [
            model.criterion(lg[-1], bx[-1], targets, num_boxes(targets, "cpu"), list(zip(lg[:-1], bx[:-1])))[0]
            for lg, bx in zip(out["logits"].chunk(3, dim=2), out["boxes"].chunk(3, dim=2))
        ]
    for key in ("loss_ce", "loss_bbox", "loss_giou", "loss_ce_0"):
        expected = sum(p[key] for p in per_group) / 3
        assert torch.allclose(losses[key], expected, atol=1e-5), key
    sum(losses.values()).backward()
    grad = embed.weight.grad.abs().sum(-1)
    assert (grad.view(3, 4).sum(-1) > 0).all()
    with pytest.raises(ValueError, match="query_groups must be >= 1"):
        tiny_detr(query_groups=0)


def test_masks_only_trains_only_the_mask_head():
    model = tiny_detr(mask_train="masks_only").train()
    losses = model([make_input([(2, 2, 30, 30)], [1])])
    assert set(losses) == {"loss_mask", "loss_dice"}
    sum(losses.values()).backward()
    for n, p in model.named_parameters():
        if n.startswith("mask_head."):
            assert p.requires_grad and p.grad is not None
        else:
            assert not p.requires_grad and p.grad is None
    with pytest.raises(ValueError, match="mask_head"):
        tiny_detr(mask=False, mask_train="masks_only")
    with pytest.raises(ValueError, match="mask_train"):
        tiny_detr(mask_train="both")


def test_bad_configuration_errors():
    model = tiny_detr()
    with pytest.raises(ValueError, match="in_feature"):
        DETRInstanceSeg(
            backbone=model.backbone,
            in_feature="p5",
            transformer=model.transformer,
            num_classes=NUM_CLASSES,
            criterion=model.criterion,
            pixel_mean=[0, 0, 0],
            pixel_std=[1, 1, 1],
        )
    with pytest.raises(ValueError, match="num_classes"):
        DETRInstanceSeg(
            backbone=model.backbone,
            in_feature="last_feat",
            transformer=model.transformer,
            num_classes=5,
            criterion=model.criterion,
            pixel_mean=[0, 0, 0],
            pixel_std=[1, 1, 1],
        )
    with pytest.raises(ValueError, match="mask_in_features"):
        DETRInstanceSeg(
            backbone=model.backbone,
            in_feature="last_feat",
            transformer=model.transformer,
            num_classes=NUM_CLASSES,
            criterion=model.criterion,
            pixel_mean=[0, 0, 0],
            pixel_std=[1, 1, 1],
            mask_head=MaskHead(hidden_dim=32, fpn_channels=[32]),
            mask_in_features=["p4"],
        )
    with pytest.raises(ValueError, match="position_embedding gives 16 channels, the transformer width is 32"):
        DETRInstanceSeg(
            backbone=model.backbone,
            in_feature="last_feat",
            transformer=model.transformer,
            num_classes=NUM_CLASSES,
            criterion=model.criterion,
            pixel_mean=[0, 0, 0],
            pixel_std=[1, 1, 1],
            position_embedding=PositionEmbeddingSine(num_pos_feats=8),
        )
    with pytest.raises(ValueError, match=r"^d_model \(32\) must be divisible by nhead \(5\)$"):
        Transformer(d_model=32, nhead=5)


def test_inference_output_format():
    model = tiny_detr(num_queries=5).eval()
    batch = [
        make_input([(2, 2, 20, 20)], [0], out_size=(100, 120)),
        make_input([], [], size=(40, 56), out_size=(40, 56), seed=2),
    ]
    for x in batch:
        del x["instances"]
    out = model(batch)
    for x, o in zip(batch, out):
        r = o["instances"]
        assert r.image_size == (x["height"], x["width"])
        n = len(r)
        assert 0 < n <= 5
        assert r.pred_masks.shape == (n, x["height"], x["width"]) and r.pred_masks.dtype == torch.bool
        assert r.scores.shape == (n,) and ((r.scores > 0) & (r.scores < 1)).all()
        assert r.pred_classes.max() < NUM_CLASSES
        b = r.pred_boxes.tensor
        assert (b[:, 0] >= 0).all() and (b[:, 2] <= x["width"]).all() and (b[:, 3] <= x["height"]).all()
        assert not r.has("query_index")
    # Rescaling: the first image is 64x64 but asked for at 120x100.
    r = model([{"image": batch[0]["image"]}])[0]["instances"]
    big = out[0]["instances"]
    assert r.image_size == (64, 64)
    assert torch.allclose(big.pred_boxes.tensor[:, ::2] / 120 * 64, r.pred_boxes.tensor[:, ::2], atol=1e-3)


def _overfit(model, batch, steps, lr=2e-3):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    first = last = None
    for _ in range(steps):
        losses = model(copy.deepcopy(batch))
        loss = sum(losses.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    return first, last


def _register(name, batch):
    def dicts():
        out = []
        for i, x in enumerate(batch):
            inst = x["instances"]
            anns = []
            for b, c, m in zip(inst.gt_boxes.tensor.tolist(), inst.gt_classes.tolist(), inst.gt_masks.tensor):
                rle = mask_util.encode(np.asfortranarray(m.numpy().astype(np.uint8)))
                rle["counts"] = rle["counts"].decode("ascii")
                anns.append({"bbox": b, "bbox_mode": 0, "category_id": c, "segmentation": rle, "iscrowd": 0})
            out.append(
                {
                    "file_name": f"{name}_{i}.png",
                    "image_id": i,
                    "height": x["height"],
                    "width": x["width"],
                    "annotations": anns,
                }
            )
        return out

    if name not in DatasetCatalog.list():
        DatasetCatalog.register(name, dicts)
        MetadataCatalog.get(name).set(thing_classes=["r", "g", "b"], evaluator_type="coco")


def _evaluate(model, batch, name, tmp_path):
    evaluator = COCOEvaluator(
        name, tasks=("bbox", "segm"), distributed=False, output_dir=str(tmp_path), use_fast_impl=False
    )
    evaluator.reset()
    model.eval()
    for i, x in enumerate(batch):
        inp = {"image": x["image"], "height": x["height"], "width": x["width"], "image_id": i}
        with torch.no_grad():
            evaluator.process([inp], model([inp]))
    return evaluator.evaluate()


def test_segm_evaluation_runs_untrained(tmp_path):
    batch = [make_input([(2, 2, 20, 20), (30, 30, 60, 60)], [0, 1]), make_input([(10, 10, 40, 30)], [2], seed=1)]
    _register("detr_test_tiny_untrained", batch)
    res = _evaluate(tiny_detr(), batch, "detr_test_tiny_untrained", tmp_path)
    for task in ("bbox", "segm"):
        ap = res[task]["AP"]
        assert 0 <= ap < 50  # an untrained model is far from the truth


@pytest.mark.slow
def test_overfits_two_images_boxes_and_masks(tmp_path):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    batch = [make_input([(4, 6, 28, 30), (36, 30, 60, 58)], [0, 2]), make_input([(12, 20, 52, 44)], [1], seed=1)]
    model = tiny_detr(num_queries=4)
    first, last = _overfit(model, batch, steps=120)
    assert last < first / 5, (first, last)
    model.eval()
    with torch.no_grad():
        out = model([{"image": x["image"]} for x in batch])
    for x, o in zip(batch, out):
        r = o["instances"]
        keep = r.scores > 0.5
        assert keep.sum() == len(x["instances"])
        iou = pairwise_iou(x["instances"].gt_boxes, r.pred_boxes[keep])
        best = iou.max(1)
        assert (best.values > 0.7).all(), iou
        assert (r.pred_classes[keep][best.indices] == x["instances"].gt_classes).all()
    _register("detr_test_tiny_overfit", batch)
    res = _evaluate(model, batch, "detr_test_tiny_overfit", tmp_path)
    assert res["bbox"]["AP50"] > 90, res
    # Masks lag behind boxes (the mask head starts from nothing once queries lock onto objects);
    # an untrained model scores ~0 here.
    assert res["segm"]["AP50"] > 50, res


def test_mask_head_shapes_fpn_and_padding():
    torch.manual_seed(0)
    head = MaskHead(hidden_dim=16, num_heads=2, fpn_channels=[8, 4], conv_dims=[16, 16, 8, 8])
    memory, feats = torch.randn(2, 16, 4, 5), torch.randn(2, 16, 4, 5)
    fpn = [torch.randn(2, 8, 8, 10), torch.randn(2, 4, 16, 20)]
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, :, 3:] = True
    queries, batch_idx = torch.randn(3, 16), torch.tensor([0, 1, 1])
    assert head(queries, batch_idx, memory, mask, feats, fpn).shape == (3, 16, 20)
    assert head(queries[:0], batch_idx[:0], memory, mask, feats, fpn).shape == (0, 16, 20)
    attn = head.attention(queries, batch_idx, memory, mask)
    assert attn.shape == (3, 2, 4, 5)
    assert torch.allclose(attn.sum((2, 3)), torch.ones(3, 2), atol=1e-5)
    assert attn[1:, :, :, 3:].abs().max() == 0 and attn[0, :, :, 3:].min() > 0
    with pytest.raises(ValueError, match="conv_dims"):
        MaskHead(hidden_dim=16, num_upsample=2, conv_dims=[8, 8])
