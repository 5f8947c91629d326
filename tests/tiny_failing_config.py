# tiny_train_config.py whose training data loader raises on one batch, as a crashed data worker would:
# on batch CONDINIT_FAIL_AT (1-based, default 2) of process CONDINIT_FAIL_RANK (default 0); with
# CONDINIT_FAIL_ONCE=<file>, only while that file does not exist yet (the first failure creates it).
import os

from detectron2.config import LazyCall as L

from .tiny_train_config import condinit, dataloader, lr_multiplier, model, optimizer, train  # noqa: F401


class FailingLoader:
    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return len(self.loader)

    def _fails_now(self) -> bool:
        from detectron2.utils import comm

        if comm.get_rank() != int(os.environ.get("CONDINIT_FAIL_RANK", "0")):
            return False
        marker = os.environ.get("CONDINIT_FAIL_ONCE")
        if not marker:
            return True
        if os.path.exists(marker):
            return False
        open(marker, "w").close()
        return True

    def __iter__(self):
        fail_at = int(os.environ.get("CONDINIT_FAIL_AT", "2"))
        for i, batch in enumerate(self.loader, start=1):
            if i == fail_at and self._fails_now():
                raise RuntimeError(f"data loader failed on batch {i}")
            yield batch


dataloader.train = L(FailingLoader)(loader=dataloader.train)
