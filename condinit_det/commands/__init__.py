"""The command-line programs, installed as console scripts and wrapped by ``tools/*.py``.

==========================  ==============================  =======================================
console script              module                          checkout script
==========================  ==============================  =======================================
``condinit-train``          :mod:`.train`                   ``tools/train_net.py``
``condinit-pretrain``       :mod:`.pretrain`                ``tools/pretrain_net.py``
``condinit-compare``        :mod:`.compare`                 ``tools/compare_arms.py``
``condinit-conditioning``   :mod:`.conditioning`            ``tools/attention_conditioning.py``
``condinit-status``         :mod:`.status`                  ``tools/experiment_status.py``
``condinit-protocol``       :mod:`.protocol`                ``tools/submit_protocol.py``
==========================  ==============================  =======================================

Each module has ``main(argv=None) -> int`` (the exit status) and is thin: the training commands hand their stage
to :func:`condinit_det.launch.command.run_command`. They sit above every other part of the package: nothing in
``condinit_det`` imports them.
"""
