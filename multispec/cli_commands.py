"""The `multispec` commands behind the command line (`multispec.cli` parses; this module runs): the core's
subcommands, the modalities' (registered through the `multispec.commands` entry points), and `run`, which runs a
parsed command with the libraries' chatter off and its errors as one line."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

from . import generate_cli, shards, zoo
from .bench import chat_cli
from .bench import core as bench_core
from .bench import report, tune
from .bench import text as bench_text
from .bench.options import BenchOptions
from .cli import (COMMANDS, GENERATE_DESCRIPTION, PLUGIN_COMMANDS, Parser, add_generate_arguments, add_speed_options,
                  load_command_plugins, register_command)
from .cli_types import chain_list, int_list, name_list, parse_tree, positive_int
from .training import cli as training_cli
from .zoo import export


def run(args: argparse.Namespace) -> int:
    """Run a parsed command: library chatter off, a ValueError / FileNotFoundError / ImportError as one line (exit
    2), Ctrl-C quietly (exit 130)."""
    _quiet_libraries()
    try:
        code = args.func(args)
    except (ValueError, FileNotFoundError, ImportError) as err:
        print(f"multispec: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was measured is printed where it was measured; no traceback
        print("\nmultispec: interrupted", file=sys.stderr)
        return 130
    shards.finish()  # a data-parallel run (accelerate launch): every process ends together
    return code


def _register_core_commands() -> None:
    """The core's own commands in the plugin groups (`multispec eval chat`)."""
    register_command("eval", "chat", "speed per method on chat questions in the Spec-Bench / MT-bench format, by "
                     "kind, multi-turn", chat_cli.add_arguments, chat_cli.run)


def _bench_all(args: argparse.Namespace, parsers: dict[str, argparse.ArgumentParser]) -> int:
    names = report.bench_names(list(parsers), args.only)  # a bad --only fails before anything runs
    if args.from_json is not None:
        if not Path(args.from_json).is_file():
            raise FileNotFoundError(f"--from-json: {args.from_json} is not a file")
        doc = json.loads(Path(args.from_json).read_text())
        json_path = Path(args.from_json)
    else:
        json_path = Path(args.json or f"benchmarks/results/all{'_quick' if args.quick else ''}.json")
        stored = json.loads(json_path.read_text()) if args.only and json_path.is_file() else None
        if stored is not None:
            report.check_merge(stored, args.quick)  # before anything runs
        doc = report.run_all(parsers, names, args.quick, args.rounds)
        if stored is not None:  # --only: replace those benchmarks in the stored run, keep the others
            doc = report.merge(stored, doc)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=2))
    readme = None if args.readme == "none" else Path(args.readme)
    report.write_report(doc, json_path, Path(args.benchmarks_md), readme, Path(args.plots))
    print(report.summary_table(doc))
    print(f"\nwrote {json_path}, {args.benchmarks_md}'s generated section, {args.plots}/*.png"
          + ("" if readme is None else f" and {readme}'s summary"))
    return 0


def _bench_core(args: argparse.Namespace) -> int:
    bench_core.run(BenchOptions.from_args(args))
    return 0


def _bench_text(args: argparse.Namespace) -> int:
    if args.batch is not None:
        if any(b < 1 for b in args.batch):
            raise ValueError(f"--batch: expected positive batch sizes, got {list(args.batch)}")
        bench_text.run_batch_sweep(args.pair, BenchOptions.from_args(args), args.batch, only=args.methods,
                                   plot=args.plot)
        return 0
    if args.plot is not None:
        raise ValueError("--plot: goes with --batch")
    bench_text.run(args.pair, BenchOptions.from_args(args), compile=args.compile, only=args.methods)
    return 0


def _zoo_list(args: argparse.Namespace) -> int:
    for name in zoo.names():
        e = zoo.entry(name)
        shipped = "shipped" if any(zoo.path(name).glob("**/*.safetensors")) else "not trained"
        extra = f" [needs pip extra '{e.requires}']" if e.requires else ""
        print(f"{name:20s} {shipped:12s} {e.description}{extra}")
    return 0


def _zoo_path(args: argparse.Namespace) -> int:
    print(zoo.path(args.name))
    return 0


def _zoo_train(args: argparse.Namespace) -> int:
    result = zoo.train(args.name, args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=2, default=str))
    return 0


