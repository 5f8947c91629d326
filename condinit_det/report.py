"""
Comparison of initialization arms across training runs.

A *run directory* holds ``results.json`` (:class:`condinit_det.engine.results.ResultsFile`)
and usually ``condinit_arm_report.json``; an *experiment directory* contains run
directories at any depth (e.g. the ``<output_dir>/{default,mimetic,conditioned}/`` written
by ``tools/train_net.py --arm all``). Runs are grouped by arm; several runs of one arm
(different seeds) are summarized as mean ± sample standard deviation (ddof=1).

Reported, in the paper's layout: final-iteration box and mask AP per arm, the AP-vs-iteration
curves, and the convergence metric -- the first evaluated iteration at which an arm's
(seed-averaged) AP reaches the default arm's final AP, and the speed-up
``(1 - it / it_default_final) * 100`` percent. κ-vs-iteration is plotted when the runs hold
``"conditioning"`` records.

This module does not import detectron2.
"""
import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from condinit_det.engine.results import RESULTS_FILENAME, ResultsFile
from condinit_det.fileio import atomic_write

__all__ = [
    "ARM_ORDER",
    "TABLE_COLUMNS",
    "Run",
    "ArmSummary",
    "ArmsReport",
    "find_runs",
    "summarize_runs",
    "write_report",
    "compare_arms",
]

ARM_ORDER = ("default", "mimetic", "conditioned")
ARM_REPORT_FILENAME = "condinit_arm_report.json"
# (column header, task, metric key in the "ap" record)
TABLE_COLUMNS = (
    ("AP^b", "bbox", "AP"),
    ("AP^b_50", "bbox", "AP50"),
    ("AP^b_75", "bbox", "AP75"),
    ("AP^m", "segm", "AP"),
    ("AP^m_50", "segm", "AP50"),
    ("AP^m_75", "segm", "AP75"),
)
_TASK_TITLES = {"bbox": "box AP", "segm": "mask AP"}


@dataclass
class Run:
    """One training run: its directory, arm, seed and results records."""

    path: str
    arm: str
    seed: Optional[int]
    records: List[dict]

    def curve(self, task: str, metric: str = "AP") -> Tuple[np.ndarray, np.ndarray]:
        """(iterations [N], values [N]) of one metric over the run's "ap" records; NaN if missing."""
        its, vals = [], []
        for r in self.records:
            if r["kind"] != "ap":
                continue
            its.append(r["iteration"])
            vals.append(_metric(r, task, metric))
        return np.asarray(its, dtype=np.int64), np.asarray(vals, dtype=np.float64)


def _metric(record: dict, task: str, metric: str) -> float:
    value = (record.get(task) or {}).get(metric)
    return float("nan") if value is None else float(value)


def _is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, RESULTS_FILENAME))


def _load_run(path: str) -> Run:
    records = ResultsFile(path).records()
    arm = seed = None
    arm_report_path = os.path.join(path, ARM_REPORT_FILENAME)
    if os.path.isfile(arm_report_path):
        with open(arm_report_path) as f:
            arm_report = json.load(f)
        arm, seed = arm_report.get("arm"), arm_report.get("seed")
    # The training seed of the "ap" records identifies the repetition (data order and every
    # non-attention weight); the arm report's seed only drives the arm's own generator.
    for r in [r for r in records if r["kind"] != "ap"] + [r for r in records if r["kind"] == "ap"]:
        if r.get("arm") is not None:
            arm = r["arm"]
        if r.get("seed") is not None:
            seed = r["seed"]
    if arm is None:
        raise ValueError(
            f"Cannot tell the arm of run {path}: neither {ARM_REPORT_FILENAME} nor the records "
            f"of {RESULTS_FILENAME} name it."
        )
    return Run(path=path, arm=str(arm), seed=seed, records=records)


