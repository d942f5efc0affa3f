"""A broker's metadata files: topics, consumer offsets, delay offsets, subscription groups.

``BrokerMetadata(store_dir)`` keeps RocketMQ's four ``config/*.json`` files
in the shapes (and byte formatting) a 4.9.8 broker writes them, so a store can
move between this plugin and a Java broker and RocketMQ's tools read it:

- ``topics.json``: ``{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig}}``
- ``consumerOffset.json``: ``{"offsetTable": {"topic@group": {queueId: offset}}}``
- ``delayOffset.json``: ``{"offsetTable": {level: offset}}``
- ``subscriptionGroup.json``: ``{"dataVersion": {...}, "subscriptionGroupTable": {group: SubscriptionGroupConfig}}``

Loading follows RocketMQ's ``ConfigManager.load``: a missing file means
defaults, a damaged file falls back to ``<file>.bak`` (the previous content,
kept by every write).  Unlike RocketMQ, a damaged file with no usable
``.bak`` is an error naming the file instead of a silent start with empty
tables (which loses every consumer offset).  Writes are atomic
(``dledger.diskio.write_atomic``: temp file, fsync, rename, ``.bak`` of the
old content) and run through a ``BlockingIO``, so on a running member the
fsyncs happen off the reactor thread; only files that changed are written.
``consumerOffset.json.dledger`` (ours) records the last log index the
written tables include: where the metadata state machine
(:mod:`dledger_rocketmq.store.machine`) starts when the member has no snapshot;
with one, the snapshot is the source of truth and the files are its copy in
RocketMQ's shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application import service
from twisted.internet import defer, task
from twisted.logger import Logger

from dledger import diskio
from dledger.errors import StoreError
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.store.consumequeue import SCHEDULE_TOPIC
from dledger_rocketmq.store.offsets import ConsumerOffsetTable, DelayOffsetTable

log = Logger(namespace="dledger_rocketmq.store.metadata")

TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
DELAY_OFFSET_FILE = "delayOffset.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
APPLIED_INDEX_FILE = "consumerOffset.json.dledger"
#: The ACL the log last carried (control kind 7); mode 0600: it holds the accounts' secret keys.
ACL_FILE = "aclConfig.json"

# PermName
PERM_INHERIT, PERM_WRITE, PERM_READ = 1, 2, 4
DEFAULT_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC_QUEUE_NUMS = 18
#: TopicConfigManager's and SubscriptionGroupManager's ``new ConcurrentHashMap<>(1024)``.
TABLE_CAPACITY = 1024

#: The groups SubscriptionGroupManager creates on start.
SYSTEM_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                 "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER")


class MetadataError(StoreError, ValueError):
    """A metadata file (and its .bak) cannot be used; the message names the file and why, on one line.

    A :class:`dledger.errors.StoreError`, so a member whose broker cannot
    load its metadata fails to start with this one line (no traceback).
    """


def topic_config(name: str, read_queues: int = 16, write_queues: int = 16, perm: int = PERM_READ | PERM_WRITE,
                 *, order: bool = False, filter_type: str = "SINGLE_TAG", sys_flag: int = 0) -> dict[str, Any]:
    """A TopicConfig as RocketMQ serialises it (field names are the JSON bean fields)."""
    return {"order": order, "perm": perm, "readQueueNums": read_queues, "topicFilterType": filter_type,
            "topicName": name, "topicSysFlag": sys_flag, "writeQueueNums": write_queues}


def subscription_group_config(name: str, **fields: Any) -> dict[str, Any]:
    """A SubscriptionGroupConfig with RocketMQ's defaults, overridden by ``fields`` (JSON names)."""
    config = {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True, "consumeFromMinEnable": True,
              "groupName": name, "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 16,
              "retryQueueNums": 1, "whichBrokerWhenConsumeSlowly": 1}
    config.update(fields)
    return config


