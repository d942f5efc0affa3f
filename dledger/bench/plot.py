"""``dledger bench cluster --plot FILE``: the run's figures drawn -- throughput over time, latency
percentiles (over time and as a curve), and a failover timeline per trial.

matplotlib is an optional extra (``pip install 'dledger[plot]'``): a member never imports it, and
``--plot`` without it is a one-line error before anything runs.  The output format follows the file's
suffix (``.svg``, ``.png``, ``.pdf``); SVGs keep their text as text and carry no date, so a committed
plot changes only when its figures do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dledger.errors import ConfigError

FORMATS = (".svg", ".png", ".pdf")


def require() -> Any:
    """matplotlib with the Agg backend, or ConfigError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'dledger[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_path(value: str) -> str:
    """The ``--plot`` argument: a file name ending in .svg, .png or .pdf in an existing directory."""
    from argparse import ArgumentTypeError

    p = Path(value)
    if p.suffix.lower() not in FORMATS:
        raise ArgumentTypeError(f"{value}: the plot's format comes from its suffix: {', '.join(FORMATS)}")
    if not p.parent.resolve().is_dir():
        raise ArgumentTypeError(f"{value}: no directory {p.parent}")
    return value


def panels(results: dict) -> list[str]:
    """Which panels the results have data for, in drawing order."""
    out = []
    if any(results.get(k, {}).get("timeline") for k in ("batch", "pipeline")):
        out.append("throughput")
    if results.get("latency", {}).get("timeline"):
        out.append("latency")
    if any(f.get("timelines") for f in results.get("failover", ())):
        out.append("failover")
    return out


def title(results: dict) -> str:
    s = results.get("settings", {})
    return (f"dledger bench cluster: {s.get('members', 3)} members, store {s.get('store')} (flush {s.get('flush')}), "
            f"preset {s.get('preset')}, {s.get('size')}-byte bodies, {s.get('cpus')} CPUs")


def write(results: dict, path: str | Path) -> list[str]:
    """Draw ``results`` (from :func:`dledger.bench.cluster.run`) into ``path``; the panels drawn."""
    plt = require()
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "dledger", "font.size": 9})
    which = panels(results)
    if not which:
        raise ConfigError("--plot: the run has nothing to plot (phases batch, pipeline, latency or failover)")
    fig = plt.figure(figsize=(11, 3.4 * len(which)), layout="constrained")
    rows = fig.subfigures(len(which), 1, squeeze=False)[:, 0]
    fig.suptitle(title(results))
    for sub, name in zip(rows, which):
        {"throughput": _throughput, "latency": _latency, "failover": _failover}[name](sub, results)
    suffix = Path(path).suffix.lower()
    fig.savefig(path, format=suffix[1:], metadata={"Date": None} if suffix == ".svg" else None)
    plt.close(fig)
    return which


def _steps(tl: dict, key: str) -> tuple[list[float], list[float]]:
    """A bucketed series as step points: each bucket's value from its start to its end (None: a gap)."""
    ys = [float("nan") if v is None else v for v in tl[key]]
    if not ys:
        return [], []
    return [0.0, *tl["t"]], [ys[0], *ys]


def _throughput(sub: Any, r: dict) -> None:
    ax = sub.subplots()
    labels = {"batch": "batched appends", "pipeline": "one entry per request"}
    warmup = None
    for key in ("batch", "pipeline"):
        phase = r.get(key)
        if not phase or not phase.get("timeline"):
            continue
        tl = phase["timeline"]
        warmup = tl.get("warmup_s", warmup)
        ax.plot(*_steps(tl, "per_s"), drawstyle="steps-pre",
                label=f"{labels[key]}: {phase['entries_per_s']:,.0f} entries/s measured")
    if warmup:
        ax.axvspan(0, warmup, color="0.9", label="warm-up (not measured)")
    ax.set_title("Throughput over time (acknowledged entries/s, 0.25 s buckets)")
    ax.set_xlabel("seconds since the phase started")
    ax.set_ylabel("entries/s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)


def _latency(sub: Any, r: dict) -> None:
    lat = r["latency"]
    tl = lat["timeline"]
    left, right = sub.subplots(1, 2, width_ratios=(2, 1))
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        left.plot(*_steps(tl, key), drawstyle="steps-pre", label=label)
    if tl.get("warmup_s"):
        left.axvspan(0, tl["warmup_s"], color="0.9", label="warm-up")
    left.set_yscale("log")
    left.set_title(f"Latency over time at {lat['offered_per_s']:,}/s offered (from each request's scheduled time)")
    left.set_xlabel("seconds since the phase started")
    left.set_ylabel("ms")
    left.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    left.grid(alpha=0.3, which="both")
    curve = lat.get("percentiles") or {}
    qs, ms = curve.get("q", []), curve.get("ms", [])
    xs = list(range(len(qs)))
    right.plot(xs, ms, marker="o")
    right.set_xticks(xs, [("max" if q == 100 else f"p{q:g}") for q in qs], rotation=45)
    right.set_yscale("log")
    right.set_title(f"Latency percentiles ({lat.get('samples', 0):,} samples)")
    right.set_ylabel("ms")
    right.grid(alpha=0.3, which="both")
    for x, q, v in zip(xs, qs, ms):
        if q in (50.0, 99.0, 100.0):  # the figures the text quotes; the others crowd the tail
            right.annotate(f"{v:.2f} ms", (x, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)


def _failover(sub: Any, r: dict) -> None:
    ax = sub.subplots()
    y, ticks = 0, []
    for f in r.get("failover", ()):
        for k, trial in enumerate(f.get("timelines", ())):
            xs = trial["acks_s"]
            old = [x for x, by in zip(xs, trial["leaders"]) if by == trial.get("killed")]
            new = [x for x, by in zip(xs, trial["leaders"]) if by != trial.get("killed")]
            ax.plot(old, [y] * len(old), "|", color="tab:blue", markersize=8,
                    label="append acknowledged by the old leader" if y == 0 else None)
            ax.plot(new, [y] * len(new), "|", color="tab:green", markersize=8,
                    label="by the new leader" if y == 0 else None)
            ax.plot([0, trial["recovered_s"]], [y, y], color="tab:red", linewidth=3, alpha=0.5,
                    label="no append acknowledged" if y == 0 else None)
            ax.annotate(f"{trial['recovered_s']:.2f} s", (trial["recovered_s"], y), textcoords="offset points",
                        xytext=(6, 4), fontsize=8)
            ticks.append(f"{f['preset']} #{k + 1}")
            y += 1
    ax.axvline(0, color="tab:red", linestyle="--", linewidth=1, label="kill -9 of the leader")
    ax.set_yticks(range(len(ticks)), ticks)
    ax.set_ylim(-0.7, max(len(ticks), 1) - 0.3)
    ax.invert_yaxis()
    ax.set_title("Failover timeline: appends acknowledged around kill -9 of the leader (preset, trial)")
    ax.set_xlabel("seconds since the kill")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    ax.grid(alpha=0.3, axis="x")