def _zoo_export(args: argparse.Namespace) -> int:
    if args.name not in zoo.names():
        raise ValueError(f"NAME: no zoo pair {args.name!r}; pairs: {', '.join(zoo.names())}")
    written = export.export_pair(zoo.load(args.name), args.dir)
    print(json.dumps(written, indent=2))
    return 0


def _zoo_tune(args: argparse.Namespace) -> int:
    if args.name not in zoo.names():
        raise ValueError(f"NAME: no zoo pair {args.name!r}; pairs: {', '.join(zoo.names())}")
    if args.threads:
        torch.set_num_threads(args.threads)
    run = tune.TuneRun(args.name, rounds=args.rounds, max_new_tokens=args.max_new_tokens, full=args.full,
                       json_path=args.json, write=args.write)
    for option, given in (("--min-ngrams", args.min_ngrams), ("--sampled", args.sampled or None),
                          ("--temperature", args.temperature)):
        if given is not None and args.what != "chat-lookup":
            raise ValueError(f"{option}: for --what chat-lookup only")
    if args.temperature is not None and not args.sampled:
        raise ValueError("--temperature: goes with --sampled")
    if "auto" in (args.chains or []) and args.what != "chat-lookup":
        raise ValueError("--chains: auto is a --what chat-lookup candidate only")
    if args.what == "chat-lookup":
        if args.trees is not None or args.drafter is not None:
            raise ValueError(f"{'--trees' if args.trees is not None else '--drafter'}: not for --what chat-lookup")
        if args.sampled:
            tune.tune_chat_lookup(run, args.chains or tune.CHAT_SAMPLED_CHAINS,
                                  args.min_ngrams or tune.CHAT_SAMPLED_MIN_NGRAMS, args.per_category,
                                  temperature=tune.TEMPERATURE if args.temperature is None else args.temperature)
        else:
            tune.tune_chat_lookup(run, args.chains or tune.CHAT_CHAINS, args.min_ngrams or tune.CHAT_MIN_NGRAMS,
                                  args.per_category)
        return 0
    if args.what == "recycling":
        if args.chains is not None or args.drafter is not None:
            raise ValueError(f"{'--chains' if args.chains is not None else '--drafter'}: for --what shape only")
        tune.tune_recycling(run, args.trees or tune.RECYCLING_TREES)
        return 0
    trees = args.trees or tune.TREES
    for tree in trees if trees != ["none"] else []:
        try:
            parse_tree(tree)  # a malformed tree fails before any timing
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"--trees: {err}") from None
    tune.tune_shape(run, args.chains or tune.CHAINS, [] if trees == ["none"] else trees, args.drafter or "eagle")
    return 0


def _demo(args: argparse.Namespace) -> int:
    import importlib.util

    app_py = Path(__file__).resolve().parent.parent / "demos" / "app.py"
    if not app_py.exists():
        raise FileNotFoundError(f"{app_py}: the demos live in the source checkout; install it with "
                                "`pip install -e \".[demo]\"` from a clone")
    if importlib.util.find_spec("gradio") is None:
        raise ImportError("the demos need gradio: pip install -e \".[demo]\"")
    if args.target is not None:
        generate_cli.check_checkpoint(args.target, args.draft)
    elif args.draft is not None:
        raise ValueError("--draft: drafts the model of --target PATH; give that too")
    spec = importlib.util.spec_from_file_location("multispec_demo_app", app_py)
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    blocks = app.build(args.target, args.draft)
    if args.build_only:
        print(f"built {type(blocks).__name__} from {app_py}")
        return 0
    blocks.launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0