def default_topics(cluster_name: str, broker_name: str, *, auto_create_topic: bool = True,
                   default_topic_queue_nums: int = 8) -> dict[str, dict[str, Any]]:
    """The system topics a 4.9.8 TopicConfigManager creates before it loads topics.json."""
    rw = PERM_READ | PERM_WRITE
    configs = [topic_config(SELF_TEST_TOPIC, 1, 1)]
    if auto_create_topic:
        configs.append(topic_config(DEFAULT_TOPIC, default_topic_queue_nums, default_topic_queue_nums,
                                    rw | PERM_INHERIT))
    configs += [
        topic_config(BENCHMARK_TOPIC, 1024, 1024),
        topic_config(cluster_name, 16, 16, rw | PERM_INHERIT),
        topic_config(broker_name, 1, 1, rw | PERM_INHERIT),
        topic_config(OFFSET_MOVED_EVENT, 1, 1),
        topic_config(SCHEDULE_TOPIC, SCHEDULE_TOPIC_QUEUE_NUMS, SCHEDULE_TOPIC_QUEUE_NUMS),
        topic_config(f"{cluster_name}_REPLY_TOPIC", 1, 1),
    ]
    return {c["topicName"]: c for c in configs}


class VersionedTable:
    """A name -> bean-dict table with RocketMQ's DataVersion (topics.json, subscriptionGroup.json).

    ``table_key`` is the JSON field holding the table, ``name_key`` the bean
    field holding each entry's name.  ``version`` counts local changes (for
    persisting); ``data_version`` is RocketMQ's ``{"counter", "timestamp"}``
    that slaves compare to decide whether to copy.
    """

    def __init__(self, table_key: str, name_key: str, defaults: dict[str, dict[str, Any]] | None = None,
                 clock: Any = None) -> None:
        self.table_key = table_key
        self.name_key = name_key
        self.clock = clock
        self.table: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (defaults or {}).items()}
        self.data_version = {"counter": 0, "timestamp": self._now_ms()}
        self.version = 0
        #: Called (no arguments) after every change of the entries (put, remove, replace): the broker's
        #: name-server registration re-registers at once when the topic table changes.
        self.listeners: list[Callable[[], object]] = []

    def _notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:
                log.failure("{table}: change listener {l!r} failed", table=self.table_key, l=listener)

    def _now_ms(self) -> int:
        return int(self.clock.seconds() * 1000) if self.clock is not None else 0

    def get(self, name: str) -> dict[str, Any] | None:
        found = self.table.get(name)
        return dict(found) if found is not None else None

    def put(self, config: dict[str, Any], *, timestamp: int | None = None) -> None:
        """Add or replace one entry and move the DataVersion (RocketMQ's ``nextVersion``).

        ``timestamp``: the DataVersion timestamp to use instead of this
        member's clock (a change carried by the log: every member stamps the
        master's time, so their DataVersions agree).
        """
        name = config.get(self.name_key)
        if not isinstance(name, str) or not name:
            raise MetadataError(f"{self.table_key}: entry without a {self.name_key}")
        self.table[name] = dict(config)
        self._changed(timestamp)

    def remove(self, name: str, *, timestamp: int | None = None) -> bool:
        if self.table.pop(name, None) is None:
            return False
        self._changed(timestamp)
        return True

    def _changed(self, timestamp: int | None = None) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1,
                             "timestamp": self._now_ms() if timestamp is None else timestamp}
        self.version += 1
        self._notify()

    def replace(self, other: VersionedTable) -> bool:
        """Take ``other`` wholesale if its DataVersion differs (a slave copying its master); True if it did."""
        if other.data_version == self.data_version:
            return False
        self.table = {k: dict(v) for k, v in other.table.items()}
        self.data_version = dict(other.data_version)
        self.version += 1
        self._notify()
        return True

    def to_dict(self) -> dict[str, Any]:
        table = {name: dict(sorted(self.table[name].items()))
                 for name in fastjson.java_map_order(self.table, TABLE_CAPACITY)}
        return {"dataVersion": dict(sorted(self.data_version.items())), self.table_key: table}

    def to_json(self, *, pretty: bool = True) -> str:
        return fastjson.dumps(self.to_dict(), pretty=pretty)

    def load_dict(self, data: Any, *, merge_defaults: dict[str, dict[str, Any]] | None = None) -> None:
        """Fill from a parsed file/body: entries over the defaults, DataVersion from the data."""
        if not isinstance(data, dict) or not isinstance(data.get(self.table_key, {}), dict):
            raise ValueError(f'expected {{"{self.table_key}": {{name: config}}}}')
        table = {k: dict(v) for k, v in (merge_defaults or {}).items()}
        for name, config in data.get(self.table_key, {}).items():
            if not isinstance(config, dict):
                raise ValueError(f"{self.table_key} entry {name!r} is not an object")
            if config.get(self.name_key, name) != name:
                raise ValueError(f"{self.table_key} entry {name!r} names itself {config.get(self.name_key)!r}")
            table[name] = (table.get(name, {}) | config)
        version = data.get("dataVersion", {"counter": 0, "timestamp": 0})
        if (not isinstance(version, dict) or not all(isinstance(version.get(k), int) and
                                                     not isinstance(version.get(k), bool)
                                                     for k in ("counter", "timestamp"))):
            raise ValueError("dataVersion is not {counter, timestamp}")
        self.table = table
        self.data_version = dict(version)
        self.version += 1


