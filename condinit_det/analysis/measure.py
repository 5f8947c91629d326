"""Per-site measurement: kappa(J) (exact or matrix-free) next to the Theorem 3.1 terms and bound.

``measure_sites(model, batched_inputs, sites)`` captures X on the batch (see
:mod:`condinit_det.analysis.capture`) and returns one :class:`SiteMeasurement` per site;
``write_table(rows, output_dir)`` saves them as CSV and Markdown.
"""
from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from tabulate import tabulate
from torch import nn

from ..utils.fileio import atomic_write
from .bound import theorem_terms
from .capture import capture_site_inputs, token_matrix
from .conditioning import DEFAULT_MAX_ENTRIES, dense_conditioning, estimate_conditioning, exact_conditioning
from .functional import AttentionFunction
from .heads import factor_entries

__all__ = ["SiteMeasurement", "measure_site", "measure_sites", "resolve_sites", "write_table",
           "TABLE_COLUMNS", "default_sites"]

METHODS = ("matrix_free", "exact", "dense", "auto")


@dataclass
class SiteMeasurement:
    """kappa(J) of one site at a fixed input with the bound's terms (all floats; inf = singular).

    sigma_max_heads / sigma_min_heads / kappa_heads: per head (exact method without the output
    projection; empty otherwise). structure: "closed_form", "autodiff", "dense" or "" (matrix-free).
    """

    site: str
    kind: str
    kappa: float
    sigma_max: float
    sigma_min: float
    rank_deficient: bool
    converged: bool
    method: str
    iterations: int
    products: int
    residual_min: float
    residual_max: float
    rows: int
    cols: int
    bound: float
    kappa_wq: float
    kappa_wk: float
    kappa_wv: float
    kappa_x: float
    kappa_softmax: float
    kappa_lambda: float
    tokens: int
    num_heads: int
    include_output_proj: bool
    output_proj: str
    reduction: str
    kappa_wq_heads: list
    kappa_wk_heads: list
    kappa_wv_heads: list
    bound_heads: list
    structure: str = ""
    sigma_max_heads: list = field(default_factory=list)
    sigma_min_heads: list = field(default_factory=list)
    kappa_heads: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


TABLE_COLUMNS = ("site", "kind", "kappa", "sigma_max", "sigma_min", "bound", "kappa_wq", "kappa_wk", "kappa_wv",
                 "kappa_x", "kappa_softmax", "kappa_lambda", "method", "converged", "rows", "cols", "tokens")


