"""The ``dledger`` client commands and the blocking client against a real 3-member TCP group on 127.0.0.1."""

import argparse
import base64
import io
import json
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue

from dledger.blocking import BlockingClient
from dledger.cli import build_parser
from dledger.codes import Role
from dledger.commands import client as commands
from dledger.config import make_config
from dledger.errors import DLedgerError
from dledger.launcher import child_env, free_ports
from dledger.server import DLedgerServer

pytestmark = pytest.mark.network
ROOT = Path(__file__).resolve().parent.parent


class Group:
    """Three in-process members serving TCP on the real reactor."""

    def __init__(self, reactor):
        self.reactor = reactor
        ports = free_ports(3)
        self.peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
        self.servers = {f"n{i}": DLedgerServer.build(make_config(preset="fast", group="g0", self_id=f"n{i}",
                                                                 peers=self.peers), clock=reactor)
                        for i in range(3)}

    async def start(self):
        await gatherResults([s.start() for s in self.servers.values()])
        await self.wait(lambda: self.leader() is not None, "a leader")
        leader = self.servers[self.leader()]
        await self.wait(lambda: leader.store.committed_index >= leader.replicator.term_start_index, "the NOOP")

    def leader(self):
        leaders = [m for m, s in self.servers.items() if s.state.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def follower(self):
        return next(m for m, s in self.servers.items() if s.state.role is Role.FOLLOWER)

    async def wait(self, predicate, what, timeout=10.0):
        from twisted.internet.task import deferLater

        deadline = self.reactor.seconds() + timeout
        while not predicate():
            assert self.reactor.seconds() < deadline, f"timed out waiting for {what}"
            await deferLater(self.reactor, 0.02, lambda: None)

    async def stop(self):
        await gatherResults([s.stop() for s in self.servers.values()])


@pytest.fixture
def group(reactor):
    g = Group(reactor)
    pytest_twisted.blockon(ensureDeferred(g.start()))
    yield g
    pytest_twisted.blockon(ensureDeferred(g.stop()))


async def cli(reactor, group, *argv):
    """Run a client command in this process; ``(status, stdout, stderr)``."""
    args = build_parser().parse_args([argv[0], "--peers", group.peers, "--group", "g0", *argv[1:]])
    action = {"append": commands.do_append, "get": commands.do_get, "metadata": commands.do_metadata,
              "transfer": commands.do_transfer}[argv[0]]
    out, err = io.StringIO(), io.StringIO()
    status = await commands.run_command(reactor, action, args, out, err)
    return status, out.getvalue(), err.getvalue()


@pytest_twisted.ensureDeferred
async def test_append_then_get_round_trip(reactor, group):
    """Bodies appended with --body come back from get at the printed indexes."""
    status, out, err = await cli(reactor, group, "append", "--body", "hello", "--body", "world")
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all(line.startswith("appended index=") for line in lines)
    first = int(lines[0].split("index=")[1].split()[0])
    status, out, err = await cli(reactor, group, "get", "--index", str(first), "--count", "2")
    assert status == 0, err
    assert out.splitlines() == [line for line in out.splitlines() if line.startswith("index=")]
    assert "body='hello'" in out.splitlines()[0] and "body='world'" in out.splitlines()[1]


@pytest_twisted.ensureDeferred
async def test_json_output_shapes(reactor, group):
    """--json prints one object per line: append (index, term, pos), get (body as Base64 and text), metadata."""
    status, out, _ = await cli(reactor, group, "append", "--json", "--count", "3", "--size", "40")
    acks = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and len(acks) == 3 and set(acks[0]) == {"index", "term", "pos"}
    assert [a["index"] for a in acks] == list(range(acks[0]["index"], acks[0]["index"] + 3))
    status, out, _ = await cli(reactor, group, "get", "--json", "--index", str(acks[0]["index"]), "--count", "3")
    entries = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [e["index"] for e in entries] == [a["index"] for a in acks]
    assert [e["pos"] for e in entries] == [a["pos"] for a in acks]
    e = entries[0]
    assert set(e) == {"index", "term", "pos", "size", "body_base64", "body"}
    assert e["body"] == "dledger-cli entry 0".ljust(40, ".") and e["size"] == 48 + 40
    assert base64.b64decode(e["body_base64"]) == e["body"].encode()
    status, out, _ = await cli(reactor, group, "metadata", "--json")
    [meta] = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and meta["leader"] == group.leader() and set(meta["members"]) == {"n0", "n1", "n2"}
    assert {m["role"] for m in meta["members"].values()} == {"LEADER", "FOLLOWER"}
    assert all(m["committed"] >= acks[-1]["index"] for m in meta["members"].values() if m["role"] == "LEADER")


@pytest_twisted.ensureDeferred
async def test_binary_bodies_have_no_text_in_json(reactor, group, tmp_path):
    """A body that is not printable UTF-8 (from --file) is shown as Base64 only."""
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(256)))
    status, out, _ = await cli(reactor, group, "append", "--json", "--file", str(blob))
    index = json.loads(out)["index"]
    status, out, _ = await cli(reactor, group, "get", "--json", "--index", str(index))
    e = json.loads(out)
    assert status == 0 and e["body"] is None and len(e["body_base64"]) == 344


