"""The columns a read returns, as a Spark schema and as the Arrow batches ``read()`` yields.

``raw``: ``group, index, term, pos, body, ingest_time``.  ``rocketmq``: each entry body decoded as the
CommitLog record it is (the broker plugin's codec, imported only for this format), its control entries
(consumer offsets) left out.  ``ingest_time`` is when the entry was read into Spark (UTC).
"""

from __future__ import annotations

from dledger_spark import columns

RAW_DDL = ("`group` STRING, `index` BIGINT, term BIGINT, pos BIGINT, body BINARY, ingest_time TIMESTAMP")
ROCKETMQ_DDL = ("`group` STRING, `index` BIGINT, term BIGINT, pos BIGINT, topic STRING, queue_id INT, "
                "queue_offset BIGINT, physical_offset BIGINT, msg_id STRING, tags STRING, `keys` STRING, "
                "properties MAP<STRING, STRING>, born_timestamp BIGINT, store_timestamp BIGINT, "
                "born_host STRING, body BINARY, ingest_time TIMESTAMP")


def ddl(fmt: str) -> str:
    """The schema of format ``fmt`` as a DDL string (what ``DataSource.schema()`` returns)."""
    return ROCKETMQ_DDL if fmt == "rocketmq" else RAW_DDL


def _pa():
    import pyarrow as pa

    return pa


def arrow_schema(fmt: str):
    pa = _pa()
    head = [("group", pa.string()), ("index", pa.int64()), ("term", pa.int64()), ("pos", pa.int64())]
    tail = [("body", pa.binary()), ("ingest_time", pa.timestamp("us", tz="UTC"))]
    if fmt != "rocketmq":
        return pa.schema(head + tail)
    return pa.schema(head + [
        ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
        ("physical_offset", pa.int64()), ("msg_id", pa.string()), ("tags", pa.string()), ("keys", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())), ("born_timestamp", pa.int64()),
        ("store_timestamp", pa.int64()), ("born_host", pa.string()),
    ] + tail)


_SCHEMAS: dict[str, object] = {}


def _schema(fmt: str):
    """The Arrow schema of ``fmt``, made once per process."""
    schema = _SCHEMAS.get(fmt)
    if schema is None:
        schema = _SCHEMAS[fmt] = arrow_schema(fmt)
    return schema


def arrow_batch(fmt: str, group: str, entries: list, now: float):
    """One ``pyarrow.RecordBatch`` of ``entries`` (``dledger.entry.Entry``) in format ``fmt``."""
    if fmt == "rocketmq":
        return _rocketmq_batch(_pa(), _schema(fmt), group, entries, now)
    return raw_batch(group, columns.from_entries(entries), now)


def raw_batch(group: str, cols, now: float):
    """The ``raw`` format's ``pyarrow.RecordBatch`` of :class:`dledger_spark.columns.Columns` (no copy of
    the index, term and pos arrays, the bodies as they are)."""
    pa = _pa()
    n = len(cols)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(group, pa.string()), n),
        pa.array(cols.index, pa.int64()),
        pa.array(cols.term, pa.int64()),
        pa.array(cols.pos, pa.int64()),
        cols.body,
        pa.repeat(pa.scalar(int(now * 1_000_000), pa.timestamp("us", tz="UTC")), n),
    ], schema=_schema("raw"))


def _rocketmq_batch(pa, schema, group: str, entries: list, now: float):
    try:
        from dledger_rocketmq.common import control, message
    except ImportError:
        raise RuntimeError("dledger source: format=rocketmq needs the dledger-rocketmq plugin "
                           "(pip install dledger-spark[rocketmq])") from None
    cols: dict[str, list] = {name: [] for name in schema.names}
    for e in entries:
        if control.is_control(e.body):
            continue  # consumer-offset commits: never shown to consumers
        try:
            r = message.decode_record(e.body)
            body = message.uncompressed_body(r)
        except ValueError as exc:
            raise RuntimeError(f"dledger source: entry {e.index} of group {group!r} is not a RocketMQ "
                               f"record: {exc}") from None
        props = r.property_map
        for name, value in (("group", group), ("index", e.index), ("term", e.term), ("pos", e.pos),
                            ("topic", r.topic), ("queue_id", r.queue_id), ("queue_offset", r.queue_offset),
                            ("physical_offset", r.physical_offset), ("msg_id", r.message_id),
                            ("tags", props.get(message.PROPERTY_TAGS)), ("keys", props.get(message.PROPERTY_KEYS)),
                            ("properties", list(props.items())), ("born_timestamp", r.born_timestamp),
                            ("store_timestamp", r.store_timestamp), ("born_host", str(r.born_host)),
                            ("body", body), ("ingest_time", int(now * 1_000_000))):
            cols[name].append(value)
    return pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)
