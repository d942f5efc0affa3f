"""Print the stage tracer's files (``python -m tools.stage_trace.summary DIR``), one block per process."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", help="the DLEDGER_STAGE_TRACE directory the processes wrote PID.json into")
    args = parser.parse_args(argv)
    files = sorted(Path(args.directory).glob("*.json"))
    if not files:
        parser.exit(1, f"no trace files in {args.directory}\n")
    for path in files:
        data = json.loads(path.read_text())
        print(f"{path.stem}: {' '.join(data.pop('argv'))}")
        settings = {k: data.pop(k) for k in ("switch_interval_ms", "gc_threshold") if k in data}
        if settings:
            print("  " + ", ".join(f"{k} {v}" for k, v in settings.items()))
        for key, v in sorted(data.items()):
            print(f"  {key:24s} n={v['n']:7d}  p50 {v['p50']:8.3f}  p90 {v['p90']:8.3f}  p99 {v['p99']:8.3f}  "
                  f"max {v['max']:8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
