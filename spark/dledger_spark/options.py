"""The data source's options, parsed and checked once (pure functions, no Spark, no network).

Every mistake is one line naming the option (``OptionError``, a ``ValueError``), raised where
Spark plans the query, so ``spark.read.format("dledger")...load()`` fails before any task runs.  An
option this source does not know is refused too, naming the closest one it does (Kafka's
``maxOffsetsPerTrigger`` -> ``maxEntriesPerTrigger``): ignored, it would silently read everything.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field

from dledger.config import parse_peers
from dledger.errors import ConfigError

READ_FROM = ("leader", "follower", "any")
FORMATS = ("raw", "rocketmq")
#: What a partition aims at: 128 MiB of entries (what Spark's file sources read per task) -- every task costs
#: a Parquet file of its own and the JVM's per-task work: 1M x 1 KiB entries took 24.8 instead of 29.8 us of
#: CPU per row in Spark's processes with 128 MiB tasks rather than 16 MiB ones (docs/benchmarks.md "Spark
#: ingest (perf-spark)"); a retried task re-reads at most that much.
DEFAULT_PARTITION_BYTES = 128 << 20
DEFAULT_TIMEOUT = 60.0


class OptionError(ValueError):
    """A data source option is missing or malformed (the message names it)."""


#: Every option, spelled as documented (Spark hands them case-insensitively).
OPTIONS = ("peers", "group", "groups", "startingIndex", "endingIndex", "maxEntriesPerTrigger", "readFrom", "format",
           "failOnDataLoss", "timeout", "partitionBytes", "tlsCa", "tlsCert", "tlsKey", "clientName", "tokenFile")
#: Names from Kafka's source (what a Spark user types first) and their counterparts here.
KAFKA_NAMES = {"startingOffsets": "startingIndex", "endingOffsets": "endingIndex",
               "maxOffsetsPerTrigger": "maxEntriesPerTrigger", "kafka.bootstrap.servers": "peers",
               "subscribe": "group"}


def _folded(name: str) -> str:
    """``tls-ca``, ``tls_ca`` and ``TLSCA`` compare equal to ``tlsCa``."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def closest_option(name: str) -> str | None:
    """The documented option ``name`` was probably meant to be (None if nothing is close)."""
    kafka = {_folded(k): v for k, v in KAFKA_NAMES.items()}
    if _folded(name) in kafka:
        return kafka[_folded(name)]
    folded = {_folded(o): o for o in OPTIONS}
    if _folded(name) in folded:
        return folded[_folded(name)]
    match = difflib.get_close_matches(_folded(name), list(folded), n=1, cutoff=0.6)
    return folded[match[0]] if match else None


def check_known(options) -> None:
    """OptionError for the first option (in name order) this source does not know."""
    known = {o.lower() for o in OPTIONS}
    for key in sorted(options.keys(), key=str.lower):
        if key.lower() in known:
            continue
        best = closest_option(key)
        hint = f"did you mean {best!r}?" if best else f"the options are {', '.join(OPTIONS)}"
        raise OptionError(f"unknown option {key!r}: {hint} (README 'Spark ingest', docs/operations.md)")


@dataclass(frozen=True)
class Credentials:
    """What the source presents to a secured group: the ``dledger`` CLI's ``--tls-ca``, ``--tls-cert``,
    ``--tls-key``, ``--client-name`` and ``--token-file`` (options ``tlsCa`` ... ``tokenFile``).

    Paths, not loaded objects: a Partition carries them to executors (pickled), where each Python worker
    builds its own :class:`dledger.security.guard.ClientCredentials`, so the files must be readable at
    the same path on every executor host.
    """

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    client_name: str | None = None
    token_file: str | None = None

    def __bool__(self) -> bool:
        return any((self.tls_ca, self.tls_cert, self.tls_key, self.client_name, self.token_file))

    def build(self, group: str):
        """dledger's ClientCredentials for ``group`` (None: plain TCP, anonymous); ConfigError for unusable files."""
        from dledger.security.guard import ClientCredentials

        return ClientCredentials.for_client(group, name=self.client_name or "", token_file=self.token_file,
                                            tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key)


