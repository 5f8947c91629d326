"""Per-site measurement: kappa(J) by the route :func:`choose_method` picks, next to the Theorem 3.1 terms, as one
:class:`SiteMeasurement` per site; :func:`write_table` saves them as CSV and Markdown. See docs/conditioning.md.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Dict, List, Optional, Sequence, Union

import torch
from tabulate import tabulate
from torch import nn

from ..init import find_attention, select_sites
from ..utils.fileio import atomic_write
from .bound import theorem_terms
from .capture import capture_site_inputs
from .functional import AttentionFunction
from .heads import exact_conditioning, factor_entries
from .matrix_free import estimate_conditioning
from .options import DEFAULT_MAX_ENTRIES, METHODS

__all__ = [
    "KAPPA_COLUMNS",
    "SiteMeasurement",
    "TABLE_COLUMNS",
    "choose_method",
    "format_markdown",
    "measure_site",
    "measure_sites",
    "resolve_sites",
    "write_table",
]


@dataclass(kw_only=True)
class SiteMeasurement:
    """kappa(J) of one site at a fixed input (fields of :class:`.spectrum.SpectrumResult`) with the Theorem 3.1 terms
    (:class:`.bound.BoundTerms`; NaN, -1 and [] when not computed)."""

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
    bound: float = math.nan
    kappa_wq: float = math.nan
    kappa_wk: float = math.nan
    kappa_wv: float = math.nan
    kappa_x: float = math.nan
    kappa_softmax: float = math.nan
    kappa_lambda: float = math.nan
    tokens: int = -1
    num_heads: int
    include_output_proj: bool
    output_proj: str
    reduction: str
    kappa_wq_heads: list = field(default_factory=list)
    kappa_wk_heads: list = field(default_factory=list)
    kappa_wv_heads: list = field(default_factory=list)
    bound_heads: list = field(default_factory=list)
    structure: str = ""
    sigma_max_heads: list = field(default_factory=list)
    sigma_min_heads: list = field(default_factory=list)
    kappa_heads: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# kappa(J) with the Theorem 3.1 terms: the leading columns of the tables and entries of the records.
KAPPA_COLUMNS = (
    "kappa",
    "sigma_max",
    "sigma_min",
    "bound",
    "kappa_wq",
    "kappa_wk",
    "kappa_wv",
    "kappa_x",
    "kappa_softmax",
    "kappa_lambda",
)
TABLE_COLUMNS = ("site", "kind", *KAPPA_COLUMNS, "method", "converged", "rows", "cols", "tokens")


def resolve_sites(model: nn.Module, patterns: Union[str, Sequence[str], None] = None, *, default: str = "all") -> List:
    """Sites of ``model`` matching fnmatch ``patterns`` (one or several; None: all sites, or the first, middle and
    last with ``default="ends"``). Raises ValueError when the model has no attention site."""
    sites = find_attention(model)
    if not sites:
        raise ValueError(f"{type(model).__name__} has no attention site that condinit_det.init recognises")
    if patterns:
        return select_sites(sites, include=[patterns] if isinstance(patterns, str) else list(patterns))
    if default == "all" or len(sites) <= 3:
        return sites
    return [sites[0], sites[len(sites) // 2], sites[-1]]  # distinct from 4 sites on


def choose_method(fn: AttentionFunction, method: str = "auto", *, max_entries: int = DEFAULT_MAX_ENTRIES) -> str:
    """The route that measures ``fn``: ``method`` itself when it is "exact" or "matrix_free"; for "auto", "exact"
    (per head) when one head's factor fits ``max_entries`` float64 entries, else "matrix_free"."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "auto":
        return method
    return "exact" if factor_entries(fn) <= max_entries else "matrix_free"


