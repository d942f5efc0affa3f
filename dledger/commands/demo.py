"""``dledger demo``: the README's main job."""

from __future__ import annotations

from dledger.codes import Role
from dledger.entry import Entry, decode_entry, encode_entry
from dledger.store.memory import MemoryLogStore
from dledger.testing.store_contract import FakeMemberState


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the local demo",
                              description="Foundation demo (the cluster demo arrives with replication): "
                                          "appends entries to a memory store and shows their encoding.")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    print("dledger foundation demo -- the multi-member cluster demo arrives with election and replication")
    state = FakeMemberState(role=Role.LEADER, curr_term=1, leader_id="n0")
    store = MemoryLogStore(state, data_file_size=256)
    for i in range(6):
        e = store.append_as_leader(Entry(body=f"hello-{i}".encode() * 3, term=1))
        raw = encode_entry(e)
        assert decode_entry(raw) == e
        print(f"  index={e.index} term={e.term} pos={e.pos:4} size={e.size} crc={e.body_crc & 0xffffffff:08x} "
              f"body={e.body[:16]!r}...")
    print(f"end index {store.ledger_end_index}; positions skip to the next 256-byte file when an entry would not fit")
    return 0
