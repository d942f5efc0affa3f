"""The member's status page: what an operator reads in a browser next to the Prometheus text.

:mod:`.events` keeps the last role changes with their reasons, :mod:`.history` a small ring of recent
samples (throughput and latency sparklines), :mod:`.model` turns a member into the JSON document
``/status.json`` serves (plugins add sections through ``dledger_status_sections``), :mod:`.page` renders
it as HTML, and :mod:`.resource` serves both on the metrics endpoint (:mod:`dledger.metrics`).
"""
