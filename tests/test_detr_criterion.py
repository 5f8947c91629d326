import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import sigmoid_focal_loss

from condinit_det.modeling.detr import HungarianMatcher, PositionEmbeddingSine, SetCriterion, Transformer
from condinit_det.modeling.detr.criterion import dice_loss, num_boxes_for_normalization


def _criterion(**kw):
    return SetCriterion(num_classes=3, matcher=HungarianMatcher(), **kw)


def _targets(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "labels": torch.randint(0, 3, (n,), generator=g),
        "boxes": torch.cat([torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.2 + 0.1], 1),
    }


@pytest.mark.parametrize("counts", [(0, 0), (1, 0), (5, 3)])
def test_losses_finite_and_normalized(counts):
    crit = _criterion()
    logits = torch.randn(2, 8, 4, requires_grad=True)
    boxes = torch.rand(2, 8, 4).mul(0.3).add(0.3).requires_grad_()
    targets = [_targets(n, i) for i, n in enumerate(counts)]
    num_boxes = num_boxes_for_normalization(targets, "cpu")
    assert num_boxes == max(sum(counts), 1)
    losses, indices = crit(logits, boxes, targets, num_boxes, [(logits * 0.5, boxes)])
    assert set(losses) == {"loss_ce", "loss_bbox", "loss_giou", "loss_ce_0", "loss_bbox_0", "loss_giou_0"}
    assert all(torch.isfinite(v) for v in losses.values())
    assert [len(q) for q, _ in indices] == list(counts)
    # Cross-entropy: matched queries take their labels, all others the no-object class, weighted 0.1.
    target_classes = torch.full((2, 8), 3)
    for b, (q, t) in enumerate(indices):
        target_classes[b, q] = targets[b]["labels"][t]
    weight = torch.tensor([1.0, 1.0, 1.0, 0.1])
    ce = F.cross_entropy(logits.transpose(1, 2), target_classes, weight)
    assert losses["loss_ce"].item() == pytest.approx(ce.item(), rel=1e-5)
    if sum(counts) == 0:
        assert losses["loss_bbox"].item() == 0 and losses["loss_giou"].item() == 0
    else:
        src = torch.cat([boxes[b, q] for b, (q, _) in enumerate(indices)])
        tgt = torch.cat([targets[b]["boxes"][t] for b, (_, t) in enumerate(indices)])
        assert losses["loss_bbox"].item() == pytest.approx(5 * (src - tgt).abs().sum().item() / num_boxes, rel=1e-5)
        assert losses["loss_giou"].item() > 0
    sum(losses.values()).backward()
    assert logits.grad.abs().sum() > 0
    if sum(counts):
        assert boxes.grad.abs().sum() > 0


def test_loss_weights_scale_losses():
    logits, boxes, targets = torch.randn(1, 6, 4), torch.rand(1, 6, 4) * 0.3 + 0.3, [_targets(3)]
    base, _ = _criterion()(logits, boxes, targets, 3)
    scaled, _ = _criterion(class_weight=2.0, bbox_weight=1.0, giou_weight=4.0)(logits, boxes, targets, 3)
    assert scaled["loss_ce"].item() == pytest.approx(2 * base["loss_ce"].item(), rel=1e-5)
    assert scaled["loss_bbox"].item() == pytest.approx(base["loss_bbox"].item() / 5, rel=1e-5)
    assert scaled["loss_giou"].item() == pytest.approx(2 * base["loss_giou"].item(), rel=1e-5)


def test_perfect_prediction_has_near_zero_box_loss():
    targets = [_targets(2)]
    logits = torch.full((1, 4, 4), -10.0)
    boxes = torch.rand(1, 4, 4) * 0.2 + 0.4
    boxes[0, 1:3] = targets[0]["boxes"]
    logits[0, 1, targets[0]["labels"][0]] = 10
    logits[0, 2, targets[0]["labels"][1]] = 10
    logits[0, [0, 3], 3] = 10
    losses, indices = _criterion()(logits, boxes, targets, 2)
    assert sorted(indices[0][0].tolist()) == [1, 2]
    assert losses["loss_bbox"].item() < 1e-6 and losses["loss_giou"].item() < 1e-6
    assert losses["loss_ce"].item() < 1e-3


