"""dledger-example: replicated counters, the example dledger plugin (see docs/plugins.md)."""
