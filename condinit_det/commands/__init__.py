"""The command-line programs, installed as console scripts and wrapped by ``tools/*.py``.

==========================  ==============================  =======================================
console script              module                          checkout script
==========================  ==============================  =======================================
``condinit-train``          :mod:`.train`                   ``tools/train_net.py``
``condinit-pretrain``       :mod:`.pretrain`                ``tools/pretrain_net.py``
``condinit-compare``        :mod:`.compare`                 ``tools/compare_arms.py``
``condinit-conditioning``   :mod:`.conditioning`            ``tools/attention_conditioning.py``
==========================  ==============================  =======================================

Each module has ``main(argv=None) -> int`` (the exit status). They sit above every other part of
the package: nothing in ``condinit_det`` imports them.
"""
