"""Examples in docstrings run as written."""

import doctest

import dledger.config
import dledger.testing.cluster


def test_docstring_examples_run():
    """The doctest examples of the config and cluster modules pass."""
    for module in (dledger.config, dledger.testing.cluster):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
