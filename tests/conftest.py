"""Fixtures shared by several test modules."""
import pytest


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