def topic_table(data: Any = None, *, clock: Any = None) -> VersionedTable:
    """A topicConfigTable (from a parsed topics.json / GET_ALL_TOPIC_CONFIG body when ``data`` is given)."""
    table = VersionedTable("topicConfigTable", "topicName", clock=clock)
    if data is not None:
        table.load_dict(data)
    return table


def subscription_group_table(data: Any = None, *, clock: Any = None) -> VersionedTable:
    """A subscriptionGroupTable (from a parsed subscriptionGroup.json / GET_ALL_SUBSCRIPTIONGROUP_CONFIG body)."""
    table = VersionedTable("subscriptionGroupTable", "groupName", clock=clock)
    if data is not None:
        table.load_dict(data)
    return table


class AclTable:
    """The ACL in effect on the group: the last ACL control entry (kind 7) applied, and where it came from.

    ``source`` is what the master that appended it said: ``file:<sha256>`` of
    the plain_acl.yml it read, or ``admin`` for a change made over the broker
    port; ``file_source`` is the last file put in effect (kept through admin
    changes), so a master whose file the group already applied does not append
    it again and undo the admin changes made since.
    """

    def __init__(self) -> None:
        self.config: Any = None  # dledger_rocketmq.common.acl.AclConfig, None until the log carried one
        self.source = ""
        self.file_source = ""
        self.timestamp = 0
        self.version = 0

    def apply(self, obj: dict, timestamp: int) -> bool:
        """Take the ACL of a committed kind-7 entry; False (nothing changed) if it is the one in effect."""
        from dledger_rocketmq.common.acl import parse_acl

        config = parse_acl(obj.get("acl"), "ACL control entry")
        source, file_source = str(obj.get("source", "")), str(obj.get("file", ""))
        if (self.config is not None and config.digest() == self.config.digest() and source == self.source
                and file_source == self.file_source):
            return False
        self.config, self.source, self.file_source, self.timestamp = config, source, file_source, timestamp
        self.version += 1
        return True

    def replace_with(self, other: AclTable) -> None:
        """Take ``other``'s ACL in place (a snapshot restored; the port and name server hold this object)."""
        self.config, self.source, self.file_source, self.timestamp = (other.config, other.source,
                                                                      other.file_source, other.timestamp)
        self.version += 1

    def to_json(self) -> str:
        return json.dumps({"acl": self.config.to_dict() if self.config is not None else None,
                           "source": self.source, "file": self.file_source, "timestamp": self.timestamp},
                          indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: bytes | str) -> AclTable:
        from dledger_rocketmq.common.acl import AclConfigError, parse_acl

        obj = json.loads(text)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        table = cls()
        try:
            table.config = parse_acl(obj["acl"], ACL_FILE) if obj.get("acl") is not None else None
        except AclConfigError as exc:
            raise ValueError(str(exc)) from None
        table.source, table.timestamp = str(obj.get("source", "")), int(obj.get("timestamp", 0))
        table.file_source = str(obj.get("file", ""))
        return table


