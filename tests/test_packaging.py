"""Packaging: the console script, the twistd dropin and the README's two commands."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


def run(*args, cwd="/"):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_twistd_finds_the_dledger_plugin_from_any_directory():
    """The installed project exposes twisted/plugins/dledger_plugin.py to twistd (not only from the repo root)."""
    out = run(str(BIN / "twistd"), "--help")
    assert out.returncode == 0, out.stderr
    assert "dledger" in out.stdout


def test_console_script_lists_plugins():
    """`dledger plugins` prints the built-in memory store and where it came from."""
    out = run(str(BIN / "dledger"), "plugins")
    assert out.returncode == 0, out.stderr
    assert "memory" in out.stdout and "entry point 'dledger'" in out.stdout


def test_config_command_rejects_bad_files(tmp_path):
    """`dledger config` exits 2 with the option named when the file is wrong."""
    bad = tmp_path / "bad.toml"
    bad.write_text('peers = "n0-127.0.0.1:99999"\n')
    out = run(str(BIN / "dledger"), "config", str(bad))
    assert out.returncode == 2 and "out of range" in out.stderr


def test_readme_has_exactly_two_setup_commands():
    """The README's quick start is `make demo` and `make test`, and CI calls `make test`."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start")[1].split("```sh")[1].split("```")[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
