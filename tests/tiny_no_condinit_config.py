# A user's own config: tiny_train_config.py's armed model node and the rest of it, but no top-level condinit node.
from .tiny_train_config import dataloader, lr_multiplier, model, optimizer, train  # noqa: F401
