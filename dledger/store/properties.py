"""Java DLedger's small ``key=value`` files (``checkpoint``, ``currterm``).

Java writes them with ``java.util.Properties``-style lines and no comment
header; we write the same bytes (key order matters for byte-identical files)
and read leniently (comments, blank lines, ``:`` separators, spaces around
the separator), because an operator may have edited one by hand.
"""

from __future__ import annotations

from pathlib import Path

from dledger.errors import StoreError


def format_properties(items: list[tuple[str, str]]) -> bytes:
    """``key=value\\n`` lines, in the given order (Java's order for byte-identical files)."""
    return "".join(f"{key}={value}\n" for key, value in items).encode("utf-8")


def parse_properties(data: bytes, path: str | Path) -> dict[str, str]:
    """Parse a properties file; StoreError naming ``path`` and the line if it is not one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not a text file ({exc})") from None
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        seps = [i for i in (line.find("="), line.find(":")) if i >= 0]
        if not seps:
            raise StoreError(f"{path}: line {lineno} {raw!r} is not 'key=value'")
        i = min(seps)
        key, value = line[:i].strip(), line[i + 1:].strip()
        if not key:
            raise StoreError(f"{path}: line {lineno} {raw!r} has an empty key")
        out[key] = value
    return out


def int_property(props: dict[str, str], key: str, path: str | Path, *, minimum: int) -> int:
    """``props[key]`` as an int ``>= minimum``; StoreError saying which file and what is wrong."""
    if key not in props:
        raise StoreError(f"{path}: missing '{key}' (found keys: {', '.join(sorted(props)) or 'none'})")
    value = props[key]
    try:
        number = int(value)
    except ValueError:
        raise StoreError(f"{path}: '{key}' is {value!r}, not an integer") from None
    if number < minimum:
        raise StoreError(f"{path}: '{key}' is {number}, must be >= {minimum}")
    return number
