"""The ``dsconf`` command: show, check and explain DeepSpeed configs composed from dsconf's groups."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import List, Optional

from dsconf.errors import ConfigError

EXIT_CONFIG_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsconf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("show", "print the DeepSpeed JSON for a composition"),
                            ("check", "validate a composition and report every problem")):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. zero=stage2 precision=bf16")
        cmd.add_argument("--world-size", type=int, default=None, help="total ranks (default: from dist)")
        cmd.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
        cmd.add_argument("--config-dir", default=None, help="directory of a primary config that uses dsconf")
        cmd.add_argument("--config-name", default="dsconf", help="primary config name (default: dsconf)")
    describe = sub.add_parser("describe", help="list the keys under a path with type, default and description")
    describe.add_argument("path", nargs="?", default="deepspeed", help="dotted path, e.g. deepspeed.fp16")
    describe.add_argument("overrides", nargs="*", help="group choices that decide params, e.g. optimizer=lamb")
    sub.add_parser("groups", help="list config groups and their options")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR


def _run(args: argparse.Namespace) -> int:
    if args.command == "groups":
        from dsconf.groups import group_options

        for group, options in group_options().items():
            print(f"{group}: {', '.join(options)}")
        return 0
    if args.command == "describe":
        from dsconf.composition import chosen_types
        from dsconf.schema.introspect import describe

        rows = describe(args.path, types=chosen_types(args.overrides))
        if not rows:
            raise ConfigError(f"{args.path}: no such section in dsconf's schema")
        width = max(len(k) for k in rows)
        for key, text in rows.items():
            print(f"{args.path}.{key:<{width}}  {text}")
        return 0

    from dsconf.composition import compose

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = compose(args.overrides, world_size=args.world_size, deepspeed_version=args.deepspeed_version,
                     config_dir=args.config_dir, config_name=args.config_name)
    for warning in caught:
        print(f"dsconf: warning: {warning.message}", file=sys.stderr)
    if args.command == "show":
        print(json.dumps(ds, indent=2))
    else:
        print(f"OK: train_batch_size={ds['train_batch_size']} micro={ds['train_micro_batch_size_per_gpu']} "
              f"gas={ds['gradient_accumulation_steps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
