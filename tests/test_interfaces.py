"""Every implementation provides the seam it declares (zope.interface verifyObject)."""

from zope.interface.verify import verifyObject

from dledger.election.state import MemberState
from dledger.interfaces import (
    ILogStore,
    IMemberState,
    IRequestHandler,
    IRetainingLogStore,
    ITermVoteStore,
    ITransport,
)
from dledger.store.lmdbstore import LmdbLogStore
from dledger.store.memory import MemoryLogStore, MemoryTermVoteStore
from dledger.store.mmapfile import MmapLogStore
from dledger.store.termvote import FileTermVoteStore
from dledger.testing.clock import SimClock
from dledger.testing.cluster import Cluster
from dledger.testing.simdisk import SimulatedDisk
from dledger.testing.store_contract import FakeMemberState
from dledger.transport.inprocess import InProcessNetwork


def test_member_state_provides_imemberstate():
    """MemberState is the IMemberState stores see."""
    assert verifyObject(IMemberState, MemberState("n0", ["n0", "n1"], MemoryTermVoteStore()))


def test_term_stores_provide_itermvotestore(tmp_path):
    """Memory and file term/vote stores provide ITermVoteStore."""
    assert verifyObject(ITermVoteStore, MemoryTermVoteStore())
    assert verifyObject(ITermVoteStore, FileTermVoteStore(tmp_path))


def test_log_stores_provide_ilogstore(tmp_path):
    """Memory, simulated-disk, mmap and LMDB stores provide ILogStore; mmap also retention."""
    state = FakeMemberState()
    assert verifyObject(ILogStore, MemoryLogStore(state))
    assert verifyObject(ILogStore, SimulatedDisk().open(state))
    mmap_store = MmapLogStore(tmp_path / "m", state, data_file_size=4096, index_file_size=1024, clock=SimClock())
    assert verifyObject(IRetainingLogStore, mmap_store)
    assert verifyObject(ILogStore, LmdbLogStore(tmp_path / "l", state))


def test_transports_and_server_provide_their_interfaces():
    """The in-process transport provides ITransport and a server is an IRequestHandler."""
    assert verifyObject(ITransport, InProcessNetwork(SimClock()).transport("n0"))
    cluster = Cluster(3)
    cluster.start()
    assert verifyObject(IRequestHandler, cluster.servers["n0"])