def find_runs(paths: Sequence[str]) -> List[Run]:
    """
    Runs found under ``paths``: each path is a run directory or a directory searched
    recursively for run directories. Raises ValueError for a path without any run.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    runs, seen = [], set()
    for p in paths:
        p = os.fspath(p)
        if not os.path.isdir(p):
            raise ValueError(f"{p} is not a directory; expected a run or experiment directory.")
        found = []
        for root, dirs, _files in os.walk(p):
            dirs.sort()
            if _is_run_dir(root):
                found.append(root)
        if not found:
            raise ValueError(
                f"No runs under {p}: a run directory contains {RESULTS_FILENAME} "
                f"(written by tools/train_net.py); an experiment directory contains run directories."
            )
        for root in found:
            real = os.path.realpath(root)
            if real not in seen:
                seen.add(real)
                runs.append(_load_run(root))
    return runs


def _mean_std(values: Sequence[float]) -> Tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0 or np.isnan(v).any():
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


@dataclass
class ArmSummary:
    """Seed-aggregated results of one arm."""

    arm: str
    runs: List[Run]
    final: Dict[str, Tuple[float, float]] = field(default_factory=dict)  # column -> (mean, std)
    final_iterations: List[int] = field(default_factory=list)
    # task -> (iterations [N], mean [N], std [N]) over the iterations every seed evaluated
    curves: Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # task -> first iteration reaching the default arm's final AP (None: not reached)
    reach_iteration: Dict[str, Optional[int]] = field(default_factory=dict)
    speedup: Dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def seeds(self) -> List[Optional[int]]:
        return [r.seed for r in self.runs]


@dataclass
class ArmsReport:
    arms: List[ArmSummary]
    default_final: Dict[str, Tuple[Optional[int], float]]  # task -> (iteration, mean AP)
    kappa: Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # arm -> its, med, lo, hi

    def arm(self, name: str) -> ArmSummary:
        for a in self.arms:
            if a.arm == name:
                return a
        raise KeyError(f"No runs of arm {name!r}; arms present: {[a.arm for a in self.arms]}")


def _seed_curve(runs: List[Run], task: str):
    per_run = [dict(zip(*map(list, r.curve(task)))) for r in runs]
    common = sorted(set.intersection(*[set(c) for c in per_run])) if per_run else []
    its = np.asarray(common, dtype=np.int64)
    vals = np.asarray([[c[i] for i in common] for c in per_run], dtype=np.float64)  # [S, N]
    if len(common) == 0:
        empty = np.zeros(0)
        return its, empty, empty
    std = vals.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(len(common))
    return its, vals.mean(axis=0), std


def _kappa_curve(runs: List[Run]):
    """Median and range over sites (and seeds) of κ per iteration."""
    by_it: Dict[int, List[float]] = {}
    for run in runs:
        for r in run.records:
            if r["kind"] == "conditioning" and r.get("kappa") is not None:
                k = float(r["kappa"])
                if math.isfinite(k) and k > 0:
                    by_it.setdefault(r["iteration"], []).append(k)
    its = np.asarray(sorted(by_it), dtype=np.int64)
    med = np.asarray([np.median(by_it[i]) for i in its])
    lo = np.asarray([np.min(by_it[i]) for i in its])
    hi = np.asarray([np.max(by_it[i]) for i in its])
    return its, med, lo, hi


def summarize_runs(runs: Sequence[Run]) -> ArmsReport:
    """Group runs by arm, aggregate final APs over seeds and compute the convergence metric."""
    if not runs:
        raise ValueError("No runs to compare.")
    by_arm: Dict[str, List[Run]] = {}
    for r in runs:
        by_arm.setdefault(r.arm, []).append(r)
    order = [a for a in ARM_ORDER if a in by_arm] + sorted(a for a in by_arm if a not in ARM_ORDER)

    summaries = []
    for arm in order:
        arm_runs = sorted(by_arm[arm], key=lambda r: (r.seed is None, r.seed, r.path))
        seeds = [r.seed for r in arm_runs]
        dup = {s for s in seeds if s is not None and seeds.count(s) > 1}
        if dup:
            paths = [r.path for r in arm_runs if r.seed in dup]
            raise ValueError(f"Arm {arm!r} has several runs with seed {sorted(dup)}: {paths}")
        s = ArmSummary(arm=arm, runs=arm_runs)
        for run in arm_runs:
            aps = [r for r in run.records if r["kind"] == "ap"]
            if not aps:
                raise ValueError(f"Run {run.path} has no 'ap' records in {RESULTS_FILENAME}.")
            s.final_iterations.append(aps[-1]["iteration"])
        for col, task, metric in TABLE_COLUMNS:
            finals = [_metric([r for r in run.records if r["kind"] == "ap"][-1], task, metric)
                      for run in arm_runs]
            s.final[col] = _mean_std(finals)
        for task in _TASK_TITLES:
            s.curves[task] = _seed_curve(arm_runs, task)
        summaries.append(s)

    default_final: Dict[str, Tuple[Optional[int], float]] = {}
    if "default" in by_arm:
        d = summaries[order.index("default")]
        for task in _TASK_TITLES:
            its, mean, _ = d.curves[task]
            # Final point of the seed-averaged curve (all seeds evaluated there).
            default_final[task] = (int(its[-1]), float(mean[-1])) if len(its) else (None, float("nan"))
        for s in summaries:
            for task in _TASK_TITLES:
                it_final, target = default_final[task]
                its, mean, _ = s.curves[task]
                reached = np.nonzero(mean >= target)[0] if math.isfinite(target) else []
                if len(reached) and it_final:
                    it = int(its[reached[0]])
                    s.reach_iteration[task] = it
                    s.speedup[task] = (1.0 - it / it_final) * 100.0
                else:
                    s.reach_iteration[task] = None
                    s.speedup[task] = None

    kappa = {s.arm: _kappa_curve(s.runs) for s in summaries}
    kappa = {a: k for a, k in kappa.items() if len(k[0])}
    return ArmsReport(arms=summaries, default_final=default_final, kappa=kappa)


def _fmt(mean: float, std: float, n: int, digits: int = 1) -> str:
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def format_markdown(report: ArmsReport) -> str:
    """The comparison as Markdown (tables in the paper's layout)."""
    out = io.StringIO()
    out.write("# Initialization arms: COCO box / mask AP\n\n")
    multi = any(len(s.runs) > 1 for s in report.arms)
    out.write(
        "Final-iteration AP (percent)"
        + (", mean ± sample std over seeds" if multi else "")
        + ".\n\n"
    )
    header = ["arm"] + [c for c, _, _ in TABLE_COLUMNS] + ["seeds", "final iter"]
    out.write("| " + " | ".join(header) + " |\n")
    out.write("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|\n")
    for s in report.arms:
        n = len(s.runs)
        cells = [s.arm] + [_fmt(*s.final[c], n) for c, _, _ in TABLE_COLUMNS]
        seeds = ",".join("?" if x is None else str(x) for x in s.seeds)
        its = sorted(set(s.final_iterations))
        cells += [seeds, str(its[0]) if len(its) == 1 else f"{its[0]}-{its[-1]}"]
        out.write("| " + " | ".join(cells) + " |\n")

    out.write("\n## Convergence\n\n")
    if not report.default_final:
        out.write("No runs of the default arm: the speed-up needs one as the reference.\n")
    else:
        out.write(
            "First evaluated iteration at which an arm reaches the default arm's final AP, and "
            "the speed-up (1 - it / it_default_final) x 100.\n\n"
        )
        for task, title in _TASK_TITLES.items():
            it_final, target = report.default_final[task]
            out.write(f"- default final {title}: {target:.2f} at iteration {it_final}\n")
        out.write("\n| arm | box: iteration | box: speed-up | mask: iteration | mask: speed-up |\n")
        out.write("|---|---:|---:|---:|---:|\n")
        for s in report.arms:
            cells = [s.arm]
            for task in _TASK_TITLES:
                it = s.reach_iteration.get(task)
                sp = s.speedup.get(task)
                cells += ["not reached", "not reached"] if it is None else [str(it), f"{sp:.1f}%"]
            out.write("| " + " | ".join(cells) + " |\n")

    out.write("\n## Runs\n\n")
    for s in report.arms:
        for r in s.runs:
            out.write(f"- {s.arm} (seed {r.seed}): {r.path}\n")
    return out.getvalue()


def format_csv(report: ArmsReport) -> str:
    """One row per arm: mean and std of every table column, seeds, and the convergence metric."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = ["arm", "num_seeds", "seeds", "final_iteration"]
    for c, _, _ in TABLE_COLUMNS:
        header += [c, c + "_std"]
    for task in _TASK_TITLES:
        header += [f"{task}_reach_iteration", f"{task}_speedup_percent"]
    w.writerow(header)
    for s in report.arms:
        row = [s.arm, len(s.runs), " ".join(str(x) for x in s.seeds), max(s.final_iterations)]
        for c, _, _ in TABLE_COLUMNS:
            row += [repr(v) if math.isfinite(v) else "" for v in s.final[c]]
        for task in _TASK_TITLES:
            it, sp = s.reach_iteration.get(task), s.speedup.get(task)
            row += ["" if it is None else it, "" if sp is None else repr(sp)]
        w.writerow(row)
    return buf.getvalue()


def format_curves_csv(report: ArmsReport) -> str:
    """Long format: arm, seed, iteration, task, AP (every evaluated point of every run)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["arm", "seed", "run", "iteration", "task", "AP", "AP50", "AP75"])
    for s in report.arms:
        for run in s.runs:
            for r in run.records:
                if r["kind"] != "ap":
                    continue
                for task in _TASK_TITLES:
                    vals = [_metric(r, task, m) for m in ("AP", "AP50", "AP75")]
                    w.writerow([s.arm, run.seed, run.path, r["iteration"], task]
                               + [repr(v) if math.isfinite(v) else "" for v in vals])
    return buf.getvalue()


