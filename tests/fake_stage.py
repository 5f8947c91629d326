"""A training stage that trains nothing: its "config" is a list of ``key=value`` overrides and its training follows
a script. What a third stage would write, and what the launcher's tests drive every branch with."""
import os
import time

from condinit_det.launch.stage import ConfigDefaults, Stage
from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.utils.errors import UsageError


def wait_for(path: str, timeout: float = 120.0) -> None:
    """Block until ``path`` exists (a test's signal that a "training" may end)."""
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:g} s")
        time.sleep(0.05)


class FakeStage(Stage):
    """A stage whose "config" is a dict and whose training follows a script: what a test needs to drive every
    branch of the launcher without training anything."""

    name = "fake"
    unit = "iteration"

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

    def check(self, args, runs, *, upstream=None):
        if any(cfg["arm"] == "mimetic" and cfg["length"] < 0 for _, cfg in runs):
            raise ValueError("mimetic needs a positive length")

    def finished(self, run_dir, length):
        rf = ResultsFile(run_dir)
        return rf.exists() and any(r["iteration"] >= length for r in rf.records("ap"))

    def train(self, args, cfg, run_dir):
        os.makedirs(run_dir, exist_ok=True)
        if cfg["hold"]:  # a long training: it ends when the file appears
            wait_for(cfg["hold"])
        self.trained.append(RunSpec(cfg["arm"], cfg["seed"], cfg["lr_scale"]))
        action = self.script.get(cfg["arm"])
        if action is not None:
            action(run_dir)
        ResultsFile(run_dir).add({"kind": "ap", "iteration": cfg["length"], "arm": cfg["arm"], "seed": cfg["seed"],
                                  "lr_scale": cfg["lr_scale"]})

    def evaluate(self, args, cfg, run_dir):
        ResultsFile(run_dir).add({"kind": "eval", "iteration": 0, "arm": cfg["arm"]})

    def stale_files(self, run_dir):
        return [os.path.join(run_dir, "checkpoint.bin")]
