"""Fixtures shared by several test modules."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _slurm_unavailable():
    """Why Slurm tests cannot run here, or None when the cluster answers."""
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        return "sbatch/srun are not on PATH (start a one-node Slurm: sudo bash tools/slurm_local.sh start)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"scontrol ping failed: {e}"
    if "is UP" not in ping.stdout:
        conf = os.environ.get("SLURM_CONF", "<unset>")
        return (
            f"the Slurm cluster of SLURM_CONF={conf} does not answer "
            "(export the line tools/slurm_local.sh start prints)"
        )
    return None


@pytest.fixture(scope="session")
def slurm_unavailable():
    """Why no Slurm cluster answers here (a str), or None when one does."""
    return _slurm_unavailable()


@pytest.fixture
def slurm_env(slurm_unavailable, monkeypatch, tmp_path):
    """A folder for submitit (``tmp_path``) with the environment jobs inherit: this checkout first on PYTHONPATH.
    Skips the test when no cluster answers."""
    if slurm_unavailable:
        pytest.skip(slurm_unavailable)
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", REPO + (os.pathsep + path if path else ""))
    return tmp_path



@pytest.fixture(scope="session")
def coco_layout_root(tmp_path_factory):
    """A folder holding a tiny ``coco/`` in the COCO 2017 layout (tests/coco_layout.py): point
    DETECTRON2_DATASETS at it, in a process that imports detectron2.data afterwards, to get it as the
    builtin ``coco_2017_train`` / ``coco_2017_val``."""
    from coco_layout import write_coco_layout

    return write_coco_layout(tmp_path_factory.mktemp("datasets"))


@pytest.fixture(scope="session")
def image_folder_root(tmp_path_factory):
    """A tiny two-class ImageFolder ``<root>/{train,val}/<class>/*.png`` (2 training, 1 evaluation image per class)."""
    from coco_layout import write_image_folder

    return write_image_folder(tmp_path_factory.mktemp("imagefolder"))
