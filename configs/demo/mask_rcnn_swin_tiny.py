# Tiny Swin Mask R-CNN (Swin Transformer + FPN) for the embedded shapes dataset, with the same
# detector heads, data and schedule as mask_rcnn_vit_tiny.py.
#
# Default arm: "default" (condinit.arm). Train another with `condinit.arm=conditioned` /
# `condinit.arm=mimetic`, or all three with `--arm all`.
from detectron2.config import LazyCall as L
from detectron2.modeling import FPN, SwinTransformer

from .mask_rcnn_vit_tiny import condinit, condinit_analysis, dataloader, fpn_dim, lr_multiplier, model, optimizer, train

model.backbone = L(FPN)(
    bottom_up=L(SwinTransformer)(
        patch_size=4,
        embed_dim=48,
        depths=(2, 2, 2),
        num_heads=(2, 4, 8),
        # 32x32 tokens at stride 4 on a 128 px image: four 8x8 windows per side in the first stage.
        window_size=8,
        mlp_ratio=4.0,
        qkv_bias=True,
        drop_path_rate=0.0,
        ape=False,
        patch_norm=True,
        out_indices=(0, 1, 2),
    ),
    # Swin stages at strides 4, 8, 16 become pyramid levels p2, p3, p4, as with the ViT config.
    in_features=("p0", "p1", "p2"),
    out_channels=fpn_dim,
    top_block=None,
)

optimizer.params.overrides = {"relative_position_bias_table": {"weight_decay": 0.0}}

# Conditioning analysis: a Swin site is measured on a whole 8x8 window (64 tokens), not on the ViT demo's 16 tokens,
# so the demo tracks the first block only ("auto": exact per head where one head's factor fits, else the
# matrix-free estimate) at 0, 200 and 400 iterations, about 2% of the training time (docs/demos.md).
condinit_analysis.period = 200
condinit_analysis.method = "auto"
condinit_analysis.sites = ["backbone.bottom_up.layers.0.blocks.0.attn"]

train.output_dir = "./output/demo/mask_rcnn_swin_tiny"