def _quiet_libraries() -> None:
    """Keep library chatter out of the results a command prints: `transformers`' per-load progress bars and
    info lines, and deprecation warnings of the libraries underneath (our own progress bars stay)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=r"(transformers|torch|numpy|PIL)\b.*")


def _add_bench(sub) -> argparse._SubParsersAction:
    """`multispec bench core|text` (the modality packages add theirs); returns the suites' subparsers."""
    bench = sub.add_parser("bench", help=COMMANDS["bench"])
    suites = bench.add_subparsers(dest="suite", required=True)
    core = suites.add_parser("core", help="random-weight pair")
    add_speed_options(core)
    core.set_defaults(func=_bench_core)
    text = suites.add_parser("text", help="a zoo text pair")
    add_speed_options(text, pair="stdlib-bytes-large", temperature=0.8,
                      tree="the pair's, chosen on the validation split, else 4/4/15", chain_k=None, auto_chain=True)
    text.add_argument("--split", choices=["heldout", "validation"], default="heldout",
                      help="prompts: held-out stdlib files (the test split, default) or validation files (where "
                           "settings are chosen)")
    text.add_argument("--compile", action="store_true",
                      help="also the EAGLE rows on the compiled static step (Llama-family targets, e.g. stdlib-bytes)")
    text.add_argument("--methods", type=name_list, default=None, metavar="A,B",
                      help="only these rows (plain decoding and the peers each table compares with always run); "
                           "default: every row")
    text.add_argument("--batch", type=int_list, default=None, metavar="B,B",
                      help="a batch sweep instead of batch 1: tokens/s summed over ragged batches of these sizes, "
                           "plain batched generate, no drafts and the rows (default rows: the chains and the tree)")
    text.add_argument("--plot", default=None, metavar="PNG", help="with --batch: tokens/s against the batch size")
    text.set_defaults(func=_bench_text, rounds=None)  # 3, or 2 with --quick (the text bench decides)
    return suites


