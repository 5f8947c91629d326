# Tiny XCiT classifier pretrained on the embedded shapes-cls dataset: the data, augmentation and
# schedule of pretrain_vit_tiny.py with an XCiT of the same width and depth.
#
# The trunk matches configs/demo/mask_rcnn_xcit_tiny.py (patch 8, width 96, depth 4, 3 heads, MLP
# ratio 4, qkv bias, eta 1.0, LayerNorm eps 1e-6), so model_final.pth converts into that detector's
# XCiT; the classifier's two class-attention layers (cls_attn_blocks) have no detection counterpart.
# Attention sites: blocks.{0..3}.attn (timm XCA) and cls_attn_blocks.{0,1}.attn (class attention);
# condinit.include='["blocks.*"]' arms only the part that detection keeps.
#
#   tools/pretrain_net.py --config-file configs/demo/pretrain_xcit_tiny.py --arm all train.output_dir=output/p_xcit
from .pretrain_vit_tiny import augment, condinit, condinit_analysis, data, optimizer, scheduler, train

model = dict(
    name="xcit_nano_12_p8_224",
    kwargs=dict(
        patch_size=8,
        embed_dim=96,
        depth=4,
        num_heads=3,
        mlp_ratio=4.0,
        qkv_bias=True,
        eta=1.0,
        img_size=64,
        drop_path_rate=0.0,
    ),
)

train.output_dir = "./output/demo_pretrain_xcit"

# kappa along training as in pretrain_vit_tiny.py (every 2 epochs), on the first, middle and last attention site:
# blocks.0.attn, blocks.3.attn and cls_attn_blocks.1.attn: about 4% of the training time.