def _plot(path: str, draw) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        draw(ax)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue())


def write_report(report: ArmsReport, output_dir: str) -> Dict[str, str]:
    """
    Write ``report.md``, ``summary.csv``, ``curves.csv``, ``bbox_ap.png``, ``segm_ap.png`` and
    (with conditioning records) ``kappa.png`` into ``output_dir``. Returns name -> path.
    """
    os.makedirs(output_dir, exist_ok=True)
    files = {
        "report.md": format_markdown(report),
        "summary.csv": format_csv(report),
        "curves.csv": format_curves_csv(report),
    }
    paths = {}
    for name, text in files.items():
        paths[name] = os.path.join(output_dir, name)
        atomic_write(paths[name], text)

    for task, title in _TASK_TITLES.items():
        def draw(ax, task=task, title=title):
            for s in report.arms:
                its, mean, std = s.curves[task]
                (line,) = ax.plot(its, mean, marker="o", ms=3, label=s.arm)
                if len(s.runs) > 1:
                    ax.fill_between(its, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            if report.default_final.get(task, (None,))[0] is not None:
                ax.axhline(report.default_final[task][1], color="gray", ls="--", lw=1,
                           label="default final")
            ax.set_xlabel("iteration")
            ax.set_ylabel(title)
            ax.set_title(f"{title} vs iteration")

        paths[f"{task}_ap.png"] = os.path.join(output_dir, f"{task}_ap.png")
        _plot(paths[f"{task}_ap.png"], draw)

    if report.kappa:
        def draw_kappa(ax):
            for arm, (its, med, lo, hi) in report.kappa.items():
                (line,) = ax.plot(its, med, marker="o", ms=3, label=f"{arm} (median over sites)")
                ax.fill_between(its, lo, hi, color=line.get_color(), alpha=0.15)
            ax.set_yscale("log")
            ax.set_xlabel("iteration")
            ax.set_ylabel("κ (condition number)")
            ax.set_title("attention conditioning vs iteration")

        paths["kappa.png"] = os.path.join(output_dir, "kappa.png")
        _plot(paths["kappa.png"], draw_kappa)
    return paths


def compare_arms(paths: Sequence[str], output_dir: Optional[str] = None) -> Tuple[ArmsReport, str]:
    """
    Find runs under ``paths``, summarize them and (if ``output_dir``) write the report files.
    Returns the report and its Markdown text.
    """
    report = summarize_runs(find_runs(paths))
    if output_dir is not None:
        write_report(report, output_dir)
    return report, format_markdown(report)
