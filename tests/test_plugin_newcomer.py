"""What a third-party plugin author hits first (issue 30), checked where it broke: real twistd members and the real CLI.

A fake installed distribution ``newplug`` (a module and a ``.dist-info`` with an entry point in the ``dledger``
group, on the children's PYTHONPATH) declares a ``str`` option whose default is None, refuses some bodies in
an append hook and listens on an endpoint of its own; ``brokenplug`` cannot even be imported.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted

from dledger.launcher import TWISTD, LocalGroup, child_env

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent

NEWPLUG = '''
from twisted.application import strports
from twisted.internet.protocol import Factory, Protocol
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.hookspecs import hookimpl
from dledger.interfaces import IAppendHook
from dledger.plugin_types import ExtraOption


@implementer(IAppendHook)
class NoSecrets:
    def before_append(self, entry, buffer, body_offset):
        if bytes(buffer[body_offset:]).startswith(b"secret"):
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "bodies starting with 'secret' are refused")


@hookimpl
def dledger_extra_options():
    return [ExtraOption("newplug.record_dir", None, "where to record (unset: nowhere)"),
            ExtraOption("newplug.listen", None, "an endpoint of the plugin's own (unset: none)")]


@hookimpl
def dledger_append_hooks(server):
    return [NoSecrets()]


@hookimpl
def dledger_services(server, collection):
    listen = server.config.extras["newplug.listen"]
    if listen:
        svc = strports.service(listen, Factory.forProtocol(Protocol))
        svc.setName("newplug-port")
        svc.setServiceParent(collection)
'''


def install_fake(root: Path, name: str, source: str) -> None:
    """A module ``name`` and its distribution's metadata, with one entry point in the ``dledger`` group."""
    (root / f"{name}.py").write_text(source)
    dist = root / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[dledger]\n{name} = {name}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory of fake installed distributions, on the PYTHONPATH of every child process."""
    root = tmp_path / "site"
    root.mkdir()
    install_fake(root, "newplug", NEWPLUG)
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


def dledger_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dledger.cli", *argv], capture_output=True, text=True,
                          env=child_env(), cwd=str(ROOT), timeout=timeout)


@pytest_twisted.ensureDeferred
async def test_twistd_member_starts_with_a_plugin_option_whose_default_is_none(site, tmp_path, reactor):
    """Item 1: twistd resolves the config, then the member resolves it again; the None default is not re-checked.

    Item 2: an append the plugin's hook refuses reaches the `dledger append` client as APPEND_REFUSED (431) with
    the hook's message; an ordinary body is appended as usual.
    """
    group = LocalGroup(tmp_path / "g", n=1, store="memory", reactor=reactor)
    try:
        group.start()
        await group.wait_for(lambda: group.log_lines("n0", "dledger member ")
                             or group.members["n0"].proc.poll() is not None, 30, "the summary line or an exit")
        assert group.members["n0"].running, "".join(group.log_lines("n0"))
        assert not group.log_lines("n0", "expected a string")
        peers = ["--peers", group.peers, "--group", "g0"]
        ok = dledger_cli("append", *peers, "--body", "hello", "--timeout", "10")
        assert ok.returncode == 0, ok.stderr
        refused = dledger_cli("append", *peers, "--body", "secret: 42", "--timeout", "10")
        assert refused.returncode == 1
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert lines[0].startswith("dledger: APPEND_REFUSED (431): "), lines[0]
        assert "bodies starting with 'secret' are refused" in lines[0]
        assert "maxEntrySize" not in lines[0]
    finally:
        group.close()


def test_a_plugin_service_whose_port_is_taken_is_named_in_the_start_error(site, tmp_path):
    """Item 6: a plugin service that cannot listen fails the member with one line naming the plugin's service."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        member_port = socket.socket()
        member_port.bind(("127.0.0.1", 0))
        free = member_port.getsockname()[1]
        member_port.close()
        out = subprocess.run([sys.executable, "-c", TWISTD, "-n", "--pidfile=", "dledger", "--id", "n0",
                              "--peers", f"n0-127.0.0.1:{free}", "--plugin-opt",
                              f"newplug.listen=tcp:{port}:interface=127.0.0.1"],
                             env=child_env(), capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    line = next(ln for ln in text.splitlines() if "could not start" in ln)
    assert "plugin service 'newplug-port' of plugin 'newplug' failed to start" in line, line
    assert f"port {port} is already in use" in line, line
    assert "Traceback" not in text


BROKEN = "import a_module_that_is_not_installed  # noqa\n"


def test_a_broken_plugin_is_one_line_and_listed_by_dledger_plugins(site):
    """Item 4: a plugin that cannot be imported does not take every command down with a traceback."""
    install_fake(site, "brokenplug", BROKEN)
    out = dledger_cli("plugins")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    warning = [ln for ln in out.stderr.splitlines() if "brokenplug" in ln]
    assert len(warning) == 1, out.stderr
    assert "distribution brokenplug 0.1" in warning[0] and "DLEDGER_DISABLE_PLUGIN_AUTOLOAD=1" in warning[0]
    assert "ModuleNotFoundError" in warning[0]
    listed = [ln for ln in out.stdout.splitlines() if ln.startswith("brokenplug")]
    assert listed and "BROKEN" in listed[0], out.stdout
    assert any(ln.startswith("newplug") for ln in out.stdout.splitlines())  # the others still load
    # Every other command still works (the parser is built with the plugins that loaded).
    out = dledger_cli("config")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert '"newplug.record_dir": null' in out.stdout  # item 6: `dledger config` shows plugin defaults too


def test_twistd_refuses_to_start_with_a_broken_plugin_in_one_line(site, tmp_path):
    """Item 4: a member must not run without a plugin it would normally load: one line, exit non-zero."""
    install_fake(site, "brokenplug", BROKEN)
    out = subprocess.run([sys.executable, "-c", TWISTD, "-n", "--pidfile=", "dledger", "--id", "n0", "--peers",
                          "n0-127.0.0.1:1"], env=child_env(), capture_output=True, text=True, timeout=60,
                         cwd=str(tmp_path))
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Traceback" not in text, text
    assert "brokenplug" in text and "DLEDGER_DISABLE_PLUGIN_AUTOLOAD=1" in text, text
    help_out = subprocess.run([sys.executable, "-c", TWISTD, "dledger", "--help"], env=child_env(),
                              capture_output=True, text=True, timeout=60)
    assert help_out.returncode == 0 and "newplug.listen" in help_out.stdout, help_out.stderr
    disabled = subprocess.run([sys.executable, "-m", "dledger.cli", "plugins"], capture_output=True, text=True,
                              env=child_env({"DLEDGER_DISABLE_PLUGIN_AUTOLOAD": "1"}), timeout=60)
    assert disabled.returncode == 0 and "brokenplug" not in disabled.stdout + disabled.stderr
