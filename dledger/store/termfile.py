"""Reading and writing the bytes of ``currterm`` (Java DLedger's term/vote file), and nothing else.

Below both :mod:`.termvote` (the store that persists votes) and :mod:`.offline` (the read-only tools that
check a stopped member's files), so neither imports the other's module for it (issue #26: no import circles).
"""

from __future__ import annotations

from pathlib import Path

from dledger.errors import StoreError
from dledger.store.ownership import TermVote
from dledger.store.properties import format_properties, int_property, parse_properties

NAME = "currterm"


def encode_term_vote(term: int, vote_for: str | None) -> bytes:
    return format_properties([("voteLeader", vote_for or ""), ("currTerm", str(term))])


def decode_term_vote(data: bytes, path: str | Path) -> tuple[int, str | None]:
    props = parse_properties(data, path)
    term = int_property(props, "currTerm", path, minimum=0)
    vote = props.get("voteLeader", "")
    return term, (vote or None)


def read_state(member_dir: str | Path) -> tuple[TermVote, tuple[int, str | None] | None, str, tuple[int, ...]]:
    """What ``currterm`` holds, read-only: ``(state, (term, vote) or None, problem, terms still readable)``.

    ``problem`` says what is wrong ("is missing", "is damaged (...)");
    the readable terms (of ``currterm.bak``) raise the floor of a reset.
    """
    path = Path(member_dir) / NAME
    backup = path.with_name(NAME + ".bak")
    known: tuple[int, ...] = ()
    try:
        known = (decode_term_vote(backup.read_bytes(), backup)[0],)
    except (OSError, StoreError):
        pass
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if backup.exists():
            return TermVote.DAMAGED, None, f"is missing but {backup.name} exists", known
        return TermVote.MISSING, None, "is missing", known
    except OSError as exc:
        return TermVote.DAMAGED, None, f"cannot be read ({exc.strerror})", known
    try:
        return TermVote.OK, decode_term_vote(data, path), "", known
    except StoreError as exc:
        detail = str(exc).removeprefix(f"{path}: ")
        return TermVote.DAMAGED, None, f"is damaged ({detail})", known
