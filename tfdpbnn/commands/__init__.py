"""Subcommands of the ``tfdpbnn`` console command (see ``tfdpbnn.cli``)."""
