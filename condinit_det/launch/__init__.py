"""The launcher: everything about experiments that is the same for every training stage."""
