"""``dledger members`` and the membership column of ``dledger metadata`` (issue #23 item 4): output and errors.

The actions run against the contract-following fake group of tests/test_client_members.py; usage
errors go through ``dledger.cli.main`` as an operator's would.
"""

from __future__ import annotations

import argparse
import io
import json

import pytest
from twisted.internet import task

from dledger import cli
from dledger.commands import client as client_commands
from dledger.commands import members as members_commands
from tests.test_cli_errors import DOWN, GROUP, dledger, one_line
from tests.test_client_members import FakeGroup, client_of, run


def args_of(**kw) -> argparse.Namespace:
    base = dict(json=False, member=None, learner=False, wait=60.0)
    base.update(kw)
    return argparse.Namespace(**base)


def act(action, args, group: FakeGroup | None = None) -> tuple[int, str]:
    clock, group = task.Clock(), group or FakeGroup()
    out = io.StringIO()
    from twisted.internet.defer import Deferred

    status = run(clock, Deferred.fromCoroutine(action(client_of(group, clock), args, out)), group)
    return status, out.getvalue()


def test_list_prints_each_member_with_its_role_and_the_entry():
    status, text = act(members_commands.do_list, args_of())
    lines = text.splitlines()
    assert status == 0 and lines[0] == "configuration the bootstrap --peers, committed; answered by n0"
    assert lines[1].split() == ["n0", "127.0.0.1:20911", "voter"] and len(lines) == 4


def test_list_json_is_one_object():
    status, text = act(members_commands.do_list, args_of(json=True))
    doc = json.loads(text)
    assert status == 0 and doc["committed"] is True and doc["configIndex"] == 0
    assert [m["role"] for m in doc["members"]] == ["voter"] * 3


def test_add_then_list_shows_a_learner_to_be_promoted():
    group = FakeGroup(auto_promote=False)
    status, text = act(members_commands.do_add, args_of(new=("n3", "127.0.0.1:20914")), group)
    assert status == 0 and text.splitlines()[0] == "added n3=127.0.0.1:20914 as a learner (the leader promotes it " \
                                                    "once caught up)"
    assert text.splitlines()[-1].split() == ["n3", "127.0.0.1:20914", "learner", "(promoted", "once", "caught",
                                             "up)"]


def test_replace_prints_its_steps_then_the_configuration():
    status, text = act(members_commands.do_replace, args_of(old="n1", new=("n3", "127.0.0.1:20914")))
    lines = text.splitlines()
    assert status == 0 and lines[0].startswith("adding n3=127.0.0.1:20914")
    assert any(line.startswith("removing n1") for line in lines)
    assert "replaced n1 by n3" in text and lines[-1].split()[:3] == ["n3", "127.0.0.1:20914", "voter"]


def test_metadata_shows_each_members_place_in_the_configuration():
    group = FakeGroup()
    status, text = act(members_commands.do_add, args_of(new=("n3", "127.0.0.1:20914"), learner=True), group)
    status, text = act(client_commands.do_metadata, args_of(), group)
    lines = text.splitlines()
    assert status == 0 and lines[0].endswith(", configuration entry 6")
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["n0"][2] == "voter" and rows["n3"][2] == "learner", "n3 was not in --peers: found in the configuration"
    status, text = act(client_commands.do_metadata, args_of(json=True), group)
    doc = json.loads(text)
    assert doc["members"]["n3"]["membership"] == "learner" and doc["configIndex"] == 6


@pytest.mark.parametrize("argv, message", [
    (["members", "add", *GROUP, "n3"], "expected ID=HOST:PORT, got 'n3'"),
    (["members", "add", *GROUP, "n3=host"], "address 'host' is not 'host:port'"),
    (["members", "add", *GROUP, "n 3=h:1"], "may only contain letters"),
    (["members", "replace", *GROUP, "n0", "n3=h:99999"], "port 99999 is out of range"),
    (["members", "replace", *GROUP, "n0", "n3=h:1", "--wait", "0"], "argument --wait: must be more than 0"),
])
def test_bad_arguments_are_one_line_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err.strip().splitlines()[-1]


def test_every_action_has_help(capsys):
    for action in ("list", "add", "promote", "remove", "replace"):
        with pytest.raises(SystemExit):
            cli.main(["members", action, "--help"])
        assert "--peers" in capsys.readouterr().out


def test_members_of_a_group_that_is_down_is_one_line():
    proc = dledger("members", "list", "--peers", DOWN, "--group", "g0", "--timeout", "0.5")
    assert proc.returncode == 1 and one_line(proc.stderr).startswith("dledger: NETWORK_ERROR (302): cannot connect")


def test_a_refusal_is_one_line_on_stderr_and_exit_1_or_json(monkeypatch):
    """Through the command's own runner (parser, client, error report): the leader's reason, one line."""
    from twisted.internet.defer import Deferred

    import dledger.client

    clock, group = task.Clock(), FakeGroup()
    monkeypatch.setattr(dledger.client, "connect", lambda *a, **kw: client_of(group, clock))
    for extra, check in ((), "stderr"), (("--json",), "json"):
        args = cli.build_parser().parse_args(["members", "remove", "n7", *GROUP, *extra])
        out, err = io.StringIO(), io.StringIO()
        status = run(clock, Deferred.fromCoroutine(client_commands.run_command(
            clock, members_commands.do_remove, args, out, err)))
        assert status == 1
        if check == "stderr":
            line = one_line(err.getvalue().encode())
            assert line.startswith("dledger: CONFIG_CHANGE_REFUSED (432): ") and "n7 is not a member" in line
        else:
            doc = json.loads(out.getvalue())
            assert doc["error"]["code"] == "CONFIG_CHANGE_REFUSED" and "n7 is not a member" in doc["error"]["message"]
