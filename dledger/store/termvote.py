"""``currterm``: the durable term and vote of the mmap store type, in Java DLedger's format.

Java's ``MemberState`` writes ``voteLeader=n1\\ncurrTerm=1\\n`` (voteLeader
first, an empty value when this member has not voted in the term) and keeps
the previous content in ``currterm.bak``.  A vote is a promise: the file is
replaced atomically and fsynced before :meth:`FileTermVoteStore.save`
returns, and a damaged file stops the member with a StoreError instead of
letting it start at term 0 and vote twice.
"""

from __future__ import annotations

from pathlib import Path

from zope.interface import implementer

from dledger import diskio
from dledger.errors import StoreError
from dledger.interfaces import ITermVoteStore
from dledger.store.properties import format_properties, int_property, parse_properties

NAME = "currterm"


def encode_term_vote(term: int, vote_for: str | None) -> bytes:
    return format_properties([("voteLeader", vote_for or ""), ("currTerm", str(term))])


def decode_term_vote(data: bytes, path: str | Path) -> tuple[int, str | None]:
    props = parse_properties(data, path)
    term = int_property(props, "currTerm", path, minimum=0)
    vote = props.get("voteLeader", "")
    return term, (vote or None)


@implementer(ITermVoteStore)
class FileTermVoteStore:
    """``<member_dir>/currterm`` (plus ``.bak``), read once at :meth:`load`, rewritten on every :meth:`save`."""

    def __init__(self, member_dir: str | Path):
        self.member_dir = Path(member_dir)
        self.path = self.member_dir / NAME

    def load(self) -> tuple[int, str | None]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            backup = self.path.with_name(NAME + ".bak")
            if backup.exists():
                raise StoreError(f"{self.path} is missing but {backup} exists: restore it (or copy the backup "
                                 f"over it) so this member does not forget a vote") from None
            return 0, None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot read ({exc})") from None
        return decode_term_vote(data, self.path)

    def save(self, term: int, vote_for: str | None) -> None:
        if term < 0:
            raise ValueError(f"term must be >= 0, got {term}")
        self.member_dir.mkdir(parents=True, exist_ok=True)
        diskio.write_atomic(self.path, encode_term_vote(term, vote_for), backup=True)

    def close(self) -> None:
        pass
