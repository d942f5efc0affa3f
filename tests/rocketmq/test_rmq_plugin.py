"""The dledger-rocketmq distribution: installed next to dledger and loaded through the 'dledger' entry point."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pluggy

from dledger import plugins

BIN = Path(sys.executable).parent


def test_entry_point_is_declared():
    """dledger-rocketmq declares `rocketmq = dledger_rocketmq.plugin` in the 'dledger' entry-point group."""
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="dledger")}
    assert eps["rocketmq"].value == "dledger_rocketmq.plugin"
    assert eps["rocketmq"].dist.name == "dledger-rocketmq"
    assert "dledger" in importlib.metadata.requires("dledger-rocketmq")


def test_plugin_manager_loads_it_as_a_third_party_plugin():
    """A fresh plugin manager registers the module from its distribution; check_pending finds no stray hook."""
    pm = plugins.make_plugin_manager()
    info = {p.name: p for p in plugins.describe_plugins(pm)}
    assert info["rocketmq"].module == "dledger_rocketmq.plugin"
    assert info["rocketmq"].source.startswith("entry point 'dledger' of dledger-rocketmq ")
    assert isinstance(pm, pluggy.PluginManager)


def test_autoload_off_keeps_it_out(monkeypatch):
    """DLEDGER_DISABLE_PLUGIN_AUTOLOAD keeps the broker layer out like any third-party plugin."""
    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "1")
    assert "rocketmq" not in {p.name for p in plugins.describe_plugins(plugins.make_plugin_manager())}


def test_dledger_plugins_command_lists_it():
    """`dledger plugins` prints the rocketmq plugin and its distribution next to the built-ins."""
    out = subprocess.run([str(BIN / "dledger"), "plugins"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, cwd="/")
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("rocketmq"))
    assert "dledger_rocketmq.plugin" in line and "entry point 'dledger' of dledger-rocketmq" in line
    assert "memory" in out.stdout
