"""Several processes, for both stages: launching on the CPU or on GPUs, checking that replicas hold bitwise equal
weights (not an unsynchronized BatchNorm's statistics, :func:`local_buffers`), broadcasting rank 0's buffers.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
from typing import Set

import torch
import torch.distributed as dist
from detectron2.utils import comm
from torch import nn

__all__ = ["check_replicas", "launch", "local_buffers", "rank", "replica_fingerprint", "sync_buffers"]


@contextlib.contextmanager
def _cuda_hidden():
    """``CUDA_VISIBLE_DEVICES=""`` while the block runs: processes started in it see no CUDA device."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def launch(main_func, num_processes: int, *, device: str, args: tuple = (), **options) -> None:
    """``detectron2.engine.launch`` of ``main_func(*args)`` in ``num_processes`` processes per machine (``options``:
    detectron2's); the workers of a several-process CPU run see no CUDA device, so that they join a gloo group
    (detectron2 picks NCCL whenever CUDA is available), and each leaves its process group when ``main_func`` ends."""
    from detectron2.engine import launch as d2_launch

    hide = int(num_processes) * int(options.get("num_machines", 1)) > 1 and str(device).startswith("cpu")
    with _cuda_hidden() if hide else contextlib.nullcontext():
        d2_launch(_leaving_group, num_processes, args=(main_func, *args), **options)


def _leaving_group(main_func, *args):
    # A spawned worker can abort while the interpreter tears down ("terminate called without an active exception"
    # from a C++ thread of the process group), failing a finished run. So after a run every worker waits for the
    # others, leaves the group, flushes its logs and exits at once; a failing one leaves the group and raises.
    grouped = dist.is_available() and dist.is_initialized()
    try:
        result = main_func(*args)
    except BaseException:
        if grouped:
            dist.destroy_process_group()
        raise
    if not grouped:
        return result
    dist.barrier()
    dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def local_buffers(module: nn.Module) -> Set[str]:
    """State-dict names of the buffers each process updates on its own (unsynchronized BatchNorm statistics)."""
    from detectron2.layers import NaiveSyncBatchNorm

    synced = (nn.SyncBatchNorm, NaiveSyncBatchNorm)
    names = set()
    for prefix, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and not isinstance(m, synced):
            names.update(
                f"{prefix}.{b}" if prefix else b for b, value in m.named_buffers(recurse=False) if value is not None
            )
    return names


def replica_fingerprint(module: nn.Module) -> str:
    """SHA-1 of the state dict without :func:`local_buffers` (names, dtypes, bytes): what replicas share."""
    skip = local_buffers(module)
    digest = hashlib.sha1()
    for name, value in sorted(module.state_dict().items()):
        if name in skip:
            continue
        t = value.detach().cpu().contiguous().reshape(-1)
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


# This process's rank in the process group; 0 without one.
rank = comm.get_rank


def check_replicas(module: nn.Module, when: str) -> str:
    """Raise RuntimeError unless every process holds the same :func:`replica_fingerprint` of ``module``;
    returns it. No-op (beyond the fingerprint) in one process. ``when`` names the moment in the messages."""
    fingerprint = replica_fingerprint(module)
    if comm.get_world_size() == 1:
        return fingerprint
    prints = comm.all_gather(fingerprint)
    if len(set(prints)) != 1:
        raise RuntimeError(
            f"replicas differ {when}: fingerprints of parameters and synchronized buffers per rank {prints}"
        )
    logging.getLogger(__name__).info(
        f"Replica check {when}: all {len(prints)} processes hold identical weights (sha1 {fingerprint[:12]})"
    )
    return fingerprint


def sync_buffers(module: nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm statistics among them) to every process; no-op on one process."""
    if comm.get_world_size() == 1:
        return
    for buf in module.buffers():
        dist.broadcast(buf.data, src=0)
