"""``dledger snapshot`` against a real one-member TCP group on 127.0.0.1: taken, refused in one line, admin only."""

import io
import json

import pytest
import pytest_twisted
from twisted.internet.defer import ensureDeferred

from dledger.cli import build_parser
from dledger.codes import RequestCode, Role
from dledger.commands import client as commands
from dledger.config import make_config
from dledger.launcher import free_ports
from dledger.security.policy import Permission, grants_of, required_permission
from dledger.server import DLedgerServer
from dledger.testing.statemachine import DictMachine

pytestmark = pytest.mark.network


class OneMember:
    def __init__(self, reactor, tmp_path, machine):
        self.reactor = reactor
        (port,) = free_ports(1)
        self.peers = f"n0-127.0.0.1:{port}"
        self.server = DLedgerServer.build(make_config(preset="fast", group="g0", self_id="n0", peers=self.peers,
                                                      store_type="mmap", store_base_dir=str(tmp_path),
                                                      trailing_entries=0), clock=reactor)
        self.machine = machine
        if machine is not None:
            self.server.add_state_machine(machine)

    async def start(self):
        from twisted.internet.task import deferLater

        await self.server.start()
        for _ in range(500):
            if self.server.state.role is Role.LEADER and self.server.leads():
                return
            await deferLater(self.reactor, 0.02, lambda: None)
        raise AssertionError("no leader")


async def cli(reactor, member, *argv):
    args = build_parser().parse_args([argv[0], "--peers", member.peers, "--group", "g0", *argv[1:]])
    action = {"append": commands.do_append, "snapshot": commands.do_snapshot}[argv[0]]
    out, err = io.StringIO(), io.StringIO()
    status = await commands.run_command(reactor, action, args, out, err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def member(reactor, tmp_path, request):
    m = OneMember(reactor, tmp_path, DictMachine() if request.param else None)
    pytest_twisted.blockon(ensureDeferred(m.start()))
    yield m
    pytest_twisted.blockon(m.server.stop())


@pytest.mark.parametrize("member", [True], indirect=True)
@pytest_twisted.ensureDeferred
async def test_snapshot_command_takes_one(reactor, member):
    """dledger snapshot prints the snapshot each member took; --json gives its index, term, bytes and begin."""
    status, out, err = await cli(reactor, member, "append", "--body", "k=v", "--body", "x=y")
    assert status == 0, err
    status, out, err = await cli(reactor, member, "snapshot")
    assert status == 0, err
    applied = member.server.snapshots.applied_index
    assert out.startswith(f"n0: snapshot {applied}-") and "log begins at" in out
    status, out, err = await cli(reactor, member, "snapshot", "--json", "--member", "n0")
    obj = json.loads(out)
    assert status == 0 and obj["index"] == applied and obj["bytes"] > 0 and obj["member"] == "n0"
    assert member.server.snapshots.snapshot_store.newest().index == applied


@pytest.mark.parametrize("member", [False], indirect=True)
@pytest_twisted.ensureDeferred
async def test_snapshot_without_a_machine_is_a_one_line_refusal(reactor, member):
    """A member with no state machine answers UNSUPPORTED with its reason; the command exits 1, one line."""
    status, out, err = await cli(reactor, member, "snapshot")
    assert status == 1
    assert out.strip().count("\n") == 0 and "UNSUPPORTED (303)" in out and "no state machine" in out


def test_snapshot_needs_the_admin_role():
    """SNAPSHOT needs the admin permission: read and write clients are refused, admins and members pass."""
    need = required_permission(RequestCode.SNAPSHOT)
    assert need is Permission.ADMIN
    assert [need in grants_of(role) for role in ("read", "write", "admin")] == [False, False, True]


def test_snapshot_command_help_names_the_role():
    """--help says what the command does and that it needs an admin credential; it takes the credential options."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command" or getattr(a, "choices", None)
               and "snapshot" in (a.choices or {}))
    text = sub.choices["snapshot"].format_help()
    assert "admin" in text and "--tls-ca" in text and "--token-file" in text
