"""The memory store against the log-store contract suite."""

import pytest
from zope.interface.verify import verifyObject

from dledger.interfaces import ITermVoteStore
from dledger.store.memory import MemoryLogStore, MemoryTermVoteStore
from dledger.testing.store_contract import LogStoreContract


class TestMemoryStore(LogStoreContract):
    persistent = False

    @pytest.fixture
    def open_store(self):
        def open_(member_state):
            store = MemoryLogStore(member_state, data_file_size=self.data_file_size)
            store.startup()
            return store
        return open_


def test_memory_term_store_round_trip():
    """The memory term/vote store returns what was saved and provides ITermVoteStore."""
    store = MemoryTermVoteStore()
    assert verifyObject(ITermVoteStore, store)
    assert store.load() == (0, None)
    store.save(3, "n1")
    assert store.load() == (3, "n1")
