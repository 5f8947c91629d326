"""condinit-det: conditioned, mimetic and default attention initialization for detectron2."""

import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The top-level configs/ folder is the source; built packages carry a copy here (condinit_det.model_zoo).
ZOO_CONFIGS = os.path.join("condinit_det", "model_zoo", "configs")


def config_files():
    """Every file of configs/ (relative paths), without bytecode caches."""
    found = []
    for folder, dirs, files in os.walk("configs"):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.extend(os.path.join(folder, f) for f in files if not f.endswith((".pyc", ".pyo")))
    return sorted(found)


class build_py_with_configs(build_py):
    """build_py that also copies configs/ into the built package as condinit_det/model_zoo/configs/
    (as detectron2 ships its model zoo). Editable installs read configs/ in place and skip the copy."""

    def _config_targets(self):
        if getattr(self, "editable_mode", False):
            return []
        return [
            (src, os.path.join(self.build_lib, ZOO_CONFIGS, os.path.relpath(src, "configs"))) for src in config_files()
        ]

    def run(self):
        super().run()
        for src, dst in self._config_targets():
            self.mkpath(os.path.dirname(dst))
            self.copy_file(src, dst)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [dst for _, dst in self._config_targets()]


setup(
    name="condinit-det",
    version="0.1.0",
    description="Attention-weight initialization arms (default, mimetic, conditioned) for detectron2 detectors",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["condinit_det", "condinit_det.*"]),
    # detectron2 is not on PyPI under its own name: tools/setup_env.sh installs it (README).
    install_requires=[
        "torch",
        "torchvision",
        "numpy",
        "scipy",
        "timm>=0.9",
        "fvcore",
        "iopath",
        "pycocotools>=2.0.2",
        "shapely",  # fvcore crops polygon masks with it (the COCO configs' crop augmentations)
        "faster-coco-eval>=1.6.5,<1.9",
        "opencv-python-headless",
        "matplotlib",
        "Pillow",
        "termcolor",
        "yacs",
        "tabulate",
        "cloudpickle",
        "tqdm",
        "tensorboard",
        "omegaconf>=2.1,<2.4",
        "hydra-core>=1.1",
        "setuptools<81",  # detectron2.model_zoo imports pkg_resources
        "black",  # detectron2's LazyConfig.save formats the dumped config with it
        "packaging",
        "psutil",
        "threadpoolctl",  # thread counts of the BLAS libraries (the arms compute on one thread)
        "safetensors",  # the shareable model_final.safetensors
        "submitit>=1.5",  # Slurm job arrays, the time-limit signal and requeue (condinit_det.launch.slurm)
        "scikit-learn",  # ships the UCI handwritten digits the embedded digits datasets are made from
    ],
    extras_require={
        # make test runs on both cores. pytest 9.2 reads a test's id from a field pytest-xdist 3.8 does not set:
        # --dist loadgroup then no longer groups (pytest-xdist issue 1386), and shared fixtures run on both workers.
        # ruff pinned: make lint checks the formatter's layout, which changes between releases
        # (.pre-commit-config.yaml names the same version).
        "test": ["pytest>=7,<9.2", "pytest-xdist>=3", "ruff==0.17.6"],
        # Experiment trackers (condinit_det.tracking), optional: offline W&B runs and MLflow's SQLite store.
        "wandb": ["wandb>=0.19"],
        "mlflow": ["mlflow-skinny>=2.11", "sqlalchemy>=1.4,<3", "alembic<2,!=1.10.0"],
    },
    cmdclass={"build_py": build_py_with_configs},
    # The same programs as tools/*.py, for installs without a checkout.
    entry_points={
        "console_scripts": [
            "condinit-train=condinit_det.commands.train:main",
            "condinit-pretrain=condinit_det.commands.pretrain:main",
            "condinit-compare=condinit_det.commands.compare:main",
            "condinit-conditioning=condinit_det.commands.conditioning:main",
            "condinit-status=condinit_det.commands.status:main",
            "condinit-protocol=condinit_det.commands.protocol:main",
        ],
    },
)
