"""Planned contrasts between two arms other than default.

Beside every arm against the default arm, the report compares pairs of arms A vs B directly, paired by
training seed exactly as the comparisons with default are (runs with the same seed share data order and
every non-attention weight, and every run is evaluated on the same images): A minus B per seed, with the
same intervals, p-values, P(A run > B run with the same seed) and the censored speed-up of A to B's final
value (:mod:`condinit_det.report.paired`). The contrasts' headline-metric comparisons join the stage's Holm
family, which grows by them.

Planned by default (:data:`DEFAULT_CONTRASTS`), whenever both arms ran in a stage:

- ``conditioned`` vs ``scale_matched``: ``scale_matched`` is the default initialization rescaled to the
  conditioned weights' scale, so this contrast asks whether the conditioning adds anything to the scale's
  effect;
- ``conditioned`` vs ``mimetic``: the two structured initializations against each other.

Others are asked for as ``A:B`` (``condinit-compare --contrast A:B``; :func:`parse_contrast`). A contrast
whose arm did not run in a stage is left out of that stage with a note (:func:`resolve_contrasts`).
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence, Tuple

from .statistics import IMAGES, verdict_text

__all__ = ["DEFAULT_CONTRASTS", "check_contrast", "contrast_meaning", "parse_contrast", "resolve_contrasts"]

DEFAULT_CONTRASTS: Tuple[Tuple[str, str], ...] = (("conditioned", "scale_matched"), ("conditioned", "mimetic"))
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ACCEPTED = ("two different arms other than default, as A:B (e.g. conditioned:scale_matched, conditioned:mimetic, "
             "mimetic:scale_matched)")


def check_contrast(arm: str, reference: str) -> Tuple[str, str]:
    """(A, B) when it names two different arms other than default; raises ValueError saying what is accepted."""
    arm, reference = str(arm).strip(), str(reference).strip()
    bad = [n for n in (arm, reference) if not _NAME.match(n)]
    if bad:
        raise ValueError(f"contrast {arm}:{reference}: {bad[0]!r} is not an arm name; expected {_ACCEPTED}")
    if "default" in (arm, reference):
        raise ValueError(f"contrast {arm}:{reference}: every arm is already compared with default; expected "
                         f"{_ACCEPTED}")
    if arm == reference:
        raise ValueError(f"contrast {arm}:{reference}: an arm against itself; expected {_ACCEPTED}")
    return arm, reference


def parse_contrast(text: str) -> Tuple[str, str]:
    """``"conditioned:scale_matched"`` -> ("conditioned", "scale_matched"); raises ValueError otherwise."""
    parts = str(text).split(":")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ValueError(f"contrast {text!r}: expected {_ACCEPTED}")
    return check_contrast(*parts)


def resolve_contrasts(present: Iterable[str], requested: Sequence[Tuple[str, str]] = ()
                      ) -> Tuple[List[Tuple[str, str]], List[str]]:
    """
    The contrasts of one stage whose arms ``present`` ran, and a note for each requested one that cannot be
    made there. The default contrasts come first (only where both arms ran, without a note otherwise), then
    the requested ones in their order; a requested contrast of the same two arms as a default one replaces
    it (its direction is the one asked for), and repeats are made once.
    """
    present = set(present)
    requested = [check_contrast(a, b) for a, b in requested]
    asked = {frozenset(c) for c in requested}
    pairs = [c for c in DEFAULT_CONTRASTS if frozenset(c) not in asked and set(c) <= present]
    notes, seen = [], {frozenset(c) for c in pairs}
    for a, b in requested:
        if frozenset((a, b)) in seen:
            continue
        seen.add(frozenset((a, b)))
        missing = [x for x in (a, b) if x not in present]
        if missing:
            notes.append(f"contrast {a} vs {b} not made: no finished {' or '.join(missing)} run in this stage "
                         f"(arms here: {', '.join(sorted(present)) or 'none'})")
        else:
            pairs.append((a, b))
    return pairs, notes


# What a contrast's answer means, for the contrasts whose arms say what they isolate.
_SCALE_QUESTION = {
    ("conditioned", "scale_matched"): {
        "better": "the conditioning adds to the scale's effect",
        "worse": "the weights' scale alone does better than the conditioning",
    },
    ("scale_matched", "conditioned"): {
        "better": "the weights' scale alone does better than the conditioning",
        "worse": "the conditioning adds to the scale's effect",
    },
}


def contrast_meaning(arm: str, reference: str, verdict: str, replication: str, num_seeds: int) -> Optional[str]:
    """
    The answer of a contrast's verdict in the question's terms, or None (one trained model per arm: the
    verdict is about these images, and the line says how many seeds the question needs instead).
    conditioned vs scale_matched: "the conditioning adds to the scale's effect" (better), or "the difference
    from default is not separated from the weights' scale at n = 3" (not distinguishable).
    """
    if replication == IMAGES:
        return None
    pair = (arm, reference)
    same = verdict in (verdict_text("same", reference), verdict_text("same_family", reference))
    if pair in _SCALE_QUESTION:
        if same:
            return f"the difference from default is not separated from the weights' scale at n = {num_seeds}"
        for kind, text in _SCALE_QUESTION[pair].items():
            if verdict == verdict_text(kind, reference):
                return text
        return None
    if same:
        return f"{arm} and {reference} are not separated at n = {num_seeds}"
    return None