class BrokerMetadata(service.Service):
    """The four metadata tables of one member, loaded from and persisted to ``<store_dir>/config``.

    As a Twisted service it persists changed tables every ``persist_interval``
    seconds on ``clock`` and once more when stopped (RocketMQ flushes consumer
    offsets every 5 s and on shutdown).  ``io`` is where the blocking writes
    run (``BlockingIO(reactor, threaded=True)`` on a member; INLINE in tests).
    """

    def __init__(self, store_dir: str | Path, *, cluster_name: str = "DefaultCluster",
                 broker_name: str = "broker-a", auto_create_topic: bool = True, default_topic_queue_nums: int = 8,
                 clock: Any = None, io: diskio.BlockingIO = diskio.INLINE, persist_interval: float = 5.0) -> None:
        self.config_dir = Path(store_dir) / "config"
        self.clock = clock
        self.io = io
        self.persist_interval = persist_interval
        self._default_topics = default_topics(cluster_name, broker_name, auto_create_topic=auto_create_topic,
                                              default_topic_queue_nums=default_topic_queue_nums)
        self._default_groups = {g: subscription_group_config(g) for g in SYSTEM_GROUPS}
        self.topics = VersionedTable("topicConfigTable", "topicName", self._default_topics, clock)
        self.groups = VersionedTable("subscriptionGroupTable", "groupName", self._default_groups, clock)
        self.offsets = ConsumerOffsetTable()
        self.delay_offsets = DelayOffsetTable()
        self.acl = AclTable()
        self._written: dict[str, Any] = {}
        self._lock = defer.DeferredLock()
        self._loop: task.LoopingCall | None = None
        #: Called (no arguments) right before each snapshot is taken, e.g. by the broker to record how far
        #: the log has been applied (``offsets.applied_index``), so a restart replays less.
        self.before_snapshot: Any = None

    # -- loading ----------------------------------------------------------

    def path(self, name: str) -> Path:
        return self.config_dir / name

    def _read(self, name: str, parse: Any) -> Any:
        """``parse(text)`` of the file, else of its .bak; None if neither exists; MetadataError if unusable."""
        path = self.path(name)
        bak = path.with_name(path.name + ".bak")
        problems = []
        for candidate in (path, bak):
            try:
                text = candidate.read_bytes()
            except FileNotFoundError:
                problems.append(f"{candidate}: missing")
                continue
            except OSError as exc:
                problems.append(f"{candidate}: {exc.strerror}")
                continue
            try:
                if not text.strip():
                    raise ValueError("empty")
                value = parse(text)
            except ValueError as exc:
                problems.append(f"{candidate}: damaged ({exc})")
                continue
            if candidate is bak:
                log.warn("{problem}; loaded {bak} (the previous version) instead", problem=problems[0], bak=bak)
            else:
                self._clean.add(name)
            return value
        if all(p.endswith(": missing") for p in problems):
            return None
        raise MetadataError("; ".join(problems))

    def load(self) -> None:
        """Load every file (missing: defaults; damaged: .bak; both unusable: MetadataError naming the file).

        Tables that did not come from their own intact file are written at the next persist.
        """
        self._clean: set[str] = set()
        topics = self._read(TOPICS_FILE, fastjson.loads)
        if topics is not None:
            self._checked(TOPICS_FILE, lambda: self.topics.load_dict(topics, merge_defaults=self._default_topics))
        groups = self._read(SUBSCRIPTION_GROUP_FILE, fastjson.loads)
        if groups is not None:
            self._checked(SUBSCRIPTION_GROUP_FILE,
                          lambda: self.groups.load_dict(groups, merge_defaults=self._default_groups))
        offsets = self._read(CONSUMER_OFFSET_FILE, ConsumerOffsetTable.from_json)
        if offsets is not None:
            self.offsets = offsets
        applied = self._read(APPLIED_INDEX_FILE, fastjson.loads)
        if applied is not None:
            index = applied.get("appliedIndex") if isinstance(applied, dict) else None
            if not isinstance(index, int) or isinstance(index, bool):
                raise MetadataError(f"{self.path(APPLIED_INDEX_FILE)}: damaged (no integer appliedIndex)")
            self.offsets.applied_index = index
        delay = self._read(DELAY_OFFSET_FILE, DelayOffsetTable.from_json)
        if delay is not None:
            self.delay_offsets = delay
        acl = self._read(ACL_FILE, AclTable.from_json)
        if acl is not None:
            self.acl = acl
        versions = self._versions()
        self._written = {name: versions[name] for name in self._clean if name in versions}

    def _checked(self, name: str, fn: Any) -> None:
        try:
            fn()
        except ValueError as exc:
            raise MetadataError(f"{self.path(name)}: damaged ({exc})") from None

    # -- changes carried by the log ------------------------------------------

    def apply_change(self, entry: Any) -> int:
        """Apply a committed metadata control entry (:mod:`~dledger_rocketmq.common.control` kinds 3-6) to the tables.

        Every member calls this in log order, so the topic and subscription
        group tables are the same everywhere (DataVersion included: it is
        stamped with the entry's timestamp).  Returns how many entries changed;
        a put equal to what is there already changes nothing.
        """
        from dledger_rocketmq.common import control

        if entry.kind == control.KIND_ACL_CONFIG:
            return sum(self.acl.apply(config, entry.timestamp) for config in entry.configs)
        table = self.topics if entry.kind in (control.KIND_TOPIC_CONFIG, control.KIND_TOPIC_DELETE) else self.groups
        changed = 0
        for config in entry.configs:
            name = config[table.name_key]
            if entry.kind in (control.KIND_TOPIC_CONFIG, control.KIND_GROUP_CONFIG):
                if table.table.get(name) != config:
                    table.put(config, timestamp=entry.timestamp)
                    changed += 1
            elif table.remove(name, timestamp=entry.timestamp):
                changed += 1
        return changed

    # -- persisting -------------------------------------------------------

    def _versions(self) -> dict[str, Any]:
        return {TOPICS_FILE: (id(self.topics), self.topics.version),
                SUBSCRIPTION_GROUP_FILE: (id(self.groups), self.groups.version),
                CONSUMER_OFFSET_FILE: (id(self.offsets), self.offsets.version, self.offsets.applied_index),
                DELAY_OFFSET_FILE: (id(self.delay_offsets), self.delay_offsets.version),
                ACL_FILE: (id(self.acl), self.acl.version)}

    def snapshot(self, *, force: bool = False) -> list[tuple[str, bytes]]:
        """``(file name, bytes)`` of every table that changed since it was last written (all with ``force``)."""
        versions = self._versions()
        out = []
        tables = [(TOPICS_FILE, self.topics.to_json), (SUBSCRIPTION_GROUP_FILE, self.groups.to_json)]
        if self.acl.config is not None:  # before the applied index: a change is on disk before it counts as applied
            tables.append((ACL_FILE, self.acl.to_json))
        for name, text in (*tables, (CONSUMER_OFFSET_FILE, self.offsets.to_json),
                           (DELAY_OFFSET_FILE, self.delay_offsets.to_json)):
            if force or self._written.get(name) != versions[name]:
                out.append((name, text().encode()))
                if name == CONSUMER_OFFSET_FILE:  # after the offsets: an older index only means a replay
                    index = fastjson.dumps({"appliedIndex": self.offsets.applied_index}, pretty=True)
                    out.append((APPLIED_INDEX_FILE, index.encode()))
        return out

    def _write(self, files: list[tuple[str, bytes]]) -> None:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files:
            diskio.write_atomic(self.path(name), data, backup=True, mode=0o600 if name == ACL_FILE else 0o644)

    def persist(self, *, force: bool = False) -> defer.Deferred:
        """Write the changed tables atomically (one write at a time); fires with the file names written."""
        def run() -> defer.Deferred:
            if self.before_snapshot is not None:
                self.before_snapshot()
            versions = self._versions()
            files = self.snapshot(force=force)
            if not files:
                return defer.succeed([])
            d = self.io.run(self._write, files)

            def done(_: Any) -> list[str]:
                self._written.update(versions)
                return [name for name, _ in files]
            return d.addCallback(done)
        return self._lock.run(run)

    def _tick(self) -> defer.Deferred:
        def failed(f: Any) -> None:
            log.error("persisting broker metadata to {dir} failed: {err}", dir=self.config_dir,
                      err=f.getErrorMessage())
        return self.persist().addErrback(failed)

    def startService(self) -> None:
        super().startService()
        if self.persist_interval > 0:
            self._loop = task.LoopingCall(self._tick)
            if self.clock is not None:
                self._loop.clock = self.clock
            self._loop.start(self.persist_interval, now=False)

    def stopService(self) -> defer.Deferred:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        return self.persist()
