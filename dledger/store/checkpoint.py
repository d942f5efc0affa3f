"""The ``checkpoint`` file of the mmap store: ``committedIndex`` and ``endIndex``, in Java's format.

Java DLedger writes ``committedIndex=20\\nendIndex=20\\n`` (committedIndex
first) and keeps the previous content in ``checkpoint.bak``.  We write the
same bytes through :func:`dledger.diskio.write_atomic`.  Recovery only uses
the checkpoint as a hint of where durable data ends: the log itself is
verified, so a missing, stale or damaged checkpoint costs time, never data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twisted.logger import Logger

from dledger import diskio
from dledger.errors import StoreError
from dledger.store.properties import format_properties, int_property, parse_properties

NAME = "checkpoint"
log = Logger()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """``end_index``: entries up to here were durable when written; ``committed_index``: never past it."""

    end_index: int
    committed_index: int

    def encode(self) -> bytes:
        return format_properties([("committedIndex", str(self.committed_index)),
                                  ("endIndex", str(self.end_index))])


def parse_checkpoint(data: bytes, path: str | Path) -> Checkpoint:
    props = parse_properties(data, path)
    return Checkpoint(end_index=int_property(props, "endIndex", path, minimum=-1),
                      committed_index=int_property(props, "committedIndex", path, minimum=-1))


def read_checkpoint(member_dir: str | Path) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint (falling back to ``checkpoint.bak``) and a note on anything that was wrong.

    Returns ``(None, note)`` when neither file is usable; never raises for a
    damaged file, because recovery can do without it.
    """
    notes = []
    for name in (NAME, NAME + ".bak"):
        path = Path(member_dir) / name
        try:
            return parse_checkpoint(path.read_bytes(), path), ("; ".join(notes) or None)
        except FileNotFoundError:
            notes.append(f"{path} missing")
        except StoreError as exc:
            notes.append(str(exc))
    return None, "; ".join(notes)


def write_checkpoint(member_dir: str | Path, checkpoint: Checkpoint) -> None:
    """Blocking: replace the checkpoint (previous content to ``checkpoint.bak``), durably."""
    diskio.write_atomic(Path(member_dir) / NAME, checkpoint.encode(), backup=True)


def checkpoint_after_index(index_fds: list[int], member_dir: str | Path, checkpoint: Checkpoint) -> None:
    """Blocking: fdatasync the index files ``index_fds``, then replace the checkpoint (one job, in that order).

    Recovery trusts the index records up to the checkpoint's ``endIndex`` (it starts its walk there), and
    flush rounds sync only the data (see :mod:`dledger.store.flushing`): the records must be on disk
    before the checkpoint that vouches for them.
    """
    diskio.flush_files(index_fds, [], [])
    write_checkpoint(member_dir, checkpoint)
