"""TCP_NODELAY on every request/reply connection (issue #28 found the broker port without it)."""

import ast
import pathlib
from types import SimpleNamespace

from twisted.internet.testing import StringTransport

from dledger.transport.sockopts import set_no_delay

ROOT = pathlib.Path(__file__).resolve().parent.parent


class NoDelayTransport(StringTransport):
    no_delay = False

    def setTcpNoDelay(self, enabled):
        self.no_delay = enabled


class ClosedTransport(StringTransport):
    def setTcpNoDelay(self, enabled):
        raise OSError(9, "Bad file descriptor")


def test_set_no_delay_table():
    tcp = NoDelayTransport()
    assert set_no_delay(tcp) is True and tcp.no_delay is True
    assert set_no_delay(StringTransport()) is False  # a unix socket or a fake: nothing to tune
    assert set_no_delay(ClosedTransport()) is False  # gone before connectionMade: no error


def test_the_rocketmq_client_turns_nagle_off():
    """The client's requests are small writes too: RocketMQ's NettyRemotingClient sets TCP_NODELAY."""
    from dledger_rocketmq.client.client import _ClientProtocol

    proto = _ClientProtocol(SimpleNamespace(max_frame_size=1 << 20))
    transport = NoDelayTransport()
    proto.makeConnection(transport)
    assert transport.no_delay is True


def _stream_protocols():
    """Every class of the project that reads a byte stream (defines dataReceived) on a TCP connection."""
    for path in [*ROOT.joinpath("dledger").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if not bases & {"Protocol", "protocol.Protocol"}:
                continue
            methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
            if "dataReceived" in methods:
                yield path.relative_to(ROOT), node.name, methods.get("connectionMade")


def test_every_stream_protocol_sets_no_delay_when_connected():
    """The same mistake nowhere else: each stream protocol's connectionMade calls set_no_delay."""
    found = list(_stream_protocols())
    assert len(found) >= 4, found  # the member transport, the load generator, the broker port, its client
    missing = [f"{path}:{name}" for path, name, made in found
               if made is None or "set_no_delay" not in ast.unparse(made)]
    assert missing == []


class _Wrapper:
    """A protocol wrapper's shape (the listener's guard, a TLS layer): the connection is its ``transport``."""

    def __init__(self, transport):
        self.transport = transport


def _connection():
    from twisted.internet.abstract import FileDescriptor

    return FileDescriptor.__new__(FileDescriptor)  # the TCP connection's class, without a reactor or socket


def test_set_read_size_table():
    """The read size is set on the TCP connection, found through the wrappers in front of it."""
    from dledger.transport.sockopts import READ_SIZE, set_read_size

    direct, wrapped, deep = _connection(), _connection(), _connection()
    assert set_read_size(direct) is True and direct.bufferSize == READ_SIZE
    assert set_read_size(_Wrapper(_Wrapper(wrapped)), 1234) is True and wrapped.bufferSize == 1234
    assert set_read_size(_Wrapper(_Wrapper(_Wrapper(_Wrapper(deep))))) is False  # never deeper than 4 hops
    assert deep.bufferSize == 65536  # Twisted's default, untouched
    assert set_read_size(StringTransport()) is False  # a fake transport: nothing to tune
    assert set_read_size(None) is False


def test_a_remoting_connection_reads_more_than_twisteds_default():
    """A leader's batch is what one read holds: the member's connections read READ_SIZE at a time."""
    from twisted.internet.task import Clock

    from dledger.transport.protocol import RemotingProtocol
    from dledger.transport.sockopts import READ_SIZE

    connection = _connection()
    proto = RemotingProtocol(Clock())
    proto.makeConnection(_Wrapper(connection))
    assert READ_SIZE > 65536
    assert connection.bufferSize == READ_SIZE
