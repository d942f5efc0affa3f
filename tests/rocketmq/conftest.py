"""Golden RocketMQ 4.9.8 stores for the broker-layer tests: paths, restoring trimmed files, INDEX.md tables."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent.parent / "golden" / "rocketmq-4.9.8"
STORE = GOLDEN / "store"
MIGRATION = GOLDEN / "store-migration"
FILE_SIZE = 65536  # mappedFileSizeCommitLog of the recording (also the DLedger data file size)
CQ_FILE_SIZE = 1000  # mappedFileSizeConsumeQueue of the recording
#: Files bigger than this (the 160 MiB DLedger index) are not restored: nothing here reads them.
RESTORE_LIMIT = 1 << 20


def index_rows(index_md: Path, heading: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table after the heading line starting with ``heading``."""
    lines = index_md.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif table:
            break
    header, rows = table[0], table[2:]
    return [dict(zip(header, row, strict=True)) for row in rows if row[0] != "..."]


def original_sizes(index_md: Path) -> dict[str, int]:
    """``path -> original size`` from an INDEX.md "Files" table (files were stored without trailing zeros)."""
    sizes = {}
    for line in index_md.read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \| (\d+) \| (\d+) \| [0-9a-f]{32} \|$", line)
        if m:
            sizes[m.group(1)] = int(m.group(2))
    return sizes


def restore(src: Path, dst: Path) -> Path:
    """Copy a trimmed golden store to ``dst`` and pad its files with zeros back to their original sizes."""
    shutil.copytree(src, dst)
    for rel, size in original_sizes(src / "INDEX.md").items():
        path = dst / rel
        path.chmod(0o644)
        if size <= RESTORE_LIMIT and path.stat().st_size < size:
            with open(path, "ab") as fh:
                fh.write(bytes(size - path.stat().st_size))
    return dst


@pytest.fixture(scope="session")
def main_store(tmp_path_factory) -> Path:
    """The master n1's store after scenarios 1-3, files at full size."""
    return restore(STORE, tmp_path_factory.mktemp("golden") / "store")


@pytest.fixture(scope="session")
def phase1_store(tmp_path_factory) -> Path:
    """The migration broker's plain store before DLedger was enabled, files at full size."""
    return restore(MIGRATION / "phase1-plain", tmp_path_factory.mktemp("golden") / "phase1")


@pytest.fixture(scope="session")
def phase2_store(tmp_path_factory) -> Path:
    """The same store after the DLedger restart (old CommitLog + DLedger data), files at full size."""
    return restore(MIGRATION / "phase2-dledger", tmp_path_factory.mktemp("golden") / "phase2")


def golden_entries(data_dir: Path):
    """Every DLedger entry of a (trimmed) data directory, decoded with dledger's public entry codec."""
    from dledger.entry import BLANK_MAGIC, decode_entry, peek

    for path in sorted(data_dir.iterdir()):
        data = path.read_bytes()
        pos = 0
        while len(data) - pos >= 8:
            magic, _ = peek(data, pos)
            if magic in (BLANK_MAGIC, 0):
                break
            entry = decode_entry(data, pos, accept_zero_crc=True)
            yield entry
            pos += entry.size
