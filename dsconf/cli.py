"""The ``dsconf`` command: show, check and describe DeepSpeed configs composed from dsconf's groups; validate and
import existing DeepSpeed config files."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import List, Optional

from dsconf.errors import ConfigError

EXIT_CONFIG_ERROR = 2
EXIT_INVALID_FILE = 1  # validate/import: the file was read and has problems
EXIT_UNREADABLE = 2  # validate/import: missing or malformed file


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
        cmd.add_argument("--keep-auto", action="store_true", default=None,
                         help="keep HF's 'auto' values (the config goes to HF Trainer/Accelerate)")
    validate = sub.add_parser("validate", help="check existing DeepSpeed config files (JSON, hjson, YAML)")
    validate.add_argument("files", nargs="+", help="DeepSpeed config files")
    importer = sub.add_parser("import", help="turn a DeepSpeed config file into a Hydra primary config using dsconf")
    importer.add_argument("file", help="a DeepSpeed config file (JSON, hjson, YAML)")
    importer.add_argument("-o", "--output", required=True, help="YAML file to write (a primary config)")
    for cmd in (validate, importer):
        cmd.add_argument("--world-size", type=int, default=None,
                         help="total ranks (default: what the file's batch triple implies, else 1)")
        cmd.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
        cmd.add_argument("--keep-auto", action="store_true", default=None,
                         help="allow HF's 'auto' values (default: yes when the file has any, for import)")
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
    if args.command == "validate":
        return _validate(args)
    if args.command == "import":
        return _import(args)
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
        config_dir = os.path.abspath(args.config_dir) if args.config_dir else None
        overrides = [*args.overrides, *(["keep_auto=true"] if args.keep_auto else [])]
        ds = compose(overrides, world_size=args.world_size, deepspeed_version=args.deepspeed_version,
                     config_dir=config_dir, config_name=args.config_name)
    for warning in caught:
        print(f"dsconf: warning: {warning.message}", file=sys.stderr)
    if args.command == "show":
        print(json.dumps(ds, indent=2))
    else:
        print(f"OK: train_batch_size={ds['train_batch_size']} micro={ds['train_micro_batch_size_per_gpu']} "
              f"gas={ds['gradient_accumulation_steps']}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    """Exit 0 when every file is valid, 1 when one has problems, 2 when one cannot be read."""
    from dsconf.validate_files import check_file, render

    code = 0
    for path in args.files:
        report = check_file(path, world_size=args.world_size, target=args.deepspeed_version,
                            keep_auto=bool(args.keep_auto))
        stream = sys.stdout if report.ok else sys.stderr
        for line in render(report):
            print(line, file=stream)
        code = max(code, EXIT_UNREADABLE if report.unreadable else 0 if report.ok else EXIT_INVALID_FILE)
    return code


def _import(args: argparse.Namespace) -> int:
    from dsconf.importer import import_file
    from dsconf.validate_files import render

    report, written = import_file(args.file, args.output, world_size=args.world_size,
                                  target=args.deepspeed_version, keep_auto=args.keep_auto)
    if written is None:
        for line in render(report):
            print(line, file=sys.stderr)
        return EXIT_UNREADABLE if report.unreadable else EXIT_INVALID_FILE
    for line in render(report):
        print(line, file=sys.stderr if report.warnings and "warning" in line else sys.stdout)
    print(f"wrote {written}: try `dsconf show --config-dir {os.path.dirname(written) or '.'} "
          f"--config-name {os.path.splitext(os.path.basename(written))[0]} --world-size {report.world_size}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
