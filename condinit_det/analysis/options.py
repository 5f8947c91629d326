"""What a κ measurement can be asked for: the methods, the exact method's size limit and the ``condinit_analysis``
config node's keys with their defaults (no torch import, so that the commands and the configs' checks read them at
once). docs/conditioning.md has the meaning of each."""

__all__ = ["ANALYSIS_DEFAULTS", "DEFAULT_MAX_ENTRIES", "METHODS"]

METHODS = ("auto", "exact", "matrix_free")  # auto: exact when one head's factor fits max_entries, else matrix-free
DEFAULT_MAX_ENTRIES = 50_000_000  # the largest float64 head factor the exact method forms: 400 MB, ViT-B at 16 tokens
# The matrix-free estimate is exact once max_iter * block_size reaches max_tokens * D_v (its Gram operator's size), and
# sigma_min rarely converges much sooner.
ANALYSIS_DEFAULTS = dict(
    period=0,
    sites=None,
    method="auto",
    max_iter=100,
    block_size=16,
    tol=1e-3,
    max_batch=1,
    max_tokens=16,
    include_output_proj=False,
    bound=True,
    num_images=1,
)
