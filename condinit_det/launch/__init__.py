"""The launcher: everything about experiments that is the same for every training stage, written once.

One pass down: :mod:`.command` parses (:mod:`.arguments`), :mod:`.plan` plans, checks and prices the runs
(``--dry-run`` stops there), then :mod:`.run` trains them here or :mod:`.slurm` submits them as a job array; the two
share the plan and differ only at this last step. :mod:`.protocol` composes two stages (pretraining, then
fine-tuning from each arm's run, then one report); :mod:`.status` reads where an experiment stands from its files.
Nothing here imports a stage: the commands hand theirs in.
"""
