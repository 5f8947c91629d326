"""The arm report of a run (``condinit_arm_report.json``, :func:`condinit_det.records.identity.write_arm_report`):
the build's :class:`~condinit_det.init.InitReport`, the run identity ``--resume`` checks, and per site where its
weights finally came from (``weights_from``: the arm, or the checkpoint that overwrote it)."""

import logging
import os
from typing import Dict, List, Mapping, Optional

import torch

from ..init import InitReport, find_attention
from ..records.identity import ARM_REPORT_FILENAME, write_arm_report

__all__ = ["AttentionSnapshot", "log_arm_report", "save_arm_report"]

logger = logging.getLogger("detectron2")


class AttentionSnapshot:
    """Copies of every attention projection parameter, to tell later which sites a checkpoint overwrote."""

    def __init__(self, model: torch.nn.Module):
        params = dict(model.named_parameters())
        self.names_by_site: Dict[str, List[str]] = {
            site.name: [n for n in site.parameter_names() if n in params] for site in find_attention(model)
        }
        self._values = {n: params[n].detach().clone() for names in self.names_by_site.values() for n in names}

    def overwritten(self, model: torch.nn.Module) -> List[str]:
        """Sites at least one of whose parameters differs from the snapshot."""
        params = dict(model.named_parameters())
        return [
            site
            for site, names in self.names_by_site.items()
            if any(not torch.equal(params[n].detach(), self._values[n]) for n in names)
        ]


def weights_from(
    report: InitReport, overwritten: List[str], checkpoint: Optional[str], checkpoint_arm: Optional[str]
) -> Dict[str, str]:
    """site name -> provenance of its weights after loading ``checkpoint``."""
    source = f"checkpoint {checkpoint}" + (f" (pretrained with arm {checkpoint_arm})" if checkpoint_arm else "")
    return {s.name: source if s.name in overwritten else f"arm {report.arm}" for s in report.sites}


def log_arm_report(report: InitReport, provenance: Optional[Mapping[str, str]] = None) -> None:
    sites = report.sites
    logger.info(
        f"Attention-init arm '{report.arm}' (seed {report.seed}, options {report.options}): "
        f"{len(sites)} attention site(s), {len(report.changed_parameters())} parameter(s) changed."
    )
    for s in sites:
        origin = f" <- {provenance[s.name]}" if provenance and s.name in provenance else ""
        logger.info(
            f"  {s.name} [{s.kind}] heads={s.num_heads} dh={s.head_dim}: {', '.join(s.changed) or 'unchanged'}{origin}"
        )


def save_arm_report(
    output_dir: str,
    report: InitReport,
    identity: Mapping,
    provenance: Optional[Mapping[str, str]] = None,
    *,
    init_checkpoint: Optional[str] = None,
) -> str:
    """Write the arm report with the run identity and per-site provenance; returns its path."""
    data = report.to_dict()
    for site in data["sites"]:
        site["weights_from"] = (provenance or {}).get(site["name"], f"arm {report.arm}")
    data["init_checkpoint"] = init_checkpoint or None
    path = write_arm_report(output_dir, data, identity)
    logger.info(f"Arm report saved to {os.path.join(output_dir, ARM_REPORT_FILENAME)}")
    return path
