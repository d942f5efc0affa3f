"""``dledger kv``: its help and usage errors (the real parser), and each action's output and exit status against
an in-process group (the actions are the coroutines ``dledger kv`` runs with a connected client)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from dledger_example.kv import command
from dledger_example.kv import plugin as kvplugin
from twisted.internet.defer import Deferred

from dledger import cli
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.testing import Cluster, isolated_plugin_manager


def test_dledger_kv_help_lists_the_actions(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["kv", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and all(a in out for a in ("put", "get", "delete", "cas", "linearizable"))
    with pytest.raises(SystemExit):
        cli.main(["kv", "cas", "--help"])
    out = capsys.readouterr().out
    assert "--expect OLD" in out and "--absent" in out and "--tls-ca" in out and "--token-file" in out


@pytest.mark.parametrize("argv, message", [
    (["kv", "put", "", "x"], "a key must not be empty"),
    (["kv", "get", "k" * 1025], "a key is at most 1024 bytes"),
    (["kv", "cas", "k", "new"], "one of the arguments --expect --absent is required"),
    (["kv", "cas", "k", "new", "--expect", "a", "--absent"], "not allowed with argument"),
    (["kv", "put", "k"], "the following arguments are required: value"),
])
def test_usage_errors_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "Traceback" not in err


@pytest.fixture
def group(tmp_path):
    cluster = Cluster(3, seed=2, plugin_manager=isolated_plugin_manager(kvplugin), extras={"kv.enabled": True},
                      store_base_dir=str(tmp_path))
    cluster.start()
    cluster.wait_for_leader()
    return cluster


def run(cluster, action, **args):
    """Run one ``dledger kv`` action; ``(exit status, stdout)``."""
    out = io.StringIO()
    args = SimpleNamespace(json=False, **args)
    result = []
    Deferred.fromCoroutine(action(cluster.client(), args, out)).addBoth(result.append)
    cluster.wait_until(lambda: result, 30, "the command")
    if hasattr(result[0], "raiseException"):
        result[0].raiseException()
    return result[0], out.getvalue()


def test_each_action_prints_one_line_and_says_no_with_exit_status_3(group, capsys):
    status, out = run(group, command.put_command, key="colour", value="blue")
    assert status == 0 and out.startswith("put colour: entry ")
    assert run(group, command.get_command, key="colour") == (0, "blue\n")
    status, out = run(group, command.cas_command, key="colour", new="red", expect="green", absent=False)
    assert status == command.EXIT_NO and "cas colour failed: it holds 'blue'" in out
    status, out = run(group, command.cas_command, key="colour", new="red", expect=None, absent=True)
    assert status == command.EXIT_NO and "cas colour failed: it holds 'blue'" in out
    assert run(group, command.cas_command, key="colour", new="red", expect="blue", absent=False)[0] == 0
    status, out = run(group, command.delete_command, key="colour")
    assert status == 0 and out.startswith("deleted colour: entry ")
    status, out = run(group, command.get_command, key="colour")
    assert (status, out) == (command.EXIT_NO, "") and "dledger: kv: no key 'colour'" in capsys.readouterr().err
    status, out = run(group, command.delete_command, key="colour")
    assert status == command.EXIT_NO and out.startswith("colour was absent")


def test_json_output(group):
    out = io.StringIO()
    result = []
    args = SimpleNamespace(json=True, key="k", value="v")
    Deferred.fromCoroutine(command.put_command(group.client(), args, out)).addBoth(result.append)
    group.wait_until(lambda: result, 30)
    record = json.loads(out.getvalue())
    assert record["op"] == "put" and record["key"] == "k" and record["index"] > 0
    args = SimpleNamespace(json=True, key="nope")
    out = io.StringIO()
    result.clear()
    Deferred.fromCoroutine(command.get_command(group.client(), args, out)).addBoth(result.append)
    group.wait_until(lambda: result, 30)
    assert result == [command.EXIT_NO] and json.loads(out.getvalue())["found"] is False


def test_members_without_the_kv_map_get_a_hint(tmp_path):
    cluster = Cluster(1, plugin_manager=isolated_plugin_manager(kvplugin), store_base_dir=str(tmp_path))
    cluster.start()
    cluster.wait_for_leader()
    with pytest.raises(DLedgerError) as exc:
        run(cluster, command.get_command, key="k")
    assert exc.value.code is ResponseCode.UNSUPPORTED and "--plugin-opt kv.enabled=true" in exc.value.message


@pytest.mark.parametrize("value, message", [("-1", "0 or more"), ("1.5", "whole number"), ("lots", "whole number"),
                                           (True, "whole number")])
def test_kv_max_value_is_checked_when_the_config_is_read(tmp_path, value, message):
    """A bad kv.max_value is a one-line ConfigError naming the option, before any member is built."""
    from dledger import plugins
    from dledger.errors import ConfigError

    pm = isolated_plugin_manager(kvplugin)
    with pytest.raises(ConfigError, match=r"plugins\.kv\.max_value: bad value .*" + message):
        plugins.resolve_extras({"kv": {"max_value": value}}, pm)
    assert plugins.resolve_extras({"kv": {"max_value": "10"}}, pm)["kv.max_value"] == 10
