"""Log and term/vote stores; each registers itself as a plugin (``dledger_store_types``)."""
