"""Markers the example's tests use, so they run the same inside dledger's repository and in a copy of their own."""


def pytest_configure(config):
    config.addinivalue_line("markers", "process: starts twistd processes (deselect with -m 'not process')")