def test_mask_losses():
    crit = _criterion()
    target = torch.zeros(2, 8, 8)
    target[:, 2:6, 2:6] = 1
    good = (target * 2 - 1) * 20
    bad = -good
    lg = crit.mask_losses(good, target, num_boxes=2)
    lb = crit.mask_losses(bad, target, num_boxes=2)
    assert lg["loss_mask"] < 1e-4 and lg["loss_dice"] < 1e-3
    assert lb["loss_mask"] > 1 and lb["loss_dice"] > 0.9
    logits = torch.randn(2, 8, 8)
    focal = sigmoid_focal_loss(logits.flatten(1), target.flatten(1), reduction="none").mean(1).sum() / 2
    assert crit.mask_losses(logits, target, 2)["loss_mask"].item() == pytest.approx(focal.item(), rel=1e-6)
    dice = dice_loss(logits, target).item() / 2
    assert crit.mask_losses(logits, target, 2)["loss_dice"].item() == pytest.approx(dice)
    empty = crit.mask_losses(torch.zeros(0, 8, 8, requires_grad=True), torch.zeros(0, 8, 8), 1.0)
    assert empty["loss_mask"].item() == 0 and empty["loss_dice"].item() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="eos_coef"):
        _criterion(eos_coef=2.0)


def test_position_encoding_ignores_padding():
    pe = PositionEmbeddingSine(num_pos_feats=8)
    small = torch.zeros(1, 5, 6, dtype=torch.bool)
    padded = torch.ones(1, 8, 9, dtype=torch.bool)
    padded[0, :5, :6] = False
    a, b = pe(small), pe(padded)
    assert a.shape == (1, 16, 5, 6) and b.shape == (1, 16, 8, 9)
    assert torch.allclose(a, b[:, :, :5, :6], atol=1e-6)
    # normalized: the last valid cell of every row/column sits at position 2*pi
    assert torch.allclose(b[0, 8, 0, 5], torch.sin(torch.tensor(2 * torch.pi)), atol=1e-5)


def test_point_encoding_matches_the_feature_map_encoding():
    pe = PositionEmbeddingSine(num_pos_feats=8)
    h, w = 5, 7
    grid = pe(torch.zeros(1, h, w, dtype=torch.bool))[0]  # [16, H, W]
    # Cell (i, j) sits at the normalized position ((j + 1) / W, (i + 1) / H).
    ii, jj = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    points = torch.stack(((jj + 1) / w, (ii + 1) / h), dim=-1).float()  # [H, W, 2] as (x, y)
    enc = pe.encode_points(points)
    assert enc.shape == (h, w, 16)
    assert torch.allclose(enc.permute(2, 0, 1), grid, atol=1e-5)


def test_transformer_ignores_padded_cells():
    torch.manual_seed(0)
    tr = Transformer(
        d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32, dropout=0.0
    ).eval()
    pe = PositionEmbeddingSine(num_pos_feats=8)
    src = torch.randn(1, 16, 3, 4)
    mask = torch.zeros(1, 3, 4, dtype=torch.bool)
    big = torch.randn(1, 16, 5, 6) * 10  # garbage in the padding
    big[:, :, :3, :4] = src
    big_mask = torch.ones(1, 5, 6, dtype=torch.bool)
    big_mask[0, :3, :4] = False
    queries = torch.randn(4, 16)
    hs, mem = tr(src, mask, queries, pe(mask))
    hs2, mem2 = tr(big, big_mask, queries, pe(big_mask))
    assert hs.shape == (2, 1, 4, 16) and mem.shape == (1, 16, 3, 4)
    assert torch.allclose(hs, hs2, atol=1e-5)
    assert torch.allclose(mem, mem2[:, :, :3, :4], atol=1e-5)
    # Without the mask the padded garbage leaks in.
    hs3, _ = tr(big, torch.zeros_like(big_mask), queries, pe(big_mask))
    assert not torch.allclose(hs, hs3, atol=1e-3)
