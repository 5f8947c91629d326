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


def test_demo_config_builds_clips_and_answers():
    """The DETR demo's model, its full-model gradient clipping and an inference pass; its training step runs in the
    every config end to end test (tests/test_configs_end_to_end.py: the losses it logs, finite weights after it)."""
    cfg = _load("demo/detr_vit_tiny.py")
    assert cfg.condinit.arm == "default" and cfg.condinit.include is None
    assert cfg.dataloader.train.dataset.names == "condinit_shapes_train"
    model = instantiate(cfg.model)
    assert isinstance(model, DETRInstanceSeg)
    # full-model clipping: the optimizer the config builds clips the global gradient norm to clip_max_norm in place
    probe = torch.nn.Linear(4, 3)
    cfg.optimizer.params.model = probe
    opt = instantiate(cfg.optimizer)
    for p in probe.parameters():
        p.grad = torch.full_like(p, 10.0)
    opt.step()
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    assert len(grads) == 2 and torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= 0.1 + 1e-4
    # Query groups are a training aid: inference answers with one group of queries per image.
    assert model.query_embed is None and model.reference_points.weight.shape[0] == 5 * 10
    batch = next(iter(instantiate(cfg.dataloader.train)))
    model.eval()
    with torch.no_grad():
        out = model([{"image": x["image"]} for x in batch])
    assert [len(o["instances"]) for o in out] == [10] * len(batch)


_TRANSFORMER_SITES = [
    "transformer.encoder.layers.0.self_attn",
    "transformer.encoder.layers.5.self_attn",
    "transformer.decoder.layers.5.self_attn",
    "transformer.decoder.layers.5.cross_attn",
]
# Conditioning tracking (condinit_analysis): config -> (period, sites). The periods keep the hook's
# measured cost under 1% of training time (BENCHMARKS.md, "Conditioning tracking on the paper's configs").
TRACKED = {
    "COCO/detr_vitdet_b.py": (
        10000,
        ["backbone.net.blocks.0.attn", "backbone.net.blocks.11.attn", *_TRANSFORMER_SITES],
    ),
    "COCO/detr_swin_b.py": (
        10000,
        [
            "backbone.layers.0.blocks.0.attn",
            "backbone.layers.2.blocks.8.attn",
            "backbone.layers.3.blocks.1.attn",
            *_TRANSFORMER_SITES,
        ],
    ),
}


def _site_names(cfg):
    """Every attention-site name of a DETR config's model, from its depths (no build)."""
    backbone = cfg.model.backbone
    if "depths" in backbone:  # Swin
        names = [
            f"backbone.layers.{stage}.blocks.{i}.attn"
            for stage, depth in enumerate(backbone.depths)
            for i in range(depth)
        ]
    else:
        names = [f"backbone.net.blocks.{i}.attn" for i in range(backbone.net.depth)]
    transformer = cfg.model.transformer
    names += [f"transformer.encoder.layers.{i}.self_attn" for i in range(transformer.num_encoder_layers)]
    for i in range(transformer.num_decoder_layers):
        names += [f"transformer.decoder.layers.{i}.self_attn", f"transformer.decoder.layers.{i}.cross_attn"]
    return names


@pytest.mark.parametrize("name", sorted(TRACKED))
def test_coco_configs_track_conditioning(name):
    from condinit_det.analysis import ANALYSIS_DEFAULTS
    from condinit_det.analysis.hooks import build_conditioning_hook

    cfg = _load(name)
    node = dict(cfg.condinit_analysis)
    assert set(node) <= set(ANALYSIS_DEFAULTS)
    period, sites = TRACKED[name]
    assert (node["period"], list(node["sites"])) == (period, sites)
    assert set(sites) <= set(_site_names(cfg)), "a tracked site is not an attention site of the model"
    for key in ("method", "max_tokens", "max_batch", "num_images", "include_output_proj"):
        assert node[key] == ANALYSIS_DEFAULTS[key], key
    hook = build_conditioning_hook(cfg, batch=[{"image": torch.zeros(3, 32, 32)}], config_name=name)
    assert hook.period == period and hook.options["sites"] == sites


@pytest.mark.slow
@pytest.mark.parametrize("name,num_sites", [("COCO/detr_vitdet_b.py", 12 + 18), ("COCO/detr_swin_b.py", 24 + 18)])
def test_coco_configs_instantiate(name, num_sites):
    from condinit_det.init import find_attention, select_sites

    cfg = _load(name)
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.weight_decay == 1e-4 and cfg.optimizer.clip_max_norm == 0.1
    assert cfg.dataloader.train.total_batch_size == 64
    model = instantiate(cfg.model).eval()
    assert model.num_queries == 100
    assert len(find_attention(model)) == num_sites
    assert [s.name for s in find_attention(model)] == _site_names(cfg)
    tracked = TRACKED[name][1]
    assert [s.name for s in select_sites(find_attention(model), include=tracked)] == tracked
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