def default_sites(sites: Sequence) -> List:
    """First, middle and last site (in module order), without repeats."""
    sites = list(sites)
    if len(sites) <= 3:
        return sites
    picked = [sites[0], sites[len(sites) // 2], sites[-1]]
    return [s for i, s in enumerate(picked) if s.name not in {p.name for p in picked[:i]}]


def resolve_sites(model: nn.Module, patterns: Optional[Sequence[str]] = None, *, default: str = "all") -> List:
    """Sites of ``model`` selected by fnmatch ``patterns`` (None: all sites, or first/middle/last
    when ``default="ends"``). Raises ValueError when the model has no attention site."""
    from condinit_det.init import find_attention, select_sites

    sites = find_attention(model)
    if not sites:
        raise ValueError(f"{type(model).__name__} has no attention site that condinit_det.init recognises")
    if patterns:
        return select_sites(sites, include=list(patterns))
    if default == "ends":
        return default_sites(sites)
    if default != "all":
        raise ValueError(f"default must be 'all' or 'ends', got {default!r}")
    return sites


def measure_site(site, inputs: Dict[str, object], *, method: str = "matrix_free", include_output_proj: bool = False,
                 tol: float = 1e-4, max_iter: int = 60, block_size: int = 8, rank_tol: float = 1e-7,
                 max_entries: int = DEFAULT_MAX_ENTRIES, seed: int = 0, bound: bool = True,
                 reduction: str = "") -> SiteMeasurement:
    """Measure one site at the given (already reduced) inputs.

    method: "matrix_free" (block Lanczos on jvp/vjp products), "exact" (per-head factors, see
    :mod:`condinit_det.analysis.heads`; refuses when one head's factor exceeds ``max_entries``),
    "dense" (the dense Jacobian, the reference; refuses above ``max_entries``) or "auto" (exact
    when it fits, else matrix-free).
    bound: also compute the Theorem 3.1 terms (NaN otherwise, and for a site whose queries are a single token).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    fn = AttentionFunction(site, inputs, include_output_proj=include_output_proj)
    if method == "auto":
        method = "exact" if factor_entries(fn) <= max_entries else "matrix_free"
    if method == "exact":
        spec = exact_conditioning(fn, include_output_proj=include_output_proj, max_entries=max_entries)
    elif method == "dense":
        spec = dense_conditioning(fn, max_entries=max_entries)
    else:
        spec = estimate_conditioning(fn, tol=tol, max_iter=max_iter, block_size=block_size, rank_tol=rank_tol,
                                     seed=seed)
    nan = float("nan")
    terms = None
    if bound:
        x = token_matrix(site, inputs)
        # One query token (class attention's class token) has no softmax Jacobian to bound: terms stay NaN.
        if x.shape[0] >= 2:
            wq, wk, wv = fn.weights
            terms = theorem_terms(x, wq, wk, wv, num_heads=site.num_heads)
    return SiteMeasurement(
        site=site.name, kind=site.kind, kappa=spec.kappa, sigma_max=spec.sigma_max, sigma_min=spec.sigma_min,
        rank_deficient=spec.rank_deficient, converged=spec.converged, method=spec.method,
        iterations=spec.iterations, products=spec.products, residual_min=spec.residual_min,
        residual_max=spec.residual_max, rows=fn.rows, cols=fn.cols,
        bound=terms.bound if terms else nan, kappa_wq=terms.kappa_wq if terms else nan,
        kappa_wk=terms.kappa_wk if terms else nan, kappa_wv=terms.kappa_wv if terms else nan,
        kappa_x=terms.kappa_x if terms else nan, kappa_softmax=terms.kappa_softmax if terms else nan,
        kappa_lambda=terms.kappa_lambda if terms else nan, tokens=terms.tokens if terms else -1,
        num_heads=site.num_heads, include_output_proj=include_output_proj, output_proj=fn.output_proj,
        reduction=reduction,
        kappa_wq_heads=terms.kappa_wq_heads if terms else [], kappa_wk_heads=terms.kappa_wk_heads if terms else [],
        kappa_wv_heads=terms.kappa_wv_heads if terms else [], bound_heads=terms.bound_heads if terms else [],
        structure=spec.structure, sigma_max_heads=spec.sigma_max_heads, sigma_min_heads=spec.sigma_min_heads,
        kappa_heads=spec.kappa_heads,
    )


def measure_sites(model: nn.Module, batched_inputs, sites: Sequence, *, max_batch: Optional[int] = 1,
                  max_tokens: Optional[int] = 256, **kwargs) -> List[SiteMeasurement]:
    """Capture X for ``sites`` on ``batched_inputs`` and :func:`measure_site` each one.

    kwargs go to :func:`measure_site`. Gradients are not touched: the model's parameters are only
    read (copies in float64).
    """
    captured = capture_site_inputs(model, batched_inputs, sites, max_batch=max_batch, max_tokens=max_tokens)
    return [measure_site(s, captured[s.name].inputs, reduction=captured[s.name].reduction, **kwargs) for s in sites]


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    return str(value)


def format_markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows`` (dicts) over ``columns``."""
    body = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    return tabulate(body, list(columns), tablefmt="pipe", disable_numparse=True) + "\n"


def write_table(rows: Sequence[dict], output_dir: str, *, name: str = "attention_conditioning",
                columns: Sequence[str] = TABLE_COLUMNS) -> Dict[str, str]:
    """Write ``rows`` (dicts, e.g. ``SiteMeasurement.to_dict()`` plus an ``arm`` key) as
    ``<output_dir>/<name>.csv`` (full precision) and ``.md``, atomically; return both paths."""
    rows = [dict(r) for r in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c, "") for c in columns})
    paths = {"csv": os.path.join(output_dir, f"{name}.csv"), "md": os.path.join(output_dir, f"{name}.md")}
    atomic_write(paths["csv"], buf.getvalue())
    atomic_write(paths["md"], format_markdown(rows, columns))
    return paths
