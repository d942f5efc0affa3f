"""The process-test state machine (dledger.testing.smplugin): its generated snapshot and its restore."""

from twisted.internet import task
from twisted.internet.defer import Deferred, succeed

from dledger.testing.smplugin import PIECE, BlobMachine, install


class Writer:
    def __init__(self, clock=None):
        self.clock, self.data = clock, []

    def write(self, data):
        self.data.append(bytes(data))
        if self.clock is None:
            return succeed(None)
        d = Deferred()
        self.clock.callLater(0.01, d.callback, None)
        return d


class Reader:
    def __init__(self, data, clock=None):
        self.data, self.clock = data, clock

    def read(self, n):
        out, self.data = self.data[:n], self.data[n:]
        if self.clock is None:
            return succeed(out)
        d = Deferred()
        self.clock.callLater(0.01, d.callback, out)
        return d


def test_blob_snapshot_and_restore_with_immediate_and_later_deferreds():
    """A BlobMachine writes exactly its size piece by piece and restores it, whether I/O answers at once or later."""
    size = 3 * PIECE + 5
    for clock in (None, task.Clock()):
        writer, machine = Writer(clock), BlobMachine(size)
        d = machine.snapshot(writer)
        while clock is not None and not d.called:
            clock.advance(0.01)
        assert d.called and sum(map(len, writer.data)) == size
        assert len(set(writer.data[:3])) == 3  # every piece differs
        again = BlobMachine(size)
        r = again.restore(Reader(b"".join(writer.data), clock))
        while clock is not None and not r.called:
            clock.advance(0.01)
        assert r.called and again.restored_bytes == size and again.restore_ok


def test_install_writes_an_entry_point(tmp_path):
    """install() makes a directory that exposes the module in the dledger entry-point group."""
    import importlib.metadata

    path = install(tmp_path)
    eps = [ep for d in importlib.metadata.distributions(path=[path]) for ep in d.entry_points]
    assert [(ep.group, ep.name, ep.value) for ep in eps] == [("dledger", "testsm", "dledger.testing.smplugin")]
