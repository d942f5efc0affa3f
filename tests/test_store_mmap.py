"""The mmap file store: the log-store contract, file layout, checkpoint, flushing, retention and disk-full."""

from __future__ import annotations

import pytest

from dledger.store.mmapfile import MmapLogStore
from dledger.testing.store_contract import LogStoreContract


def open_mmap(path, state, **kwargs):
    kwargs.setdefault("data_file_size", 1024)
    kwargs.setdefault("index_file_size", 256)
    kwargs.setdefault("max_entry_size", 1024 - 8)
    store = MmapLogStore(path, state, **kwargs)
    store.startup()
    return store


class TestMmapStoreContract(LogStoreContract):
    persistent = True

    @pytest.fixture(params=[256, 4096], ids=["index256", "index4096"])
    def index_file_size(self, request):
        return request.param

    @pytest.fixture
    def open_store(self, tmp_path, index_file_size):
        def open_(member_state):
            return open_mmap(tmp_path / "dledger-n0", member_state, data_file_size=self.data_file_size,
                             index_file_size=index_file_size, max_entry_size=self.max_entry_size)
        return open_
