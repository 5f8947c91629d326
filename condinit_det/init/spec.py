"""The arm node a config of either stage carries (``configs/common/condinit.py``: ``arm``, ``seed`` (None or negative:
0), ``include`` / ``exclude`` fnmatch patterns, per-arm ``options``), validated into an :class:`ArmSpec` and applied.
Every arm's options are validated whichever arm runs, so ``--arm all`` fails before a run (docs/arms.md#options).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from torch import nn

from .apply import InitReport, apply_init
from .options import ARM_OPTIONS, ARMS, CONTROLS, SHARED_OPTIONS, resolve_options

__all__ = ["ARM_NODE_KEYS", "ArmError", "ArmSpec", "apply_arm_spec", "plain", "prefixed", "resolve_arm_node"]

ARM_NODE_KEYS = ("arm", "seed", "include", "exclude", "options")


class ArmError(ValueError):
    """The arm cannot be applied to this model as configured (no attention site, a pattern that matches
    no site, a head count that does not divide the width, ...); the message says what is accepted."""


def plain(value):
    """OmegaConf containers -> plain Python (lists/dicts), resolving interpolations; anything else unchanged."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


@dataclass(frozen=True)
class ArmSpec:
    """A validated arm node: what :func:`apply_arm_spec` applies."""

    arm: str
    seed: int = 0
    include: Optional[List[str]] = None
    exclude: Optional[List[str]] = None
    options: Dict[str, Dict[str, object]] = field(default_factory=dict)  # per arm, as given

    @property
    def arm_options(self) -> Dict[str, object]:
        """The running arm's options as given, a control's with the conditioned arm's shared options."""
        options = dict(self.options.get(self.arm, {}))
        if self.arm in CONTROLS:
            conditioned = self.options.get("conditioned", {})
            options.update({key: conditioned[key] for key in SHARED_OPTIONS if key in conditioned})
        return options

    def identity(self) -> dict:
        """The fields a resumed run must share (see :mod:`condinit_det.records.layout`)."""
        return {
            "arm": self.arm,
            "arm_seed": self.seed,
            "include": self.include,
            "exclude": self.exclude,
            "options": resolve_options(self.arm, self.arm_options),
        }


def _patterns(value, key: str) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        return list(value)
    raise ValueError(f"condinit.{key} must be None, a pattern or a list of fnmatch patterns; got {value!r}")


def resolve_arm_node(node: Optional[Mapping]) -> ArmSpec:
    """Validate a config's arm node; a missing node is the default arm. Raises ValueError saying what is accepted."""
    node = dict(plain(node) or {"arm": "default"})
    unknown = sorted(set(node) - set(ARM_NODE_KEYS))
    if unknown:
        raise ValueError(f"condinit has unknown key(s) {', '.join(unknown)}; accepted: {', '.join(ARM_NODE_KEYS)}")
    arm = node.get("arm")
    if arm not in ARMS:
        raise ValueError(f"condinit.arm={arm!r} is not an arm; accepted: {', '.join(ARMS)}")
    seed = node.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"condinit.seed must be an integer or None; got {seed!r}")
    options = node.get("options") or {}
    if not isinstance(options, Mapping):
        raise ValueError(f"condinit.options must map arm names to option dicts; got {options!r}")
    for key in sorted(k for k in options if k not in ARMS):
        owners = [a for a in ARMS if key in ARM_OPTIONS[a]]
        if owners:
            others = "".join(f" or condinit.options.{a}.{key}=..." for a in owners[1:])
            raise ValueError(
                f"condinit.options takes one entry per arm: write condinit.options.{owners[0]}.{key}=...{others} "
                f"(entries accepted: {', '.join(ARMS)})"
            )
        raise ValueError(f"condinit.options.{key}: {key!r} is not an arm; entries accepted: {', '.join(ARMS)}")
    per_arm = {}
    for name, opts in options.items():
        opts = dict(opts or {})
        shared = [key for key in SHARED_OPTIONS if key in opts and name in CONTROLS]
        if shared:
            raise ValueError(
                f"condinit.options.{name}.{shared[0]}: the {name} arm takes {', '.join(SHARED_OPTIONS)} from the "
                f"conditioned arm, so that the arms it controls for stay consistent; write "
                f"condinit.options.conditioned.{shared[0]}=... (accepted under {name}: {', '.join(ARM_OPTIONS[name])})"
            )
        try:
            resolve_options(name, opts)
        except ValueError as e:
            raise ValueError(f"condinit.options.{name}: {e}") from None
        per_arm[name] = opts
    return ArmSpec(
        arm=arm,
        seed=max(int(seed or 0), 0),
        include=_patterns(node.get("include"), "include"),
        exclude=_patterns(node.get("exclude"), "exclude"),
        options=per_arm,
    )


def prefixed(module: nn.Module, prefix: str) -> nn.Module:
    """``module`` held under the dotted path ``prefix`` (e.g. ``"backbone."``), so that its attention
    sites are named as in the full model; ``module`` itself when the prefix is empty."""
    parts = [p for p in prefix.split(".") if p]
    for part in reversed(parts):
        holder = nn.Module()
        holder.add_module(part, module)
        module = holder
    return module


def apply_arm_spec(module: nn.Module, spec: ArmSpec, *, site_prefix: str = "") -> InitReport:
    """Apply ``spec`` to ``module`` in place; site names get ``site_prefix`` (e.g. ``"backbone."``)."""
    try:
        return apply_init(
            prefixed(module, site_prefix),
            spec.arm,
            seed=spec.seed,
            include=spec.include,
            exclude=spec.exclude,
            **spec.arm_options,
        )
    except ValueError as e:
        raise ArmError(str(e)) from None
