"""Developer tools: ``python -m tools.simulate`` and benchmark drivers."""
