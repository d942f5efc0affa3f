"""What a snapshot holds: ``manifest.json`` (docs/snapshots.md, "On disk").

A manifest is written last into a snapshot's directory, so a directory
without one is not a snapshot.  Parsing is strict and every problem is one
line naming the file: a damaged snapshot is skipped at start-up with that
line, never a traceback.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

FORMAT = 1
MANIFEST_NAME = "manifest.json"
#: A state machine's name is also a directory name inside the snapshot.
NAME_RE = re.compile(r"^[a-z0-9_.-]{1,64}$")
#: ``<index>-<term>``: a finished snapshot's directory name.
DIR_RE = re.compile(r"^(\d+)-(\d+)$")


class ManifestError(ValueError):
    """A manifest that cannot be used; ``str()`` is one line naming the file and the problem."""


@dataclass(frozen=True)
class FileInfo:
    """One chunk file of a section: its path relative to the snapshot directory, size and CRC32C."""

    path: str
    size: int
    crc32c: int

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "crc32c": self.crc32c}


@dataclass(frozen=True)
class Section:
    """One state machine's part of a snapshot: its chunk files, in order."""

    name: str
    files: tuple[FileInfo, ...] = ()

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict:
        return {"name": self.name, "files": [f.to_json() for f in self.files]}


@dataclass(frozen=True)
class Manifest:
    """A snapshot: the last entry it includes (``index``/``term``), where the next entry goes, its sections."""

    index: int
    term: int
    next_pos: int
    members: tuple[str, ...] = ()
    sections: tuple[Section, ...] = ()
    created: float = 0.0
    format: int = FORMAT
    #: Where it lives (not part of the JSON): the snapshot's directory name, ``<index>-<term>``.
    dirname: str = field(default="", compare=False)
    #: The configuration in force at ``index`` with every member's role (issue #23): a
    #: :class:`dledger.membership.configuration.Configuration`'s JSON.  None in a manifest written
    #: before membership changes (``members`` alone, every member a voter).
    configuration: dict | None = None

    def __post_init__(self) -> None:
        if not self.dirname:
            object.__setattr__(self, "dirname", dir_name(self.index, self.term))

    @property
    def size(self) -> int:
        """Bytes of every chunk file together."""
        return sum(s.size for s in self.sections)

    @property
    def files(self) -> list[FileInfo]:
        """Every chunk file, section by section, in order (what InstallSnapshot sends)."""
        return [f for s in self.sections for f in s.files]

    def section(self, name: str) -> Section | None:
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def file(self, path: str) -> FileInfo | None:
        for f in self.files:
            if f.path == path:
                return f
        return None

    def to_json(self) -> dict:
        doc = {"format": self.format, "index": self.index, "term": self.term, "nextPos": self.next_pos,
               "members": list(self.members), "sections": [s.to_json() for s in self.sections],
               "created": self.created}
        if self.configuration is not None:
            doc["configuration"] = self.configuration
        return doc

    def config(self):
        """The :class:`~dledger.membership.configuration.Configuration` this snapshot records (None: none)."""
        if self.configuration is None:
            return None
        from dledger.membership.configuration import from_json
        return from_json(self.configuration, self.index, self.term).at(self.index, self.term)

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=False).encode() + b"\n"

    @classmethod
    def from_json(cls, obj, where: str = "manifest") -> Manifest:
        """A manifest from its parsed JSON; ManifestError (one line naming ``where``) if anything is off."""
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        fmt = _int(obj, "format", where)
        if fmt != FORMAT:
            raise ManifestError(f"{where}: format {fmt} is not supported (this dledger reads format {FORMAT})")
        index, term, next_pos = (_int(obj, k, where) for k in ("index", "term", "nextPos"))
        if index < 0 or term < 0 or next_pos < 0:
            raise ManifestError(f"{where}: index, term and nextPos must be >= 0 (got {index}, {term}, {next_pos})")
        members = obj.get("members", [])
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ManifestError(f"{where}: 'members' must be a list of strings")
        raw_sections = obj.get("sections")
        if not isinstance(raw_sections, list):
            raise ManifestError(f"{where}: 'sections' must be a list")
        sections, names, paths = [], set(), set()
        for k, raw in enumerate(raw_sections):
            if not isinstance(raw, dict):
                raise ManifestError(f"{where}: section #{k} is not an object")
            name = raw.get("name")
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise ManifestError(f"{where}: section #{k} has a bad name {name!r} (expected [a-z0-9_.-]{{1,64}})")
            if name in names:
                raise ManifestError(f"{where}: section {name!r} appears twice")
            names.add(name)
            raw_files = raw.get("files")
            if not isinstance(raw_files, list):
                raise ManifestError(f"{where}: section {name!r}: 'files' must be a list")
            files = []
            for f in raw_files:
                if not isinstance(f, dict):
                    raise ManifestError(f"{where}: section {name!r}: a file entry is not an object")
                path = f.get("path")
                if not isinstance(path, str) or not _safe_path(path, name):
                    raise ManifestError(f"{where}: section {name!r}: bad file path {path!r} "
                                        f"(expected '{name}/NNNNNN')")
                if path in paths:
                    raise ManifestError(f"{where}: file {path!r} appears twice")
                paths.add(path)
                size, crc = _int(f, "size", where), _int(f, "crc32c", where)
                if size < 0 or not 0 <= crc < 1 << 32:
                    raise ManifestError(f"{where}: file {path!r}: bad size {size} or crc32c {crc}")
                files.append(FileInfo(path, size, crc))
            sections.append(Section(name, tuple(files)))
        created = obj.get("created", 0.0)
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ManifestError(f"{where}: 'created' must be a number")
        configuration = obj.get("configuration")
        if configuration is not None:
            from dledger.membership.configuration import ConfigurationError, from_json
            try:
                from_json(configuration)
            except ConfigurationError as exc:
                raise ManifestError(f"{where}: 'configuration': {exc}") from None
        return cls(index, term, next_pos, tuple(members), tuple(sections), float(created), fmt,
                   configuration=configuration)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "manifest") -> Manifest:
        try:
            obj = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ManifestError(f"{where}: not UTF-8") from None
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{where}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
        return cls.from_json(obj, where)


def dir_name(index: int, term: int) -> str:
    """The directory name of a finished snapshot."""
    return f"{index}-{term}"


def parse_dir_name(name: str) -> tuple[int, int] | None:
    """``(index, term)`` of a finished snapshot's directory name, None for anything else."""
    m = DIR_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def chunk_path(section: str, k: int) -> str:
    """The relative path of chunk file ``k`` of ``section``."""
    return f"{section}/{k:06d}"


def _safe_path(path: str, section: str) -> bool:
    """Only ``<section>/<digits>``: a manifest (maybe from a leader) never names a file elsewhere."""
    head, sep, tail = path.partition("/")
    return bool(sep) and head == section and tail.isdigit() and len(tail) <= 12


def _int(obj: dict, key: str, where: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ManifestError(f"{where}: {key!r} must be an integer, got {value!r}")
    return value
