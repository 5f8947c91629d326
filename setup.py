"""condinit-det: conditioned, mimetic and default attention initialization for detectron2."""
from setuptools import find_packages, setup

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
        "faster-coco-eval>=1.6",
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
    ],
    extras_require={"test": ["pytest>=7"]},
)
