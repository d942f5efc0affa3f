"""Examples in docstrings run as written."""

import doctest

import dledger.config
import dledger.testing.cluster


def test_docstring_examples_run():
    """The doctest examples of the config and cluster modules pass."""
    for module in (dledger.config, dledger.testing.cluster):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_rule_table_names_tests_and_transcripts_that_exist():
    """Every test and transcript docs/architecture.md's "where does rule X live" table names exists."""
    import re
    from pathlib import Path

    root = Path(__file__).parent.parent
    text = (root / "docs" / "architecture.md").read_text()
    table = text.split("## Where does rule X live", 1)[1].split("\n## ", 1)[0]
    checked, module = 0, ""
    for cell in re.findall(r"`([^`]+)`", table):
        if cell.startswith("test_"):
            if "::" in cell or (root / "tests" / f"{cell}.py").exists():
                module, _, name = cell.partition("::")
            else:  # `test_x` after `module::test_y` in the same cell list: another test of that module
                name = cell
            source = (root / "tests" / f"{module}.py").read_text()
            assert not name or f"def {name}(" in source, cell
            checked += 1
        elif cell.endswith(".txt"):
            assert (root / "tests" / "transcripts" / cell).exists(), cell
            checked += 1
    assert checked > 20
