"""The structure x scale design of one section: four arms, one per cell (structure random or conditioned, scale the
default init's or the conditioned arm's), and its effects, each a weighted sum of the four arms' values of one seed
(docs/comparing_arms.md, "What the gain is made of")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from .statistics import BETTER, TOO_FEW_SEEDS, WORSE

FACTORIAL = "factorial"  # the reference of an effect row in the report's tables
STRUCTURES = ("random", "conditioned")
SCALES = ("default", "conditioned")
# (structure, scale) -> the arm of that cell
CELLS = {
    ("random", "default"): "default",
    ("random", "conditioned"): "scale_matched",
    ("conditioned", "default"): "structured",
    ("conditioned", "conditioned"): "conditioned",
}
# The options the four arms must share for the cells to differ in their factors only (the runs' arm reports).
_SHARED = ("gain_qk", "gain_v", "value_mode")


@dataclass(frozen=True)
class Effect:
    """One effect of the design: its name, what it is, and its weight on each arm's value of a seed."""

    name: str
    label: str
    weights: Tuple[Tuple[str, float], ...]

    @property
    def pair(self) -> Optional[Tuple[str, str]]:
        """(A, B) when the effect is the difference A - B of two arms (a simple effect), else None."""
        return (self.weights[0][0], self.weights[1][0]) if len(self.weights) == 2 else None

    @property
    def formula(self) -> str:
        """``"½ (conditioned − scale_matched + structured − default)"``."""
        scale = abs(self.weights[0][1])
        terms = " ".join(f"{'−' if w < 0 else '+'} {arm}" for arm, w in self.weights).lstrip("+ ")
        return terms if scale == 1.0 else f"½ ({terms})"


# The four simple effects (each a difference of two arms, also a row of the section's table), then the two main
# effects and the interaction (rows of their own).
EFFECTS = (
    Effect("structure_at_default_scale", "structure at the default scale", (("structured", 1.0), ("default", -1.0))),
    Effect(
        "structure_at_conditioned_scale",
        "structure at the conditioned scale",
        (("conditioned", 1.0), ("scale_matched", -1.0)),
    ),
    Effect("scale_at_random_structure", "scale at the random structure", (("scale_matched", 1.0), ("default", -1.0))),
    Effect(
        "scale_at_conditioned_structure",
        "scale at the conditioned structure",
        (("conditioned", 1.0), ("structured", -1.0)),
    ),
    Effect(
        "structure",
        "structure (main effect)",
        (("conditioned", 0.5), ("scale_matched", -0.5), ("structured", 0.5), ("default", -0.5)),
    ),
    Effect(
        "scale",
        "scale (main effect)",
        (("conditioned", 0.5), ("structured", -0.5), ("scale_matched", 0.5), ("default", -0.5)),
    ),
    Effect(
        "interaction",
        "structure × scale (interaction)",
        (("conditioned", 1.0), ("scale_matched", -1.0), ("structured", -1.0), ("default", 1.0)),
    ),
)
JOINT_EFFECTS = tuple(e for e in EFFECTS if e.pair is None)  # the rows of the design's own family
EFFECT_LABELS = {e.name: e.label for e in EFFECTS}


def design_problem(present: Mapping[str, List[Optional[dict]]]) -> Optional[str]:
    """Why the arms ``present`` (arm -> the resolved options of each of its runs, None where unrecorded) do not form
    the design: a missing cell, or options that make two cells differ in more than their factors; None when they
    do."""
    missing = [arm for arm in CELLS.values() if arm not in present]
    if missing:
        return f"no finished {' or '.join(missing)} run"
    recorded = {arm: [o for o in options if o is not None] for arm, options in present.items()}
    for arm in ("scale_matched", "structured"):
        for key in _SHARED:
            values = {repr(o.get(key)) for o in recorded["conditioned"] + recorded[arm]}
            if len(values) > 1:
                return f"the conditioned and {arm} runs have different {key} ({', '.join(sorted(values))})"
    norms = {o.get("norm") for o in recorded["scale_matched"] + recorded["structured"]}
    if len(norms) > 1:
        return f"scale_matched and structured matched different norms ({', '.join(sorted(map(str, norms)))})"
    if any(o.get("condition_output") for o in recorded["conditioned"]):
        return "the conditioned runs also conditioned W_O (condition_output), which no other cell changes"
    return None


def carried_by(structure: str, scale: str, interaction: str) -> str:
    """Which factor the verdicts of the main effects and the interaction show: ``"interaction"`` (the factors
    interact: the main effects do not summarize them), ``"structure"``, ``"scale"``, ``"both"``, ``"neither"``, or
    ``"too few seeds"``."""
    if TOO_FEW_SEEDS in (structure, scale, interaction):
        return TOO_FEW_SEEDS
    shown = {name for name, v in (("structure", structure), ("scale", scale)) if v in (BETTER, WORSE)}
    if interaction in (BETTER, WORSE):
        return "interaction"
    return {0: "neither", 2: "both"}.get(len(shown)) or shown.pop()


def reading(metric: str, rows: Dict[str, object], seeds: int) -> str:
    """The section's sentence on ``metric`` (after its name): which factor carries the difference, or that neither
    is shown. ``rows``: effect name -> its row (``mean_difference``, ``adjusted``, ``verdict``)."""

    def quote(name: str) -> str:  # Δ with the interval its verdict reads
        iv = rows[name].adjusted
        return f"{rows[name].mean_difference:+.1f}" + (f" [{iv.low:+.1f}, {iv.high:+.1f}]" if iv is not None else "")

    verdicts = [rows[name].verdict for name in ("structure", "scale", "interaction")]
    carried = carried_by(*verdicts)
    main = f"structure {quote('structure')}, scale {quote('scale')}"
    if carried == TOO_FEW_SEEDS and seeds == 0:
        return "no seed is common to the four cells, so no effect can be measured: run the same seeds in every arm."
    if carried == TOO_FEW_SEEDS:
        return (
            f"one seed common to the four cells, so no factor can be shown ({main}, interaction "
            f"{quote('interaction')}); run ≥ 3 seeds per arm."
        )
    if carried == "interaction":
        return (
            f"the factors interact (interaction {quote('interaction')}): the structure changes {metric} by "
            f"{quote('structure_at_default_scale')} at the default scale and by "
            f"{quote('structure_at_conditioned_scale')} at the conditioned scale; read the simple effects, not the "
            "main effects."
        )
    if carried == "neither":
        # a simple effect can be shown where neither main effect is: then the factors' effect is not "none"
        simple = [f"{e.label} {quote(e.name)}" for e in EFFECTS if e.pair and rows[e.name].verdict in (BETTER, WORSE)]
        over = f"{seeds} seeds ({main}, interaction {quote('interaction')})"
        if simple:
            return f"no main effect or interaction is shown over {over}, only simple effects: {', '.join(simple)}."
        return f"neither factor is shown to change it over {over}."
    if carried == "both":
        return f"both factors change it ({main}); their interaction is not shown."
    other = "scale" if carried == "structure" else "structure"
    return (
        f"the difference is carried by the {carried} (main effect {quote(carried)}); the {other}'s is not "
        f"shown ({quote(other)}), nor an interaction."
    )
