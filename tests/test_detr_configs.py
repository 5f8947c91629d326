"""The DETR lazy configs load and build; the COCO ones run a forward pass on a small image."""
import os

import pytest
import torch

from detectron2.config import LazyConfig, instantiate

from condinit_det.modeling.detr import DETRInstanceSeg

ROOT = os.path.join(os.path.dirname(__file__), "..", "configs")


def _load(rel):
    return LazyConfig.load(os.path.join(ROOT, rel))


def test_common_model_needs_a_backbone():
    cfg = _load("common/models/detr.py")
    assert cfg.model.num_queries == 100 and cfg.model.transformer.d_model == 256
    assert cfg.model.transformer.num_encoder_layers == cfg.model.transformer.num_decoder_layers == 6
    m = cfg.model.criterion.matcher
    assert (m.cost_class, m.cost_bbox, m.cost_giou) == (1.0, 5.0, 2.0)
    assert cfg.model.criterion.eos_coef == 0.1
    assert cfg.model.position_embedding is None and cfg.model.reference_points is False
    assert cfg.model.query_groups == 1
    with pytest.raises(Exception, match="backbone"):
        instantiate(cfg.model)


def test_demo_config_builds_and_trains_one_step():
    cfg = _load("demo/detr_vit_tiny.py")
    assert cfg.condinit.arm == "default" and cfg.condinit.include is None
    assert cfg.dataloader.train.dataset.names == "condinit_shapes_train"
    model = instantiate(cfg.model)
    assert isinstance(model, DETRInstanceSeg)
    cfg.optimizer.params.model = model
    opt = instantiate(cfg.optimizer)
    batch = next(iter(instantiate(cfg.dataloader.train)))
    model.train()
    losses = model(batch)
    assert {"loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice"} <= set(losses)
    opt.zero_grad()
    sum(losses.values()).backward()
    opt.step()
    # full-model clipping: the global gradient norm seen by the step was at most clip_max_norm
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= 0.1 + 1e-4
    # Query groups are a training aid: inference answers with one group of queries per image.
    assert model.query_embed is None and model.reference_points.weight.shape[0] == 5 * 10
    model.eval()
    with torch.no_grad():
        out = model([{"image": x["image"]} for x in batch])
    assert [len(o["instances"]) for o in out] == [10] * len(batch)


@pytest.mark.slow
@pytest.mark.parametrize("name,num_sites", [("COCO/detr_vitdet_b.py", 12 + 18), ("COCO/detr_swin_b.py", 24 + 18)])
def test_coco_configs_instantiate(name, num_sites):
    from condinit_det.init import find_attention

    cfg = _load(name)
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.weight_decay == 1e-4 and cfg.optimizer.clip_max_norm == 0.1
    assert cfg.dataloader.train.total_batch_size == 64
    model = instantiate(cfg.model).eval()
    assert model.num_queries == 100
    assert len(find_attention(model)) == num_sites
    cfg.optimizer.params.model = model
    opt = instantiate(cfg.optimizer)
    lrs = {g["lr"] for g in opt.param_groups}
    assert lrs == {1e-4, 1e-5}
    backbone_params = {id(p) for p in model.backbone.parameters()}
    for g in opt.param_groups:
        assert all((id(p) in backbone_params) == (g["lr"] == 1e-5) for p in g["params"])
    with torch.no_grad():
        out = model([{"image": torch.randint(0, 256, (3, 96, 128)).float(), "height": 48, "width": 64}])
    r = out[0]["instances"]
    assert r.pred_masks.shape[1:] == (48, 64) and len(r) <= 100
