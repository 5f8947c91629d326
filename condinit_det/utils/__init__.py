"""The ground layer: small utilities every other part may use and that use no other part (atomic files, checkpoint
reading, processes and replicas, preemption, squeue, threads, logs, the override-key check, :class:`UsageError`).
"""
