"""The ``torchgraft`` command-line tool."""