@pytest_twisted.ensureDeferred
async def test_batch_append_reports_consecutive_indexes(reactor, group):
    """--batch N sends N bodies per request and prints each batch's index range."""
    status, out, err = await cli(reactor, group, "append", "--json", "--count", "5", "--batch", "2")
    batches = [json.loads(line) for line in out.splitlines()]
    assert status == 0, err
    assert [b["count"] for b in batches] == [2, 2, 1]
    assert batches[1]["first_index"] == batches[0]["index"] + 1 and batches[2]["first_index"] == batches[1]["index"] + 1


@pytest_twisted.ensureDeferred
async def test_metadata_lists_every_member(reactor, group):
    """metadata without --member prints the leader and one line per member with role, term and indexes."""
    status, out, _ = await cli(reactor, group, "metadata")
    lines = out.splitlines()
    assert status == 0 and lines[0] == f"group g0, leader {group.leader()}, configuration entry 0"
    assert len(lines) == 4 and sum("LEADER" in line for line in lines[1:]) == 1
    assert all(line.split()[2] == "voter" for line in lines[1:]), "each member's place in the configuration"
    status, out, _ = await cli(reactor, group, "metadata", "--member", group.follower(), "--json")
    meta = json.loads(out)
    assert meta["member"] == group.follower() and meta["role"] == "FOLLOWER" and meta["leader"] == group.leader()


@pytest_twisted.ensureDeferred
async def test_append_to_a_follower_only_exits_1_with_not_leader(reactor, group):
    """append --member <follower> does not redirect: it exits 1 printing NOT_LEADER (404) and the leader."""
    follower = group.follower()
    status, out, err = await cli(reactor, group, "append", "--member", follower, "--body", "x")
    assert status == 1 and out == ""
    assert "NOT_LEADER (404)" in err and f"the leader is {group.leader()}" in err


@pytest_twisted.ensureDeferred
async def test_commands_follow_the_leader_from_a_follower(reactor, group):
    """Asked first, a follower answers NOT_LEADER with the leader's id; the client follows it and succeeds."""
    items = group.peers.split(";")
    follower = group.follower()
    first = [i for i in items if i.startswith(follower + "-")] + [i for i in items if not i.startswith(follower + "-")]
    args = build_parser().parse_args(["append", "--peers", ";".join(first), "--group", "g0", "--body", "redirected"])
    out, err = io.StringIO(), io.StringIO()
    status = await commands.run_command(reactor, commands.do_append, args, out, err)
    assert status == 0 and out.getvalue().startswith("appended index="), err.getvalue()
    leader = group.servers[group.leader()]
    assert leader.store.get(leader.store.ledger_end_index).body == b"redirected"


@pytest_twisted.ensureDeferred
async def test_transfer_moves_leadership(reactor, group):
    """transfer --to <follower> makes that member the leader, and says so."""
    old, target = group.leader(), group.follower()
    status, out, err = await cli(reactor, group, "transfer", "--to", target)
    assert status == 0, err
    assert out.startswith(f"leadership moved from {old} to {target}")
    await group.wait(lambda: group.leader() == target, "the transferee to lead")
    status, out, _ = await cli(reactor, group, "transfer", "--to", target)
    assert status == 0 and "is already the leader" in out


@pytest_twisted.ensureDeferred
async def test_protocol_errors_exit_1_with_the_code_name(reactor, group):
    """Reading past the committed end exits 1 printing INDEX_OUT_OF_RANGE (410)."""
    status, out, err = await cli(reactor, group, "get", "--index", "100000")
    assert status == 1 and "INDEX_OUT_OF_RANGE (410)" in err