def parse_credentials(options, groups: dict[str, str]) -> Credentials:
    """The credential options, checked by loading them once here on the driver (one line per mistake)."""
    creds = Credentials(*(_get(options, n) or None for n in ("tlsCa", "tlsCert", "tlsKey", "clientName", "tokenFile")))
    if (creds.tls_cert or creds.tls_key) and not creds.tls_ca:
        raise OptionError("options 'tlsCert'/'tlsKey' need 'tlsCa' (the CA the members' certificates chain to)")
    if bool(creds.tls_cert) != bool(creds.tls_key):
        raise OptionError("options 'tlsCert' and 'tlsKey' go together")
    if creds.token_file and not creds.client_name:
        raise OptionError("option 'tokenFile' needs 'clientName' (this client's name in the members' clientsFile)")
    if creds.client_name and not creds.token_file:
        raise OptionError("option 'clientName' needs 'tokenFile' (the file holding its token)")
    for group in groups:
        try:
            creds.build(group)
        except (ConfigError, ValueError) as exc:
            raise OptionError(f"credentials: {exc}") from None
    return creds


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one ``format("dledger")`` read."""

    #: group -> peers string (``n0-host:port;n1-host:port``), sorted by group.
    groups: dict[str, str]
    #: group -> "earliest" | "latest" | an index (the first one to read).
    starting: dict[str, str | int]
    #: group -> "latest" | an index (batch reads: read indexes below it).
    ending: dict[str, str | int]
    max_entries_per_trigger: int | None = None
    read_from: str = "leader"
    format: str = "raw"
    fail_on_data_loss: bool = True
    timeout: float = DEFAULT_TIMEOUT
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    credentials: Credentials = Credentials()
    extra: dict[str, str] = field(default_factory=dict)


def _get(options, name: str) -> str | None:
    """Spark hands options case-insensitively (a CaseInsensitiveDict); plain dicts are searched too."""
    if name in options:
        return options[name]
    lower = name.lower()
    for key, value in options.items():
        if key.lower() == lower:
            return value
    return None


def parse_groups(options) -> dict[str, str]:
    """``peers`` + ``group``, or ``groups``: a JSON object {group: peers} or group names sharing ``peers``."""
    peers, group, groups = _get(options, "peers"), _get(options, "group"), _get(options, "groups")
    if group and groups:
        raise OptionError("options 'group' and 'groups' exclude each other: give one")
    if groups:
        text = groups.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise OptionError(f"option 'groups': invalid JSON ({exc})") from None
            if not isinstance(obj, dict) or not obj or not all(isinstance(v, str) for v in obj.values()):
                raise OptionError("option 'groups': expected a JSON object {\"group\": \"n0-host:port;...\"}")
            result = {str(k): v for k, v in obj.items()}
        else:
            if not peers:
                raise OptionError("option 'groups' lists group names: 'peers' is needed too (or give "
                                  "'groups' as JSON {group: peers})")
            names = [g.strip() for g in text.split(",") if g.strip()]
            if not names:
                raise OptionError("option 'groups' names no group")
            result = dict.fromkeys(names, peers)
    else:
        if not peers:
            raise OptionError("option 'peers' is required (e.g. n0-127.0.0.1:20911;n1-127.0.0.1:20912)")
        result = {group or "default": peers}
    for name, text in result.items():
        try:
            parse_peers(text)
        except (ConfigError, ValueError) as exc:
            raise OptionError(f"peers of group {name!r}: {exc}") from None
    return dict(sorted(result.items()))


def parse_position(name: str, text: str | None, groups: dict[str, str], default: str,
                   words: tuple[str, ...]) -> dict[str, str | int]:
    """``startingIndex`` / ``endingIndex``: a word, an index for every group, or JSON {group: word or index}."""
    def one(value, where: str) -> str | int:
        if isinstance(value, bool):
            raise OptionError(f"option {name!r}{where}: expected {' | '.join(words)} or an index, got {value!r}")
        if isinstance(value, int):
            if value < 0:
                raise OptionError(f"option {name!r}{where}: an index is >= 0, got {value}")
            return value
        text = str(value).strip().lower()
        if text in words:
            return text
        try:
            number = int(text)
        except ValueError:
            raise OptionError(f"option {name!r}{where}: expected {' | '.join(words)} or an index, "
                              f"got {value!r}") from None
        return one(number, where)

    if text is None or not str(text).strip():
        return dict.fromkeys(groups, default)
    text = str(text).strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OptionError(f"option {name!r}: invalid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise OptionError(f"option {name!r}: expected a JSON object {{group: index}}")
        unknown = sorted(set(obj) - set(groups))
        if unknown:
            raise OptionError(f"option {name!r}: unknown group(s) {', '.join(unknown)} (groups: {', '.join(groups)})")
        return {g: one(obj[g], f" of group {g!r}") if g in obj else default for g in groups}
    value = one(text, "")
    return dict.fromkeys(groups, value)


def parse_bool(name: str, text: str | None, default: bool) -> bool:
    if text is None:
        return default
    value = str(text).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r}: expected true or false, got {text!r}")


def parse_positive(name: str, text: str | None, kind: type, default):
    if text is None:
        return default
    try:
        value = kind(str(text).strip())
    except ValueError:
        raise OptionError(f"option {name!r}: expected a positive {'integer' if kind is int else 'number'}, "
                          f"got {text!r}") from None
    if not value > 0:
        raise OptionError(f"option {name!r}: must be more than 0, got {text!r}")
    return value


def parse_options(options) -> SourceOptions:
    """All options of a read (``options``: Spark's case-insensitive dict, or any mapping)."""
    check_known(options)
    groups = parse_groups(options)
    read_from = (_get(options, "readFrom") or "leader").strip().lower()
    if read_from not in READ_FROM:
        raise OptionError(f"option 'readFrom': expected {' | '.join(READ_FROM)}, got {read_from!r}")
    fmt = (_get(options, "format") or "raw").strip().lower()
    if fmt not in FORMATS:
        raise OptionError(f"option 'format': expected {' | '.join(FORMATS)}, got {fmt!r}")
    return SourceOptions(
        groups=groups,
        starting=parse_position("startingIndex", _get(options, "startingIndex"), groups, "earliest",
                                ("earliest", "latest")),
        ending=parse_position("endingIndex", _get(options, "endingIndex"), groups, "latest", ("latest",)),
        max_entries_per_trigger=parse_positive("maxEntriesPerTrigger", _get(options, "maxEntriesPerTrigger"),
                                               int, None),
        read_from=read_from,
        format=fmt,
        fail_on_data_loss=parse_bool("failOnDataLoss", _get(options, "failOnDataLoss"), True),
        timeout=parse_positive("timeout", _get(options, "timeout"), float, DEFAULT_TIMEOUT),
        partition_bytes=parse_positive("partitionBytes", _get(options, "partitionBytes"), int,
                                       DEFAULT_PARTITION_BYTES),
        credentials=parse_credentials(options, groups),
    )
