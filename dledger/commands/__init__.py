"""Sub-commands of the ``dledger`` command line, one module each."""
