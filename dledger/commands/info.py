"""``dledger plugins`` and ``dledger config``: what is installed and what a config file means."""

from __future__ import annotations

import json

from dledger import plugins
from dledger.config import make_config


def register(subparsers) -> None:
    p = subparsers.add_parser("plugins", help="list registered plugins, stores and transports",
                              description="List every registered plugin, where it came from, and the "
                                          "store and transport names they provide.")
    p.set_defaults(func=cmd_plugins)

    p = subparsers.add_parser("config", help="validate a config file and print the effective options",
                              description="Load a TOML config (plus a preset), validate it and print every "
                                          "effective option as JSON, plugin options (extras) with their "
                                          "defaults. Exit status 2 on any error.")
    p.add_argument("file", nargs="?", help="TOML config file (default: built-in defaults)")
    p.add_argument("--preset", default="default", help="timer preset: default or fast")
    p.set_defaults(func=cmd_config)


def cmd_plugins(args) -> int:
    for info in plugins.describe_plugins():
        print(f"{info.name:12} {info.module:40} {info.source}")
    for broken in plugins.broken_plugins():
        print(f"{broken.name:12} {'BROKEN (left out)':40} entry point {plugins.GROUP!r} of {broken.distribution}: "
              f"{broken.error}")
    print("stores:     " + ", ".join(sorted(plugins.store_types())))
    print("transports: " + (", ".join(sorted(plugins.transport_types())) or "(none)"))
    return 0


def cmd_config(args) -> int:
    config = make_config(preset=args.preset, file=args.file)
    resolved = plugins.resolve_extras(dict(config.extras))  # every plugin option, defaults filled in
    out = config.to_dict()
    out["extras"] = dict(resolved)
    print(json.dumps(out, indent=2, sort_keys=True, default=repr))
    return 0
