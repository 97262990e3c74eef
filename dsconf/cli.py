"""The ``dsconf`` command: show and check DeepSpeed configs composed from dsconf's groups; explain a key; diff two
configs; validate and import existing DeepSpeed config files; estimate model-state memory under each ZeRO option
(DeepSpeed's estimators); report a sweep's metrics as HTML; write a JSON Schema of DeepSpeed's config for editors."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any, List, Optional, Sequence

from dsconf.errors import EXIT_CONFIG_ERROR, ConfigError, exit_with
from dsconf.schema.root import DEEPSPEED_NODE

EXIT_INVALID_FILE = 1  # validate/import: the file was read and has problems
EXIT_UNREADABLE = 2  # validate/import: missing or malformed file
EXIT_NOT_A_SWEEP = 2  # report: the dir is missing, holds no sweep, or its report cannot be written
EXIT_MISSING_EXTRA = 3  # report: matplotlib (the dsconf[report] extra) is not installed
NO_BATCH_NOTE = (f"no batch size yet, which DeepSpeed needs: set {DEEPSPEED_NODE}.train_micro_batch_size_per_gpu="
                 f"<per-GPU batch> (or {DEEPSPEED_NODE}.train_batch_size=<global batch>); until then `dsconf check` "
                 "and a run refuse this config")


# Each subcommand's examples, shown by its --help; each runs as written from a checkout's root (tests/test_readme.py
# runs them). A trailing "# exit N" states a status other than 0.
EXAMPLES = {
    "show": ["dsconf show zero=stage2 precision=bf16",
             "dsconf show zero=stage3 deepspeed.train_micro_batch_size_per_gpu=4 --world-size 8",
             "dsconf show --config-dir conf --config-name config +experiment=zero2_bf16_warmup --world-size 2",
             "dsconf show --explain-launch dist.nproc_per_node=2"],
    "check": ["dsconf check zero=stage2 precision=bf16 deepspeed.train_batch_size=64 --world-size 8",
              "dsconf check --config-dir conf --config-name config --world-size 4"],
    "validate": ["dsconf validate examples/ds_configs/hf_zero3.json",
                 "dsconf validate examples/ds_configs/silent_mistakes.json   # exit 1: its two problems"],
    "import": ["dsconf import examples/ds_configs/hf_zero3.json -o hf_zero3.yaml"],
    "explain": ["dsconf explain deepspeed.zero_optimization.stage",
                "dsconf explain deepspeed.optimizer.params optimizer=lamb",
                "dsconf explain"],
    "describe": ["dsconf describe deepspeed.fp16"],
    "diff": ['dsconf diff "" "zero=stage2 precision=bf16"   # exit 1: they differ',
             'dsconf diff --config-dir conf --config-name config "" "zero=stage3"   # exit 1: they differ'],
    "groups": ["dsconf groups"],
    "estimate": ["dsconf estimate --params 7b --gpus-per-node 8 --gpu-memory 80",
                 "dsconf estimate --params 350m zero=stage3 --json"],
    "schema": ["dsconf schema -o ds_config.schema.json"],
    "report": ["dsconf report multirun/first   # the sweep of the README's quickstart"],
}


class _Parser(argparse.ArgumentParser):
    """argparse, with each subcommand's examples in its --help."""

    def __init__(self, *args: Any, examples: Sequence[str] = (), **kwargs: Any) -> None:
        if examples:
            kwargs["epilog"] = "examples:\n" + "\n".join(f"  {line}" for line in examples)
            kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter
        super().__init__(*args, **kwargs)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dsconf", description=__doc__,
                     examples=[lines[0] for lines in EXAMPLES.values()][:6] + ["dsconf COMMAND --help: more"])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, examples=EXAMPLES[name])

    for name, help_text in (("show", "print the DeepSpeed JSON for a composition (without a batch size: what it "
                                     "can, and a note on what DeepSpeed still needs)"),
                            ("check", "validate a composition and report every problem")):
        cmd = add(name, help_text)
        cmd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. zero=stage2 precision=bf16")
        cmd.add_argument("--world-size", type=int, default=None, help="total ranks (default: from dist)")
        cmd.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
        _config_options(cmd)
        cmd.add_argument("--keep-auto", action="store_true", default=None,
                         help="keep HF's 'auto' values (the config goes to HF Trainer/Accelerate)")
        if name == "show":
            cmd.add_argument("--explain-launch", action="store_true",
                             help="instead of the JSON: what the launcher would do here and why (the environment "
                                  "detected, the variables it read, nodes, ranks per node, master, rendezvous)")
    validate = add("validate", "check existing DeepSpeed config files (JSON, hjson, YAML)")
    validate.add_argument("files", nargs="+", help="DeepSpeed config files")
    importer = add("import", "turn a DeepSpeed config file into a Hydra primary config using dsconf")
    importer.add_argument("file", help="a DeepSpeed config file (JSON, hjson, YAML)")
    importer.add_argument("-o", "--output", required=True, help="YAML file to write (a primary config)")
    importer.add_argument("--force", action="store_true", help="replace the output file if it exists")
    for cmd in (validate, importer):
        cmd.add_argument("--world-size", type=int, default=None,
                         help="total ranks (default: what the file's batch triple implies, else 1)")
        cmd.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
        cmd.add_argument("--keep-auto", action=argparse.BooleanOptionalAction, default=None,
                         help="leave HF's 'auto' values for HF Trainer/Accelerate to fill (default: yes when the "
                              "file has any: it is an HF template); --no-keep-auto: each 'auto' is an error")
    explain = add("explain", "what a key means: description, type, default, allowed values, DeepSpeed versions, "
                  "aliases, the group options that set it and the rules on it")
    explain.add_argument("key", nargs="?", default="",
                         help="dotted path, e.g. deepspeed.fp16 or zero_optimization.stage (none: the section tree)")
    explain.add_argument("overrides", nargs="*", help="group choices that decide params, e.g. optimizer=lamb")
    explain.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
    describe = add("describe", "the key listing of `dsconf explain PATH` (kept for scripts)")
    describe.add_argument("key", nargs="?", default=DEEPSPEED_NODE, metavar="path",
                          help="dotted path, e.g. deepspeed.fp16")
    describe.add_argument("overrides", nargs="*", help="group choices that decide params, e.g. optimizer=lamb")
    diff = add("diff", "the DeepSpeed keys that differ between two configs, defaults applied")
    for side in ("a", "b"):
        diff.add_argument(side, help="a DeepSpeed config file, a run's output dir (its ds_config.json), or "
                                     "overrides as one argument ('zero=stage2 precision=bf16'; '' = the primary "
                                     "config's defaults)")
    diff.add_argument("--world-size", type=int, default=None,
                      help="total ranks (default: what a file's batch triple implies, else dsconf's default)")
    diff.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
    _config_options(diff, what="override sides are composed from")
    add("groups", "list config groups and their options")
    estimate = add("estimate", "model-state memory per GPU and per node under each ZeRO option, from DeepSpeed's "
                   "estimators")
    estimate.add_argument("overrides", nargs="*", help="Hydra overrides: mark the row of the composed config")
    estimate.add_argument("--params", required=True, help="total parameters, e.g. 7b, 350m, 1.3e9, 1_000_000")
    estimate.add_argument("--largest-layer-params", default=None,
                          help="parameters of the largest layer, for ZeRO-3 (default: --params / 10)")
    estimate.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node (default: 1)")
    estimate.add_argument("--nodes", type=int, default=1, help="nodes (default: 1)")
    estimate.add_argument("--gpu-memory", type=float, default=None, metavar="GiB",
                          help="memory of one GPU: say which rows fit")
    estimate.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    schema = add("schema", "write a JSON Schema of DeepSpeed's config file for editors (completion and errors as "
                 "you type; cross-field rules stay with `dsconf validate`)")
    schema.add_argument("--deepspeed-version", default=None, help="target DeepSpeed version (default: installed)")
    schema.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")
    report = add("report", "write SWEEP_DIR/report.html: the summary table, each metric that varies against the "
                 "swept parameters, the jobs' loss curves; of a tuning study (trials.json): throughput vs memory and "
                 "step time per stage (needs the dsconf[report] extra)")
    report.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a sweep's dir (hydra.sweep.dir)")
    return parser


