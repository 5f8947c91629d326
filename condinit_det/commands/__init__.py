"""The command-line programs: ``condinit-<name>`` runs ``main(argv=None) -> int`` (the exit status) of the module
named in setup.py's console scripts, and each ``tools/*.py`` script says which one it wraps. Thin: the training
commands hand their stage to :func:`condinit_det.launch.command.run_command`; nothing in ``condinit_det`` imports them.
"""