def _add_plugins(sub, suites) -> None:
    """The commands modality packages registered, under `bench`, `eval` and `train`."""
    groups = {"bench": suites,
              "eval": sub.add_parser("eval", help=COMMANDS["eval"])
              .add_subparsers(dest="task", required=True),
              "train": sub.add_parser("train", help=COMMANDS["train"])
              .add_subparsers(dest="what", required=True)}
    draft = groups["train"].add_parser("draft", help="train a drafter (EAGLE, EAGLE-3, a draft model) for your own "
                                       "target", description=training_cli.DESCRIPTION,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    training_cli.add_arguments(draft)
    draft.set_defaults(func=training_cli.run)
    for (group, name), (help_text, add_arguments, run) in sorted(PLUGIN_COMMANDS.items()):
        command = groups[group].add_parser(name, help=help_text)
        add_arguments(command)
        command.set_defaults(func=run)


def _add_bench_all(suites) -> None:
    """`multispec bench all`: every benchmark registered so far, each through its own parser."""
    every = dict(suites.choices)
    everything = suites.add_parser("all", help="every benchmark, one JSON, BENCHMARKS.md's section and plots and "
                                   "README's summary regenerated")
    everything.add_argument("--quick", action="store_true", help="each benchmark's smaller run")
    everything.add_argument("--only", default=None, metavar="A,B",
                            help="some of the benchmarks: " + ", ".join(report.bench_names(list(every), None))
                            + "; where --json (or the default path) holds a stored run, only these are rerun and "
                            "replace theirs, the others are kept")
    everything.add_argument("--rounds", type=positive_int, default=None, help="timed rounds per benchmark "
                            "(default: each one's)")
    everything.add_argument("--json", default=None, metavar="PATH",
                            help="the combined results (default benchmarks/results/all[_quick].json)")
    everything.add_argument("--from-json", default=None, metavar="PATH",
                            help="regenerate the report from a stored run instead of running")
    everything.add_argument("--benchmarks-md", default="BENCHMARKS.md", metavar="PATH",
                            help="the report whose generated section is rewritten (default %(default)s)")
    everything.add_argument("--readme", default="README.md", metavar="PATH",
                            help="whose results summary is rewritten (default %(default)s; 'none': leave it)")
    everything.add_argument("--plots", default="benchmarks/plots", metavar="DIR",
                            help="where the PNGs go (default %(default)s)")
    everything.set_defaults(func=lambda args: _bench_all(args, every))


def _add_generate(sub) -> None:
    generate = sub.add_parser("generate", help=COMMANDS["generate"],
                              description=GENERATE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_arguments(generate)
    generate.set_defaults(func=generate_cli.run)


def _add_zoo(sub) -> None:
    actions = sub.add_parser("zoo", help=COMMANDS["zoo"]).add_subparsers(
        dest="action", required=True)
    actions.add_parser("list", help="the pairs, whether their weights ship, what they need").set_defaults(
        func=_zoo_list)
    path = actions.add_parser("path", help="where a pair's files are")
    path.add_argument("name")
    path.set_defaults(func=_zoo_path)
    train = actions.add_parser("train", help="retrain a pair with its own recipe (fixed seeds)")
    train.add_argument("name")
    train.add_argument("--out", default=None, help="where it writes (default ~/.cache/multispec/zoo/NAME)")
    train.set_defaults(func=_zoo_train)
    exported = actions.add_parser("export", help="write a text pair's target and drafters as checkpoint folders "
                                  "(--target / --draft and transformers' Auto classes load them, tokenizer included)")
    exported.add_argument("name")
    exported.add_argument("dir", help="the folder to write (target/, eagle/, draft/)")
    exported.set_defaults(func=_zoo_export)
    tuned = actions.add_parser("tune", help="choose a pair's draft shapes on the validation split (--write: store "
                               "them in its draft_shape.json)", description=tune.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    tuned.add_argument("name")
    tuned.add_argument("--what", choices=["shape", "recycling", "chat-lookup"], default="shape",
                       help="the chain length and dynamic tree (default), Token Recycling's tree, or prompt lookup "
                            "for chat (eval chat's row)")
    tuned.add_argument("--chains", type=chain_list, default=None, metavar="K,K",
                       help=f"chain lengths to try (default {','.join(map(str, tune.CHAINS))}; for --what "
                            f"chat-lookup {','.join(map(str, tune.CHAT_CHAINS))}, with --sampled "
                            f"{','.join(map(str, tune.CHAT_SAMPLED_CHAINS))}: auto sizes each step's chain)")
    tuned.add_argument("--min-ngrams", type=int_list, default=None, metavar="M,M",
                       help=f"--what chat-lookup: shortest n-grams to try (default "
                            f"{','.join(map(str, tune.CHAT_MIN_NGRAMS))})")
    tuned.add_argument("--sampled", action="store_true",
                       help="--what chat-lookup: timed sampled, for eval chat's sampled table (stored apart)")
    tuned.add_argument("--temperature", type=float, default=None,
                       help=f"with --sampled (default {tune.TEMPERATURE})")
    tuned.add_argument("--per-category", type=positive_int, default=2, metavar="N",
                       help="--what chat-lookup: validation questions a kind (default %(default)s; --full: all)")
    tuned.add_argument("--trees", nargs="+", default=None, metavar="TREE",
                       help=f"candidate trees: D/K/N for --what shape (default {' '.join(tune.TREES)}; none: chains "
                            f"only), rank paths for --what recycling (default {' '.join(tune.RECYCLING_TREES)})")
    tuned.add_argument("--drafter", choices=["eagle", "ngram"], default=None,
                       help="--what shape: whose drafts the candidates verify (default: the pair's EAGLE head)")
    tuned.add_argument("--rounds", type=positive_int, default=3, help="timed rounds (default %(default)s)")
    tuned.add_argument("--max-new-tokens", type=positive_int, default=128, help="per prompt (default %(default)s)")
    tuned.add_argument("--full", action="store_true", help="every validation prompt (default: the quick set)")
    tuned.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    tuned.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    tuned.add_argument("--write", action="store_true", help="store the choice in the pair's draft_shape.json")
    tuned.set_defaults(func=_zoo_tune)


def _add_demo(sub) -> None:
    demo = sub.add_parser("demo", help=COMMANDS["demo"])
    demo.add_argument("--host", default="127.0.0.1",
                      help="the address to serve on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    demo.add_argument("--port", type=positive_int, default=7860)
    demo.add_argument("--share", action="store_true", help="a public Gradio link")
    demo.add_argument("--target", default=None, metavar="PATH",
                      help="your causal LM checkpoint folder (with its tokenizer), served in the Text tab")
    demo.add_argument("--draft", default=None, metavar="PATH|ngram|suffix|eagle:PATH",
                      help="with --target: its drafter, as multispec generate takes it (default ngram)")
    demo.add_argument("--build-only", action="store_true", help="build the app and exit (a smoke test)")
    demo.set_defaults(func=_demo)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the core's commands and those the modality packages register on import."""
    parser = Parser(prog="multispec", description="Speculative generation beyond plain text.")
    sub = parser.add_subparsers(dest="command", required=True)
    load_command_plugins()  # modality packages register their commands
    _register_core_commands()
    suites = _add_bench(sub)
    _add_plugins(sub, suites)
    _add_bench_all(suites)  # after the plugins: `all` runs every benchmark, theirs included
    _add_generate(sub)
    _add_zoo(sub)
    _add_demo(sub)
    return parser


__all__ = ["build_parser", "run"]
