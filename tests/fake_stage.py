"""A training stage that trains nothing: its "config" is a list of ``key=value`` overrides and its training follows
a script. What a third stage would write, and what the launcher's tests drive every branch with.

It has its own descriptor (one ``"fake"`` record kind with a ``score`` metric, counted in iterations); the launcher,
the status command and the report read its runs with no code of their own for it.
"""

import os
import time

from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.stage import ConfigDefaults, Metric, Stage, StageDescriptor
from condinit_det.utils.errors import UsageError

SCORE = Metric("score", "score", "score (%)", "score", short="score")
FAKE = StageDescriptor(
    name="fake",
    title="Fake: a score",
    unit="iteration",
    eval_kind="fake",
    eval_only_kind="fake_eval",
    table=(SCORE,),
    headline=(SCORE,),
    plots=((SCORE, "score.png"),),
    loss_plot="fake_loss.png",
    kappa_plot="fake_kappa.png",
)


def wait_for(path: str, timeout: float = 120.0) -> None:
    """Block until ``path`` exists (a test's signal that a "training" may end)."""
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:g} s")
        time.sleep(0.05)


def score(arm: str, seed: int, iteration: int) -> float:
    """The fake evaluation's score: rises with the iteration, higher for 'conditioned', a little noise per seed."""
    return 10.0 + iteration + (5.0 if arm == "conditioned" else 0.0) + 0.25 * ((seed * 7) % 3)


class FakeStage(Stage):
    """A stage whose "config" is a dict and whose training follows a script: what a test needs to drive every
    branch of the launcher without training anything."""

    descriptor = FAKE
    run_keys = ("output_dir", "arm", "seed", "hold")  # "hold" paces a test, it is no setting of the runs

    def __init__(self, script=None):
        self.script = script or {}  # arm -> callable(run_dir) run in place of training
        self.trained = []

    def load_config(self, config_file, opts):
        cfg = {"output_dir": "", "arm": "default", "seed": 0, "length": 10, "hold": ""}
        for opt in opts:
            key, _, value = opt.partition("=")
            if key not in cfg:
                raise UsageError(f"unknown key {key!r}; accepted: {', '.join(cfg)}")
            cfg[key] = int(value) if key in ("seed", "length") else value
        return cfg

    def defaults(self, cfg):
        return ConfigDefaults(output_dir=cfg["output_dir"], arm=cfg["arm"], seed=cfg["seed"])

    def configure_run(self, cfg, spec, run_dir, *, init_from=None):
        return {**cfg, "arm": spec.arm, "seed": spec.seed, "lr_scale": spec.lr_scale, "run_dir": run_dir}

    def length(self, cfg):
        return cfg["length"]

    def steps(self, cfg):
        return 2 * cfg["length"]

    def device(self, cfg):
        return "cpu"

    def identity(self, cfg):
        return {"arm": cfg["arm"], "seed": cfg["seed"], "lr_scale": cfg["lr_scale"]}

    def check(self, options, runs, *, upstream=None):
        if any(cfg["arm"] == "mimetic" and cfg["length"] < 0 for _, cfg in runs):
            raise ValueError("mimetic needs a positive length")

    def finished(self, run_dir, length):
        rf = ResultsFile(run_dir)
        return rf.exists() and any(r["iteration"] >= length for r in rf.records(FAKE.eval_kind))

    def train(self, options, cfg, run_dir):
        os.makedirs(run_dir, exist_ok=True)
        if cfg["hold"]:  # a long training: it ends when the file appears
            wait_for(cfg["hold"])
        self.trained.append(RunSpec(cfg["arm"], cfg["seed"], cfg["lr_scale"]))
        action = self.script.get(cfg["arm"])
        if action is not None:
            action(run_dir)
        meta = {"arm": cfg["arm"], "seed": cfg["seed"], "lr_scale": cfg["lr_scale"]}
        ResultsFile(run_dir).extend(
            {"kind": FAKE.eval_kind, "iteration": it, **meta, "score": score(cfg["arm"], cfg["seed"], it)}
            for it in (cfg["length"] // 2, cfg["length"])
        )

    def evaluate(self, options, cfg, run_dir):
        ResultsFile(run_dir).add({"kind": FAKE.eval_only_kind, "iteration": 0, "arm": cfg["arm"]})
