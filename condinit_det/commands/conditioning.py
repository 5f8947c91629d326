"""``condinit-conditioning`` (``tools/attention_conditioning.py``): kappa of the attention Jacobian per arm and site.

    condinit-conditioning --config-file zoo:demo/mask_rcnn_vit_tiny.py --arm all --output output/conditioning

For every arm: build cfg.model with it (optionally loading --weights), capture X for the attention sites on one
batch and measure kappa(J) (output projection the identity unless --include-output-proj) next to Theorem 3.1's
bound and terms. Prints a Markdown table and writes <output>/attention_conditioning.{csv,md,json}. --method auto
(default) is exact per head when one head's factor fits --max-entries, else matrix_free (block Lanczos, labelled
converged or not). A failure ends the command with one error line. See docs/conditioning.md.
"""

import argparse
import json
import logging
import os
import sys

from condinit_det.analysis.options import DEFAULT_MAX_ENTRIES, METHODS
from condinit_det.init.options import ARMS, PAPER_ARMS
from condinit_det.utils.checkpoint_io import TRUST_FLAG, check_loadable
from condinit_det.utils.fileio import atomic_write


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--config-file",
        required=True,
        help="detectron2 lazy config (.py or .yaml): a path, or a model-zoo name zoo:NAME",
    )
    p.add_argument(
        "--arm",
        default="all",
        choices=ARMS + ("all",),
        help=f"arm to measure; all: {', '.join(PAPER_ARMS)} (default: all)",
    )
    p.add_argument(
        "--weights",
        default=None,
        help="checkpoint loaded after the arm is applied (overwrites it): "
        ".safetensors, .pth (weights only) or a pretraining run's model_final file",
    )
    p.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="let --weights be a .pkl or a .pth that needs full unpickling (can run code stored in it)",
    )
    p.add_argument("--sites", nargs="*", default=None, help="fnmatch patterns on site names (default: all sites)")
    p.add_argument("--output", default=None, help="directory for the CSV / Markdown / JSON tables")
    p.add_argument(
        "--method",
        default="auto",
        choices=METHODS,
        help="auto: exact when one head's factor fits --max-entries, else matrix_free (default)",
    )
    p.add_argument("--split", default="test", choices=("test", "train"), help="data loader giving the batch")
    p.add_argument("--num-images", type=int, default=1, help="images in the batch")
    p.add_argument("--max-batch", type=int, default=1, help="sequences (windows) kept per site")
    p.add_argument("--max-tokens", type=int, default=196, help="tokens kept per sequence")
    p.add_argument("--max-iter", type=int, default=60, help="block-Lanczos steps")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument(
        "--max-entries",
        type=float,
        default=DEFAULT_MAX_ENTRIES,
        help="largest float64 matrix the exact method may form (default %(default).3g)",
    )
    p.add_argument("--include-output-proj", action="store_true", help="keep W_O in f (default: identity)")
    p.add_argument("--device", default="cpu")
    p.add_argument("opts", nargs="*", help="config overrides key=value, before or after the flags")
    return p


def build_model(cfg, arm, device):
    """cfg.model built with ``arm`` (``condinit.arm`` replaced); the same global seed for every arm."""
    import torch
    from detectron2.config import instantiate
    from omegaconf import OmegaConf

    from condinit_det.modeling.arm import armed, armed_nodes

    OmegaConf.update(cfg, "condinit.arm", arm, force_add=True)  # a config without a condinit node gets one
    if not armed_nodes(cfg.model):
        armed(cfg.model)
    torch.manual_seed(int(cfg.train.get("seed", 0) or 0) if "train" in cfg else 0)
    return instantiate(cfg.model).to(device)


def measure(argv=None):
    """Run the command line ``argv`` and return the table's rows; bad input raises."""
    args = get_parser().parse_intermixed_args(argv)
    import torch

    from condinit_det import model_zoo
    from condinit_det.analysis.hooks import fixed_batch
    from condinit_det.analysis.measure import TABLE_COLUMNS, format_markdown, measure_sites, resolve_sites, write_table
    from condinit_det.data import register_embedded_datasets
    from condinit_det.engine.checkpoint import RunCheckpointer
    from condinit_det.engine.config import OPTIONAL_KEYS

    columns = ("arm",) + TABLE_COLUMNS
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = model_zoo.load_config(args.config_file, args.opts, optional=OPTIONAL_KEYS)
    if args.weights:  # refuse an unsafe or unreadable file before any work
        check_loadable(args.weights, trust_pickle=args.trust_pickle)
    register_embedded_datasets()  # a config may name the embedded datasets
    batch = fixed_batch(cfg, args.num_images, split=args.split)
    arms = PAPER_ARMS if args.arm == "all" else (args.arm,)
    rows = []
    for arm in arms:
        model = build_model(cfg, arm, args.device)
        if args.weights:
            RunCheckpointer(model, trust_pickle=args.trust_pickle).load(args.weights)
        sites = resolve_sites(model, args.sites, default="all")
        for m in measure_sites(
            model,
            batch,
            sites,
            max_batch=args.max_batch,
            max_tokens=args.max_tokens,
            method=args.method,
            max_iter=args.max_iter,
            block_size=args.block_size,
            tol=args.tol,
            include_output_proj=args.include_output_proj,
            max_entries=int(args.max_entries),
        ):
            rows.append({"arm": arm, **m.to_dict()})
    print(format_markdown(rows, columns), end="")
    if args.output:
        paths = write_table(rows, args.output, columns=columns)
        json_path = os.path.join(args.output, "attention_conditioning.json")
        # Strict JSON: inf (rank deficient) and NaN (not computed) become null.
        safe_rows = json.loads(json.dumps(rows), parse_constant=lambda _: None)
        payload = {"config": args.config_file, "weights": args.weights, "rows": safe_rows}
        atomic_write(json_path, json.dumps(payload, indent=1, allow_nan=False))
        print(f"wrote {paths['csv']}, {paths['md']}, {json_path}", file=sys.stderr)
    return rows


def error_line(err: BaseException, prog: str = "attention_conditioning.py") -> str:
    """One line for a failure that ends the command; out-of-memory errors name the alternatives."""
    message = err.args[0] if isinstance(err, KeyError) and err.args else err
    text = " ".join(str(message).split()) or type(err).__name__
    if isinstance(err, MemoryError) or "can't allocate memory" in text or "not enough memory" in text:
        text = f"out of memory ({text}); use --method matrix_free, or fewer --max-tokens / --max-batch"
    return f"{prog}: error: {text}"


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:
        measure(argv)
    except (ValueError, RuntimeError, MemoryError, KeyError, FileNotFoundError, TypeError) as e:
        print(error_line(e, get_parser().prog), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
