"""Transports; each registers itself as a plugin (``dledger_transport_types``)."""