def measure_site(
    site,
    inputs: Dict[str, object],
    *,
    method: str = "matrix_free",
    include_output_proj: bool = False,
    tol: float = 1e-4,
    max_iter: int = 60,
    block_size: int = 8,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    bound: bool = True,
    reduction: str = "",
) -> SiteMeasurement:
    """Measure kappa(J) of one site at its (already reduced) inputs, next to the Theorem 3.1 terms.

    Args:
        site: an ``AttentionSite``; inputs: its forward's arguments by name (:func:`.capture.capture_site_inputs`).
        method: "exact" (:mod:`.heads`), "matrix_free" (:mod:`.matrix_free`) or "auto" (:func:`choose_method`).
        include_output_proj: keep W_O (default: the identity in its place, the paper's f).
        tol, max_iter, block_size: the matrix-free route's, see :func:`.spectrum.matrix_free_spectrum`.
        bound: also compute the Theorem 3.1 terms (NaN where the theorem does not apply, docs/conditioning.md).
        reduction: how ``inputs`` were reduced, recorded as given.
    """
    fn = AttentionFunction(site, inputs, include_output_proj=include_output_proj)
    if choose_method(fn, method, max_entries=max_entries) == "exact":
        spec = exact_conditioning(fn, max_entries=max_entries)
    else:
        spec = estimate_conditioning(fn, tol=tol, max_iter=max_iter, block_size=block_size)
    terms = _theorem_terms(fn) if bound else None
    return SiteMeasurement(
        site=site.name,
        kind=site.kind,
        rows=fn.rows,
        cols=fn.cols,
        num_heads=site.num_heads,
        include_output_proj=include_output_proj,
        output_proj=fn.output_proj,
        reduction=reduction,
        **_measured(spec),
        **(_measured(terms) if terms else {}),
    )


def _measured(result) -> dict:
    """The fields of a SpectrumResult or BoundTerms that a SiteMeasurement records."""
    names = {f.name for f in fields(SiteMeasurement)}
    return {key: value for key, value in vars(result).items() if key in names}


def _theorem_terms(fn: AttentionFunction):
    """Theorem 3.1 terms on the tokens entering the q projection; None for a single query token or cross-attention,
    which the theorem does not cover."""
    tokens = fn.projection_inputs()
    if tokens is None:
        raise RuntimeError(f"site {fn.site.name!r}: cannot find the tokens entering the query projection")
    if tokens["q"].shape[0] < 2 or not torch.equal(tokens["q"], tokens["k"]):
        return None
    return theorem_terms(tokens["q"], *fn.weights, num_heads=fn.site.num_heads)


def measure_sites(
    model: nn.Module,
    batched_inputs,
    sites: Sequence,
    *,
    max_batch: Optional[int] = 1,
    max_tokens: Optional[int] = 256,
    **kwargs,
) -> List[SiteMeasurement]:
    """Capture X for ``sites`` on ``batched_inputs`` and :func:`measure_site` (``kwargs``) each one; the model's
    parameters are only read."""
    captured = capture_site_inputs(model, batched_inputs, sites, max_batch=max_batch, max_tokens=max_tokens)
    return [measure_site(s, captured[s.name].inputs, reduction=captured[s.name].reduction, **kwargs) for s in sites]


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.4g}" if isinstance(value, float) else str(value)  # inf and nan as such


def format_markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows`` (dicts) over ``columns``."""
    body = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    return tabulate(body, list(columns), tablefmt="pipe", disable_numparse=True) + "\n"


def write_table(rows: Sequence[dict], output_dir: str, *, columns: Sequence[str] = TABLE_COLUMNS) -> Dict[str, str]:
    """Write ``rows`` (dicts, e.g. ``SiteMeasurement.to_dict()`` plus an ``arm`` key) as
    ``<output_dir>/attention_conditioning.csv`` (full precision) and ``.md``, atomically; return both paths."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows({c: row.get(c, "") for c in columns} for row in rows)
    paths = {ext: os.path.join(output_dir, f"attention_conditioning.{ext}") for ext in ("csv", "md")}
    atomic_write(paths["csv"], buf.getvalue())
    atomic_write(paths["md"], format_markdown(rows, columns))
    return paths