def _config_options(cmd: argparse.ArgumentParser, what: str = "") -> None:
    cmd.add_argument("--config-dir", default=None,
                     help=f"directory of a primary config that uses dsconf{f' ({what})' if what else ''}")
    cmd.add_argument("--config-name", default="dsconf", help="primary config name (default: dsconf)")


def _check_config_dir(args: argparse.Namespace) -> None:
    config_dir = getattr(args, "config_dir", None)
    if config_dir is not None and not os.path.isdir(config_dir):
        what = "not a directory" if os.path.exists(config_dir) else "no such directory"
        exit_with(f"--config-dir {config_dir}: {what} (the directory of the primary config)", EXIT_CONFIG_ERROR)


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    """The arguments; an unknown option is one line naming the closest one (``--world_size``: ``--world-size``)."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    options = [o for o in unknown if o.startswith("-")]
    if unknown and not options:
        parser.parse_args(argv)  # argparse's own report (stray words)
    if options:
        import difflib

        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        known = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
        word = options[0].split("=", 1)[0]
        close = difflib.get_close_matches(word.replace("_", "-"), known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"see dsconf {args.command} --help"
        exit_with(f"{args.command}: unknown option {word} ({hint})", EXIT_CONFIG_ERROR)
    _check_config_dir(args)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)
    try:
        code = _run(args)
        sys.stdout.flush()  # here rather than at exit, so that a reader gone early is caught below
        return code
    except ConfigError as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except BrokenPipeError:  # `dsconf explain | head`: the reader has what it wanted; the exit flush stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


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
    if args.command == "estimate":
        return _estimate(args)
    if args.command in ("explain", "describe"):
        from dsconf import explain

        return explain.run(args)
    if args.command == "diff":
        from dsconf import diff

        return diff.run(args)
    if args.command == "report":
        return _report(args)
    if args.command == "schema":
        return _schema(args)

    if args.command == "show" and args.explain_launch:
        return _explain_launch(args)
    from dsconf.composition import compose

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config_dir = os.path.abspath(args.config_dir) if args.config_dir else None
        overrides = [*args.overrides, *(["keep_auto=true"] if args.keep_auto else [])]
        ds = compose(overrides, world_size=args.world_size, deepspeed_version=args.deepspeed_version,
                     config_dir=config_dir, config_name=args.config_name, batch_optional=args.command == "show")
    for warning in caught:
        print(f"dsconf: warning: {warning.message}", file=sys.stderr)
    if args.command == "show":
        from dsconf.export import batch_missing

        print(json.dumps(ds, indent=2))
        if batch_missing(ds):
            print(f"dsconf: note: {NO_BATCH_NOTE}", file=sys.stderr)
    else:
        print(f"OK: train_batch_size={ds['train_batch_size']} micro={ds['train_micro_batch_size_per_gpu']} "
              f"gas={ds['gradient_accumulation_steps']}")
    return 0


def _explain_launch(args: argparse.Namespace) -> int:
    from dsconf.composition import compose_config
    from dsconf.launch.environments.explain import explain_launch
    from dsconf.launch.plan import dist_settings

    config_dir = os.path.abspath(args.config_dir) if args.config_dir else None
    cfg = compose_config(args.overrides, config_dir=config_dir, config_name=args.config_name)
    print("\n".join(explain_launch(dist_settings(cfg))))
    return 0


def _validate(args: argparse.Namespace) -> int:
    """Exit 0 when every file is valid, 1 when one has problems, 2 when one cannot be read."""
    from dsconf.validate_files import check_file, render
    from dsconf.versions import target_version

    target = target_version(args.deepspeed_version)  # a version dsconf does not know: one line, before any file
    code = 0
    for path in args.files:
        report = check_file(path, world_size=args.world_size, target=target,
                            keep_auto=args.keep_auto)
        stream = sys.stdout if report.ok else sys.stderr
        for line in render(report):
            print(line, file=stream)
        code = max(code, EXIT_UNREADABLE if report.unreadable else 0 if report.ok else EXIT_INVALID_FILE)
    return code


def _import(args: argparse.Namespace) -> int:
    """Exit 0 written; 1 the file has problems; 2 it cannot be read, or -o names nothing import may write."""
    from dsconf.importer import BadOutput, check_output, import_file
    from dsconf.validate_files import render

    try:
        check_output(args.output, force=args.force)
        report, written = import_file(args.file, args.output, world_size=args.world_size,
                                      target=args.deepspeed_version, keep_auto=args.keep_auto)
    except BadOutput as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    if written is None:
        for line in render(report):
            print(line, file=sys.stderr)
        return EXIT_UNREADABLE if report.unreadable else EXIT_INVALID_FILE
    for line in render(report):
        print(line, file=sys.stderr if report.warnings and ": warning: " in line else sys.stdout)
    print(f"wrote {written}: try `dsconf show --config-dir {os.path.dirname(written) or '.'} "
          f"--config-name {os.path.splitext(os.path.basename(written))[0]} --world-size {report.world_size}`")
    return 0


def _estimate(args: argparse.Namespace) -> int:
    """Exit 0 with the table or JSON; 2 for a bad argument, a config mistake, or DeepSpeed not installed."""
    import contextlib

    from dsconf import estimate as est

    try:
        params = est.parse_count(args.params, "--params")
        largest = (None if args.largest_layer_params is None
                   else est.parse_count(args.largest_layer_params, "--largest-layer-params"))
        est.check_counts(gpus_per_node=args.gpus_per_node, nodes=args.nodes)
        ds = None
        if args.overrides:  # composed first: a config mistake is reported before DeepSpeed is imported
            from dsconf.composition import compose

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ds = compose(est.batch_default(args.overrides), world_size=args.gpus_per_node * args.nodes)
            for warning in caught:
                print(f"dsconf: warning: {warning.message}", file=sys.stderr)
        # stdout is for the table/JSON: anything else DeepSpeed prints on import goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            rows = est.estimate(params, largest, gpus_per_node=args.gpus_per_node, nodes=args.nodes)
        if args.gpu_memory is not None:
            rows = est.mark_fits(rows, args.gpu_memory)
        if ds is not None:
            rows, notes = est.mark_selected(rows, ds)
            for note in notes:
                print(f"dsconf: note: {note}", file=sys.stderr)
    except est.EstimateError as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if args.json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
    else:
        print("\n".join(est.render_table(rows, params=params, largest_layer_params=largest,
                                         gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                                         gpu_memory_gib=args.gpu_memory)))
    return 0


def _schema(args: argparse.Namespace) -> int:
    """Exit 0 with the schema on stdout or in --output; 2 for a version dsconf does not know or an unwritable file."""
    from dsconf.json_schema import json_schema
    from dsconf.versions import newer_than_known, target_version

    target = target_version(args.deepspeed_version)  # ConfigError: one line, exit 2
    note = newer_than_known(target)
    if note:
        print(f"dsconf: warning: DeepSpeed {target}: {note}", file=sys.stderr)
    text = json.dumps(json_schema(target), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as err:
        print(f"dsconf: cannot write {args.output}: {err.strerror}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(f"wrote {args.output}: JSON Schema of DeepSpeed {target}'s config")
    return 0


def _report(args: argparse.Namespace) -> int:
    from dsconf.launch.report import MissingExtraError, SweepDirError, write_report

    if os.path.isfile(os.path.join(args.sweep_dir, "trials.json")):  # a tuner's study (hydra/sweeper=dsconf_tune)
        return _tune_report(args.sweep_dir)
    try:
        report = write_report(args.sweep_dir)
    except SweepDirError as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_NOT_A_SWEEP
    except MissingExtraError as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    counted = [f"{n} {word}{'' if n == 1 else 's'}" for n, word in
               ((report.jobs, "job"), (report.metric_plots, "metric plot"), (report.curve_plots, "curve plot"))]
    print(f"wrote {report.path}: {', '.join(counted)}")
    return 0


def _tune_report(sweep_dir: str) -> int:
    from dsconf.launch.report import MissingExtraError
    from dsconf.tune.report import write_tune_report

    try:
        path = write_tune_report(sweep_dir)
    except MissingExtraError as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    except (OSError, ValueError, TypeError) as err:
        print(f"dsconf: {os.path.join(sweep_dir, 'trials.json')}: not a dsconf tune study ({err})", file=sys.stderr)
        return EXIT_NOT_A_SWEEP
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
