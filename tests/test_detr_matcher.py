import itertools

import pytest
import torch

from condinit_det.modeling.detr import HungarianMatcher


def _random_boxes(n, gen):
    cxcy = torch.rand(n, 2, generator=gen) * 0.6 + 0.2
    wh = torch.rand(n, 2, generator=gen) * 0.3 + 0.05
    return torch.cat([cxcy, wh], 1)


def _brute_force(cost):
    """Minimum total cost over all injective maps targets -> queries."""
    q, t = cost.shape
    best = None
    for perm in itertools.permutations(range(q), t):
        total = sum(cost[perm[j], j].item() for j in range(t))
        best = total if best is None else min(best, total)
    return best


@pytest.mark.parametrize("num_queries,num_targets", [(4, 4), (6, 3), (5, 1), (7, 5)])
def test_assignment_is_optimal(num_queries, num_targets):
    gen = torch.Generator().manual_seed(num_queries * 10 + num_targets)
    matcher = HungarianMatcher(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0)
    for _ in range(3):
        logits = torch.randn(1, num_queries, 4, generator=gen)
        boxes = _random_boxes(num_queries, gen)[None]
        tgt = {"labels": torch.randint(0, 3, (num_targets,), generator=gen), "boxes": _random_boxes(num_targets, gen)}
        ((rows, cols),) = matcher(logits, boxes, [tgt])
        assert len(rows) == len(cols) == num_targets
        assert len(set(rows.tolist())) == num_targets and sorted(cols.tolist()) == list(range(num_targets))
        cost = matcher.cost_matrix(logits[0], boxes[0], tgt["labels"], tgt["boxes"])
        assert cost[rows, cols].sum().item() == pytest.approx(_brute_force(cost), abs=1e-5)


def test_cost_terms_and_weights():
    matcher = HungarianMatcher(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0)
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    pred = torch.tensor([[0.5, 0.5, 0.2, 0.2]])
    tgt = torch.tensor([[0.55, 0.5, 0.2, 0.2]])
    cost = matcher.cost_matrix(logits, pred, torch.tensor([0]), tgt)
    prob = logits.softmax(-1)[0, 0]
    # Two 0.2-wide boxes shifted by 0.05: intersection 0.15*0.2, union 2*0.04 - 0.03, hull = union.
    iou = 0.03 / 0.05
    expected = -prob + 5 * 0.05 - 2 * iou
    assert cost.item() == pytest.approx(expected.item(), abs=1e-5)
    # The matcher prefers the box with the right class when geometry is equal.
    logits2 = torch.tensor([[[4.0, 0.0, 0.0], [0.0, 4.0, 0.0]]])
    boxes2 = tgt.repeat(2, 1)[None]
    ((rows, cols),) = matcher(logits2, boxes2, [{"labels": torch.tensor([1]), "boxes": tgt}])
    assert rows.tolist() == [1] and cols.tolist() == [0]


def test_images_without_objects():
    matcher = HungarianMatcher()
    logits = torch.randn(2, 5, 3)
    boxes = torch.rand(2, 5, 4) * 0.5 + 0.25
    targets = [
        {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.3]])},
    ]
    out = matcher(logits, boxes, targets)
    assert out[0][0].numel() == 0 and out[0][1].numel() == 0
    assert out[0][0].dtype == torch.int64
    assert len(out[1][0]) == 1 and out[1][1].tolist() == [0]


def test_rejects_all_zero_costs():
    with pytest.raises(ValueError, match="non-zero"):
        HungarianMatcher(cost_class=0, cost_bbox=0, cost_giou=0)
