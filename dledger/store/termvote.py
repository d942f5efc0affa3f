"""``currterm``: the durable term and vote of the mmap store type, in Java DLedger's format.

Java's ``MemberState`` writes ``voteLeader=n1\\ncurrTerm=1\\n`` (voteLeader
first, an empty value when this member has not voted in the term) and keeps
the previous content in ``currterm.bak``.  A vote is a promise: the file is
replaced atomically and fsynced before :meth:`FileTermVoteStore.save`
returns, and a missing or damaged file on a store that holds a log stops
the member with a :class:`~dledger.errors.TermVoteLostError` (naming
``dledger store reset-vote``) instead of letting it start at term 0 and vote
twice (see :mod:`.ownership`).
"""

from __future__ import annotations

from pathlib import Path

from zope.interface import implementer

from dledger import diskio
from dledger.interfaces import ITermVoteStore
from dledger.store import ownership
from dledger.store.ownership import TermVote
from dledger.store.termfile import NAME, decode_term_vote, encode_term_vote, read_state  # noqa: F401 - re-exported


@implementer(ITermVoteStore)
class FileTermVoteStore:
    """``<member_dir>/currterm`` (plus ``.bak``), read once at :meth:`load`, rewritten on every :meth:`save`.

    :meth:`load` first claims the directory (:func:`.ownership.claim`: the
    exclusive lock and, with an ``owner``, the identity check), then applies
    the term/vote rule: a missing or damaged file on a store that holds a
    log, or that a member started on before, is a :class:`TermVoteLostError`
    naming ``dledger store reset-vote``; a new store starts at term 0 and
    gets its ``currterm`` (then its identity record) at once.
    """

    #: :meth:`save` touches only ``currterm`` (+ ``.bak``/``.tmp``), so a running member runs it on the thread pool.
    save_off_reactor = True

    def __init__(self, member_dir: str | Path, owner: ownership.Owner | None = None):
        self.member_dir = Path(member_dir)
        self.path = self.member_dir / NAME
        self.owner = owner
        self._claim: ownership.Claim | None = None

    def load(self) -> tuple[int, str | None]:
        if self._claim is None:
            self._claim = ownership.claim(self.member_dir, self.owner)
        try:
            return self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> tuple[int, str | None]:
        from dledger.store.offline import mmap_last_term  # offline reads currterm with this module

        had_identity = (self.member_dir / ownership.IDENTITY_NAME).exists()
        state, saved, problem, known = read_state(self.member_dir)
        last = None if state is TermVote.OK else mmap_last_term(self.member_dir)
        return ownership.settle_term_vote(state, saved, problem, last, had_identity=had_identity, where=str(self.path),
                                          store_dir=self.member_dir, save=self.save, claim=self._claim,
                                          owner=self.owner, known_terms=known)

    def save(self, term: int, vote_for: str | None) -> None:
        if term < 0:
            raise ValueError(f"term must be >= 0, got {term}")
        self.member_dir.mkdir(parents=True, exist_ok=True)
        diskio.write_atomic(self.path, encode_term_vote(term, vote_for), backup=True)

    def close(self) -> None:
        ownership.release(self._claim)
        self._claim = None
