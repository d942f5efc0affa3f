"""RocketMQ's JSON dialect (fastjson 1.2.69) for its config files and metadata bodies.

Why a module of its own: a RocketMQ broker writes ``config/*.json`` and the
GET_ALL_* bodies with fastjson, which is not strict JSON.  Map keys that are
not strings are written *unquoted* (``{"offsetTable":{0:2,1:-1}}``), so
``json.loads`` rejects them; the pretty form of the config files indents with
tabs and puts a newline before string keys only; and maps come out in the
iteration order of Java's ``ConcurrentHashMap``, which is a function of the
keys' ``hashCode`` and the table size.  With the three rules here a file the
golden 4.9.8 broker wrote loads and re-serialises byte for byte, and a file
we write is the file RocketMQ would write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


# Here, at the bottom layer, because fastjson orders keys as Java's HashMap does and consume queues (tag
# codes) and admin (queue hashes) need the same hash: store/consumequeue.py re-exports it.
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as an int32."""
    h = 0
    data = text.encode("utf-16-be", errors="surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


# -- reading ----------------------------------------------------------------------------------------------

def _quote_bare_keys(text: str) -> str:
    """``text`` with every unquoted integer map key quoted (``{0:2}`` -> ``{"0":2}``); strings untouched."""
    out: list[str] = []
    i, n = 0, len(text)
    expect_key = False  # just after '{' or ',' (whitespace skipped): a key may start here
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            expect_key = False
            continue
        if expect_key and (c == "-" or c.isdigit()):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i = j
                expect_key = False
                continue
        if c in "{,":
            expect_key = True
        elif c not in " \t\r\n":
            expect_key = False
        out.append(c)
        i += 1
    return "".join(out)


def loads(text: str | bytes) -> Any:
    """Parse fastjson output (unquoted integer keys allowed; they come back as strings, like JSON keys).

    Raises ValueError with a one-line reason (line and column) on anything else
    that is not JSON.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(_quote_bare_keys(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


# -- writing ----------------------------------------------------------------------------------------------

def _scalar(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} as fastjson")


def _key(key: Any) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"map key {key!r}: only str and int keys are written")
    return json.dumps(key, ensure_ascii=False) if isinstance(key, str) else str(key)


def dumps(value: Any, *, pretty: bool = False) -> str:
    """fastjson's text for ``value`` (dicts in their given order; int keys unquoted).

    ``pretty`` is fastjson's ``PrettyFormat`` as RocketMQ's ``ConfigManager``
    writes files: tab indents, a newline before each *string* key (bean fields
    and string-keyed maps) but none before integer keys, the closing brace of
    a non-empty object on its own line, ``{}`` for an empty one, no trailing
    newline.
    """
    out: list[str] = []

    def write(v: Any, depth: int) -> None:
        if isinstance(v, dict):
            out.append("{")
            first = True
            for k, item in v.items():
                if not first:
                    out.append(",")
                if pretty and isinstance(k, str):
                    out.append("\n" + "\t" * (depth + 1))
                out.append(_key(k) + ":")
                write(item, depth + 1)
                first = False
            if pretty and v:
                out.append("\n" + "\t" * depth)
            out.append("}")
        elif isinstance(v, (list, tuple)):
            out.append("[")
            for n, item in enumerate(v):
                if n:
                    out.append(",")
                write(item, depth + 1)
            out.append("]")
        else:
            out.append(_scalar(v))

    write(value, 0)
    return "".join(out)


# -- Java map iteration order -----------------------------------------------------------------------------

def java_hash(key: Any) -> int:
    """``hashCode()`` of a Java String (str) or Integer (int), as an int32."""
    if isinstance(key, str):
        return java_string_hash(key)
    if isinstance(key, int):
        h = key & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h
    raise TypeError(f"no Java hashCode for {type(key).__name__}")


def table_size(initial_capacity: int, count: int, *, concurrent: bool = True) -> int:
    """The bucket-table size of a Java map created with ``initial_capacity`` after ``count`` insertions.

    ``ConcurrentHashMap(c)`` starts at ``tableSizeFor(c + c/2 + 1)`` and doubles
    once the size reaches 3/4 of the table; ``HashMap(c)`` starts at
    ``tableSizeFor(c)`` and doubles once the size exceeds 3/4.  (Removals never
    shrink a Java table; a map that once held more keys may be larger.)
    """
    want = initial_capacity + (initial_capacity >> 1) + 1 if concurrent else max(initial_capacity, 1)
    n = 1
    while n < want:
        n <<= 1
    while (count >= n - (n >> 2)) if concurrent else (count > n - (n >> 2)):
        n <<= 1
    return n


def java_map_order(keys: Iterable[Any], initial_capacity: int = 16, *, concurrent: bool = True) -> list[Any]:
    """``keys`` (given in insertion order) in the order a Java (Concurrent)HashMap iterates them.

    Buckets in index order, ``(h ^ h >>> 16) & (n - 1)``; within a bucket,
    insertion order.  This is how the golden 4.9.8 files order their maps
    (``topicConfigTable`` and ``subscriptionGroupTable``: capacity 1024,
    ``offsetTable``: 512), and how a single message's properties are stored.
    """
    keys = list(keys)
    n = table_size(initial_capacity, len(keys), concurrent=concurrent)

    def bucket(k: Any) -> int:
        h = java_hash(k) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (n - 1)

    return sorted(keys, key=bucket)  # sorted() is stable: insertion order within a bucket
