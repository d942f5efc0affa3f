"""A member's election state (SPEC §2), persisted through an ``ITermVoteStore``.

``curr_term`` and ``vote_for`` are written to the term/vote store *before*
the in-memory value changes, so no reply can ever promise more than the disk
holds: a member that crashes right after persisting answers the same way
when it comes back.
"""

from __future__ import annotations

from twisted.logger import Logger
from zope.interface import implementer

from dledger.codes import ResponseCode, Role
from dledger.election import rules
from dledger.errors import DLedgerError
from dledger.interfaces import IMemberState
from dledger.messages import INT64_MAX, MAX_TERM
from dledger.quorum import majority

log = Logger()


@implementer(IMemberState)
class MemberState:
    """Role, term, vote, leader and the live table of one member. Mutated only by the elector."""

    def __init__(self, self_id: str, members: list[str] | tuple[str, ...], term_store, group: str = "default"):
        if self_id not in members:
            raise ValueError(f"{self_id!r} is not one of {list(members)}")
        self.self_id = self_id
        self.group = group
        self.members = tuple(members)
        self.member_set = frozenset(members)
        self.term_store = term_store
        self.curr_term, self.vote_for = term_store.load()
        if self.curr_term < 0:
            raise ValueError(f"term store holds a negative term {self.curr_term}")
        if self.curr_term > INT64_MAX:  # persisted by a member without wire bounds (issue #9, item 13)
            raise ValueError(f"term store holds term {str(self.curr_term)[:24]}, beyond the signed 64-bit term "
                             f"field: no entry of that term can be written; reset the term/vote file")
        self.role = Role.CANDIDATE
        self.leader_id: str | None = None
        self.known_max_term = self.curr_term
        self.transferee: str | None = None
        self.term_to_take_leadership = -1
        self.peers_live: dict[str, bool] = {}

    @property
    def peers(self) -> tuple[str, ...]:
        """Every member but this one."""
        return tuple(m for m in self.members if m != self.self_id)

    @property
    def quorum(self) -> int:
        return majority(len(self.members))

    @property
    def taking_leadership(self) -> bool:
        """This member was asked to take leadership and is trying, in the term it was given."""
        return self.term_to_take_leadership != -1 and self.term_to_take_leadership == self.curr_term

    # -- persisted transitions ------------------------------------------------
    def _persist(self, term: int, vote_for: str | None) -> None:
        if term < self.curr_term:
            raise AssertionError(f"term would go back from {self.curr_term} to {term}")
        if not 0 <= term <= INT64_MAX:
            # Last line of defence: messages are bounds-checked when decoded (messages.FIELD_BOUNDS), but a
            # term the term/vote store cannot hold must never reach it (issue #9: a persisted 10**30 bricked
            # every member).
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"term {term} does not fit the signed 64-bit term field; not persisted")
        self.term_store.save(term, vote_for)
        self.curr_term, self.vote_for = term, vote_for

    def next_term(self) -> int:
        """Move a candidate to its next term (SPEC §2 ``nextTerm``) and persist it with no vote."""
        if self.role is not Role.CANDIDATE:
            raise AssertionError(f"next_term() as {self.role.name}")
        term = rules.next_term(self.curr_term, self.known_max_term)
        self._persist(term, None)
        self.known_max_term = max(self.known_max_term, term)
        return term

    def record_vote(self, candidate: str) -> None:
        """Promise our vote in the current term; durable before it returns."""
        self._persist(self.curr_term, candidate)

    # -- role changes (no persistence needed: they do not change term or vote) ----
    def change_to_candidate(self, term: int) -> bool:
        """Become candidate aware of ``term``; the term itself moves at the next ``next_term``."""
        if term < self.curr_term:
            log.warn("{id}: ignoring candidate change to stale term {term} (current {curr})",
                     id=self.self_id, term=term, curr=self.curr_term)
            return False
        if term > MAX_TERM:  # decoding refuses such terms; never let one become the next persisted term
            log.warn("{id}: ignoring candidate change to term {term}: beyond the largest term {max}",
                     id=self.self_id, term=term, max=MAX_TERM)
            return False
        self.known_max_term = max(self.known_max_term, term)
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.transferee = None
        return True

    def change_to_follower(self, term: int, leader_id: str) -> None:
        if term != self.curr_term:
            raise AssertionError(f"follow {leader_id} in term {term} while in term {self.curr_term}")
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.transferee = None

    def change_to_leader(self, term: int) -> None:
        if term != self.curr_term:
            raise AssertionError(f"lead in term {term} while in term {self.curr_term}")
        self.role = Role.LEADER
        self.leader_id = self.self_id
        self.transferee = None
        self.peers_live = {}

    def __repr__(self) -> str:
        return (f"<MemberState {self.self_id} {self.role.name} term={self.curr_term} vote={self.vote_for} "
                f"leader={self.leader_id}>")
