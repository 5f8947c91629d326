# The attention-init arm: the one place a lazy config sets it. Configs arm their model node with
# condinit_det.modeling.armed(model), which makes `instantiate(cfg.model)` apply this node right
# after the model is built and before any checkpoint is loaded, under any trainer
# (tools/train_net.py, detectron2's tools/lazyconfig_train_net.py, detrex, a notebook).
# Override on the command line, e.g. `condinit.arm=conditioned` (or `--arm` in tools/train_net.py).
#   arm:     "default" | "mimetic" | "conditioned" (the paper's, what `--arm all` trains) | "scale_matched"
#            | "structured" (the conditioned arm's controls: the default init rescaled per head to the
#            conditioned arm's norms, and the conditioned blocks rescaled to the default init's; with default
#            and conditioned, what `--arm factorial` trains; docs/arms.md)
#   seed:    seed of the arm's own generators (the global RNG is never touched); follows train.seed
#   include: fnmatch patterns on attention-site names (None: every site found in the model)
#   exclude: fnmatch patterns removed from the included sites
#   options: per arm, e.g. options={"mimetic": {"alpha1": 0.5}, "conditioned": {"gain_v": 0.5}} or
#            `condinit.options.mimetic.alpha1=0.5`; conditioned: gain_qk, gain_v, value_mode,
#            condition_output; mimetic: alpha1, beta1, alpha2, beta2, noise; scale_matched and
#            structured: norm ("frobenius" | "spectral"), and the conditioned entry's gain_qk, gain_v and
#            value_mode (condinit_det.init.ARM_OPTIONS)
condinit = dict(arm="default", seed="${oc.select:train.seed,0}", include=None, exclude=None, options={})

# Attention-Jacobian conditioning tracked during training (condinit_det.analysis): every `period`
# iterations (0: off), kappa of the chosen sites (None: first, middle and last attention site) on a
# fixed test image, recorded in results.json. method "auto": exact (per head) when one head's factor
# fits, else the matrix-free (block Lanczos) estimate; or "exact" / "matrix_free" (docs/conditioning.md).
condinit_analysis = dict(
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
