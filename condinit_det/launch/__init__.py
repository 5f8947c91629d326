"""The launcher: everything about experiments that is the same for every training stage, written once.

- :mod:`.stage`: the interface a training stage implements (:class:`~.stage.Stage`);
- :mod:`.arguments`: the command line every training command shares;
- :mod:`.experiment`: plan and check the arm x seed x lr-scale runs, run each in a launch of its own with failure
  records, resume and retry, one owner per run, the report at the end;
- :mod:`.plan`, :mod:`.cost`: what a command would do and what it costs (``--dry-run``);
- :mod:`.slurm`, :mod:`.cluster`: Slurm job arrays, elements, preemption and requeue, what is in flight;
- :mod:`.protocol`: two stages composed (pretraining, then fine-tuning from each arm's run, then one report);
- :mod:`.status`: where an experiment stands, read from its files;
- :mod:`.command`: one training command for any stage.

The stages (:mod:`condinit_det.engine`, :mod:`condinit_det.pretrain`) import :mod:`.stage` only; nothing here imports
a stage: the commands hand theirs in.
"""
