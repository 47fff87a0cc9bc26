"""Sub-commands of the ``linvit`` command line (see :mod:`linvit.cli`)."""