@pytest_twisted.ensureDeferred
async def test_usage_errors_exit_2(reactor, group):
    """An unknown member, or no peers at all, is a usage error (status 2) that says what is wrong."""
    status, _, err = await cli(reactor, group, "metadata", "--member", "n7")
    assert status == 2 and "'n7' is not one of the members" in err
    args = build_parser().parse_args(["metadata", "--group", "g0"])
    args.peers = None
    err = io.StringIO()
    assert await commands.run_command(reactor, commands.do_metadata, args, io.StringIO(), err) == 2
    assert "no members given" in err.getvalue()


@pytest_twisted.ensureDeferred
async def test_unreachable_group_times_out_with_status_1(reactor):
    """With nobody listening, a command gives up within --timeout and exits 1 naming the failure."""
    ports = free_ports(3)
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
    args = build_parser().parse_args(["append", "--peers", peers, "--group", "g0", "--timeout", "1", "--body", "x"])
    err = io.StringIO()
    started = reactor.seconds()
    status = await commands.run_command(reactor, commands.do_append, args, io.StringIO(), err)
    assert status == 1 and reactor.seconds() - started < 5
    assert "TIMEOUT (300)" in err.getvalue() or "NETWORK_ERROR (302)" in err.getvalue()


@pytest_twisted.ensureDeferred
async def test_console_command_reads_stdin_and_exits_with_status(reactor, group):
    """`python -m dledger.cli append` (task.react) appends stdin lines, and exits 1 on NOT_LEADER."""
    base = ["-m", "dledger.cli"]
    out, err, code = await getProcessOutputAndValue(
        sys.executable, [*base, "append", "--peers", group.peers, "--group", "g0", "--json"],
        env=child_env(), path=str(ROOT), reactor=reactor, stdinBytes=b"line one\nline two\n")
    assert code == 0, err
    assert len(out.decode().splitlines()) == 2
    out, err, code = await getProcessOutputAndValue(
        sys.executable, [*base, "append", "--peers", group.peers, "--group", "g0", "--member", group.follower(),
                         "--body", "x"], env=child_env(), path=str(ROOT), reactor=reactor)
    assert code == 1 and b"NOT_LEADER (404)" in err


@pytest_twisted.ensureDeferred
async def test_blocking_client_from_a_thread(reactor, group):
    """BlockingClient appends, reads, asks metadata and transfers from plain blocking code (its own reactor thread)."""

    def script():
        with BlockingClient(group.peers, "g0", timeout=10) as c:
            r = c.append(b"from a script")
            [e] = c.get(r.index)
            batch = c.append_batch([b"a", b"b", b"c"])
            meta = c.metadata()
            one = c.metadata(group.follower())
            try:
                c.append(b"x" * (5 << 20))
            except DLedgerError as exc:
                too_big = exc.code.name
            return r, e, batch, meta, one, too_big

    r, e, batch, meta, one, too_big = await deferToThread(script)
    assert e.body == b"from a script" and e.index == r.index
    assert batch.index == r.index + 3
    assert meta.leader_id == group.leader() and one.role == "FOLLOWER"
    assert too_big == "UNEXPECTED_ARGUMENT"


def test_blocking_client_reports_unreachable_group():
    """A BlockingClient whose group is unreachable raises DLedgerError within its timeout, and closes cleanly."""
    import time

    ports = free_ports(3)
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
    c = BlockingClient(peers, "g0", timeout=1.0)
    started = time.monotonic()
    with pytest.raises(DLedgerError) as info:
        c.append(b"x")
    assert time.monotonic() - started < 5 and info.value.code.name in ("TIMEOUT", "NETWORK_ERROR")
    c.close()
    assert not c.thread_alive
    with pytest.raises(DLedgerError):
        c.metadata()


def test_client_commands_are_registered():
    """append, get, metadata and transfer are sub-commands of `dledger`, each taking --peers/--group/--json."""
    parser = build_parser()
    for argv in (["append", "--body", "x"], ["get", "--index", "1"], ["metadata"], ["transfer", "--to", "n1"]):
        args = parser.parse_args([*argv, "--peers", "n0-127.0.0.1:1", "--group", "g", "--json", "--timeout", "2"])
        assert isinstance(args, argparse.Namespace) and args.json and args.timeout == 2.0 and callable(args.func)
