"""A member's election state (SPEC §2), persisted through an ``ITermVoteStore``.

A change of ``curr_term`` or ``vote_for`` is made in memory first (so the
next request already sees it: a second candidate of the same term is refused
while the first vote is still being written) and then written, through a
:class:`dledger.diskio.BlockingIO`, off the reactor thread for a running
member.  Nothing that depends on the change may leave the member before the
write completes: :meth:`MemberState.persisted` fires then, and the elector
and the server hold vote, heartbeat and push replies (and a candidate its
vote requests) until it does.  A crash between the memory update and the
write therefore loses only a change nobody was told about: after the restart
the member answers from what the disk holds, and it never promised anything
else (in particular it never granted a vote that is not on disk, so it can
never grant two in one term).

Writes are serialised: at most one is in flight, and each writes the whole
latest state, so a later term or vote is never overwritten by an earlier
write finishing late (the state only moves forward, so writing the latest
covers every change made before it).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger.codes import ResponseCode, Role
from dledger.diskio import INLINE, BlockingIO
from dledger.election import rules
from dledger.errors import DLedgerError
from dledger.interfaces import IMemberState
from dledger.messages import INT64_MAX, MAX_TERM
from dledger.quorum import majority

log = Logger()


@implementer(IMemberState)
class MemberState:
    """Role, term, vote, leader and the live table of one member. Mutated only by the elector."""

    def __init__(self, self_id: str, members: list[str] | tuple[str, ...], term_store, group: str = "default",
                 blocking_io: BlockingIO = INLINE):
        if self_id not in members:
            raise ValueError(f"{self_id!r} is not one of {list(members)}")
        self.self_id = self_id
        self.group = group
        self.members = tuple(members)
        self.member_set = frozenset(members)
        #: The members that vote (issue #23): every member until a configuration says otherwise.
        self.voters = self.members
        self.voter_set = self.member_set
        #: The :class:`dledger.membership.configuration.Configuration` in force (None: the static ``members``).
        self.configuration = None
        self.term_store = term_store
        self.curr_term, self.vote_for = term_store.load()
        if self.curr_term < 0:
            raise ValueError(f"term store holds a negative term {self.curr_term}")
        if self.curr_term > INT64_MAX:  # persisted by a member without wire bounds (issue #9, item 13)
            raise ValueError(f"term store holds term {str(self.curr_term)[:24]}, beyond the signed 64-bit term "
                             f"field: no entry of that term can be written; reset the term/vote file")
        self.role = Role.CANDIDATE
        self.leader_id: str | None = None
        #: The term this member may have led before it (re)started, -1 if none: its persisted vote there is
        #: its own.  The elector never asks for votes in it again (rules.bumps_term, issue #29): the tail it
        #: wrote as that leader may be gone with the machine's page cache.
        self.led_term = rules.may_have_led(self.curr_term, self.vote_for, self_id)
        #: The leader this member knew in ``curr_term``, kept after it stopped following (rules.decide_vote).
        self.term_leader: str | None = None
        self.known_max_term = self.curr_term
        self.transferee: str | None = None
        self.term_to_take_leadership = -1
        self.peers_live: dict[str, bool] = {}
        #: Where term/vote writes run (inline in tests and simulations: the write is done when the change returns).
        self.io = blocking_io
        self._version = 0  # bumps on every change of (curr_term, vote_for)
        self._written = 0  # the last version known to be on disk
        self._writing = False  # a write is in flight (at most one: writes never overtake each other)
        self._waiting: list[tuple[int, Deferred]] = []  # (version, fired once it is on disk)

    @property
    def peers(self) -> tuple[str, ...]:
        """Every member but this one (voters and learners)."""
        return tuple(m for m in self.members if m != self.self_id)

    @property
    def voter_peers(self) -> tuple[str, ...]:
        """Every voter but this one: whom a candidate asks for votes."""
        return tuple(m for m in self.voters if m != self.self_id)

    @property
    def quorum(self) -> int:
        """A majority of the voters."""
        return majority(len(self.voters))

    @property
    def votes(self) -> bool:
        """This member is a voter of the configuration in force (a learner or a removed member is not)."""
        return self.self_id in self.voter_set

    def set_configuration(self, config) -> None:
        """The configuration in force changed (``server.membership`` observes the log): members and voters follow."""
        self.configuration = config
        self.members = config.ids
        self.member_set = frozenset(self.members)
        self.voters = config.voters
        self.voter_set = frozenset(self.voters)
        for gone in [p for p in self.peers_live if p not in self.member_set]:
            del self.peers_live[gone]

    @property
    def led_current_term(self) -> bool:
        """This member may have led its current term before it started: it must not stand in that term again."""
        return self.curr_term <= self.led_term

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
        # Written even when unchanged (a repeated vote for the same candidate): as it always was, so
        # seeded simulations, whose term stores observe every save, replay the same schedules.
        if term != self.curr_term:
            self.term_leader = None
        self.curr_term, self.vote_for = term, vote_for
        self._version += 1
        self._write()

    def _write(self) -> None:
        """Start writing the latest (term, vote) unless a write is in flight or it is on disk already."""
        if self._writing or self._written >= self._version:
            return
        self._writing = True
        version = self._version
        d = self.io.run(self.term_store.save, self.curr_term, self.vote_for)
        d.addCallbacks(self._wrote, self._write_failed, callbackArgs=(version,), errbackArgs=(version,))

    def _wrote(self, _result, version: int) -> None:
        self._writing = False
        self._written = max(self._written, version)
        self._release(version, None)
        self._write()  # changes made while this write ran

    def _write_failed(self, failure: Failure, version: int) -> None:
        self._writing = False
        log.error("{id}: cannot write term {term} / vote {vote} to the term/vote store: {why}; nothing that "
                  "depends on it is sent", id=self.self_id, term=self.curr_term, vote=self.vote_for,
                  why=failure.getErrorMessage())
        self._release(version, failure)
        if self._version > version:
            self._write()  # a later change gets its own attempt; the same one is retried by the next persisted()

    def _release(self, version: int, failure: Failure | None) -> None:
        due, self._waiting = ([w for w in self._waiting if w[0] <= version],
                              [w for w in self._waiting if w[0] > version])
        for _v, d in due:
            d.errback(failure) if failure is not None else d.callback(None)

    @property
    def dirty(self) -> bool:
        """A change of term or vote is not on disk yet."""
        return self._written < self._version

    def persisted(self) -> Deferred:
        """Fires once every term/vote change made so far is on disk (at once if it is); fails if the write failed.

        Asking again after a failure retries the write.
        """
        if not self.dirty:
            return succeed(None)
        d: Deferred = Deferred()
        self._waiting.append((self._version, d))
        self._write()
        return d

    def after_persisted(self, reply):
        """``reply`` (a value or a Deferred of one), released only once the term/vote it may reveal is on disk.

        Returned unchanged when nothing is being written (always, with inline I/O), so callers see no
        difference there.
        """
        if isinstance(reply, Deferred):
            return reply.addCallback(self.after_persisted)
        if not self.dirty:
            return reply
        return self.persisted().addCallback(lambda _: reply)

    def next_term(self) -> int:
        """Move a candidate to its next term (SPEC §2 ``nextTerm``) and start writing it with no vote.

        The new term is on disk once :meth:`persisted` fires; nothing may be sent in it before.
        """
        if self.role is not Role.CANDIDATE:
            raise AssertionError(f"next_term() as {self.role.name}")
        term = rules.next_term(self.curr_term, self.known_max_term)
        self._persist(term, None)
        self.known_max_term = max(self.known_max_term, term)
        return term

    def record_vote(self, candidate: str) -> Deferred:
        """Promise our vote in the current term; the Deferred fires once the promise is on disk.

        Memory changes at once, so every later request of this term sees the vote; the reply that
        grants it must wait for the Deferred.
        """
        self._persist(self.curr_term, candidate)
        return self.persisted()

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
        self.term_leader = leader_id
        self.transferee = None

    def change_to_leader(self, term: int) -> None:
        if term != self.curr_term:
            raise AssertionError(f"lead in term {term} while in term {self.curr_term}")
        self.role = Role.LEADER
        self.leader_id = self.self_id
        self.term_leader = self.self_id
        self.transferee = None
        self.peers_live = {}

    def __repr__(self) -> str:
        return (f"<MemberState {self.self_id} {self.role.name} term={self.curr_term} vote={self.vote_for} "
                f"leader={self.leader_id}>")
