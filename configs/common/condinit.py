# The attention-init arm applied by tools/train_net.py right after the model is built and before
# any checkpoint is loaded. Override on the command line, e.g. `condinit.arm=conditioned`, or run
# every arm with `--arm all`.
#   arm:     "default" | "mimetic" | "conditioned"
#   seed:    seed of the arm's own generator (the global RNG is never touched)
#   include: fnmatch patterns on attention-site names (None: every site found in the model)
#   exclude: fnmatch patterns removed from the included sites
#   options: arm options (gain_qk, gain_v, value_mode, condition_output; alpha1, beta1, alpha2,
#            beta2, noise) — see condinit_det.init.apply_init
condinit = dict(arm="default", seed=0, include=None, exclude=None, options={})

# Attention-Jacobian conditioning tracked during training (condinit_det.analysis): every `period`
# iterations (0: off), kappa of the chosen sites (None: first, middle and last attention site) is
# estimated matrix-free on a fixed test image and recorded in results.json.
condinit_analysis = dict(period=0, sites=None, max_iter=100, block_size=16, tol=1e-3, max_batch=1, max_tokens=16,
                         include_output_proj=False, bound=True, num_images=1)
