"""The `multispec` command line."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points

from .cli_types import chain_length, parse_tree, positive_int
from .generate_args import DESCRIPTION as GENERATE_DESCRIPTION
from .generate_args import add_arguments as add_generate_arguments
from .heap import keep_freed_memory

# the top-level commands and what they do (`multispec --help` prints these without loading any command)
COMMANDS = {
    "bench": "speed benchmarks against plain decoding and transformers",
    "eval": "task evaluation (accuracy and speed per method)",
    "train": "train drafters for your own models",
    "generate": "generate text speculatively (a zoo pair or your checkpoint)",
    "zoo": "the model zoo: list, locate, retrain or tune pairs",
    "demo": "the Gradio demos (a tab per modality; needs the [demo] extra)",
}
# the modules behind the commands (torch, transformers, the modalities), loaded once a command needs them
COMMANDS_MODULE = "multispec.cli_commands"


# commands that modality packages add in their `register()` (the `multispec.commands` entry points) and the core's
# own in those groups: (group, name) -> (help, add_arguments(parser), run(args) -> exit code); group is "bench",
# "eval" or "train"
PLUGIN_COMMANDS: dict[tuple[str, str], tuple[str, Callable, Callable]] = {}
COMMAND_GROUP = "multispec.commands"  # entry points: a modality's `register()` of its commands
_commands_loaded = False


def load_command_plugins() -> None:
    """Call every `register` of the `multispec.commands` entry-point group (once): the modalities' commands, their
    generate modes and trainers. Only the command line does this: importing a modality loads none of it."""
    global _commands_loaded
    if _commands_loaded:
        return
    _commands_loaded = True
    for entry in entry_points(group=COMMAND_GROUP):
        try:
            entry.load()()
        except Exception as error:  # a broken plugin must not take the other commands down with it
            warnings.warn(f"multispec: the command plugin {entry.name!r} ({entry.value}) failed to load: {error}")


def register_command(group: str, name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                     run: Callable[[argparse.Namespace], int]) -> None:
    """Add `multispec GROUP NAME ...` (e.g. a modality's `multispec bench NAME`), parsed by `add_arguments`."""
    if group not in ("bench", "eval", "train"):
        raise ValueError(f"group: expected bench, eval or train, got {group!r}")
    PLUGIN_COMMANDS[(group, name)] = (help, add_arguments, run)


def add_speed_options(parser: argparse.ArgumentParser, pair: str | None = None, temperature: float = 0.8,
                      tree: str = "4/4/15", chain_k: int | None = 4, auto_chain: bool = False) -> None:
    """The options every speed benchmark takes; with `pair` (the default zoo pair) also those of a benchmark
    on a zoo pair: --pair, --temperature, --chain-k and --tree. `--tree` parses to a `DynamicTree`, or stays
    None: the benchmark then builds its own default tree, which `tree` names in the help; `chain_k` None leaves
    --chain-k to the benchmark likewise; `auto_chain`: --chain-k also takes "auto" (the length chosen for this
    machine from the pair's step profiles)."""
    parser.add_argument("--quick", action="store_true", help="a smaller run")
    if pair is not None:
        parser.add_argument("--pair", default=pair, help="zoo pair (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="new tokens per prompt (default: the benchmark's)")
    if pair is not None:
        parser.add_argument("--temperature", type=float, default=temperature,
                            help="for the sampling rows (default %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="timed rounds over the prompts, a speedup per round (default %(default)s)")
    if pair is not None:
        parser.add_argument("--chain-k", type=chain_length if auto_chain else positive_int, default=chain_k,
                            help="draft length of the chain rows%s (default %s)"
                                 % (', or "auto": chosen for this machine from the pair\'s step profiles and the '
                                    "verification cost measured here" if auto_chain else "",
                                    chain_k or ("auto where the pair has step profiles, else the pair's, chosen on "
                                                "the validation split, else 4" if auto_chain else
                                                "the pair's, chosen on the validation split, else 4")))
        parser.add_argument("--tree", default=None, type=parse_tree, metavar="D/K/N",
                            help=f"dynamic tree: depth/top-k/total nodes (default {tree})")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")


class Parser(argparse.ArgumentParser):
    """argparse with the error first: a bad option prints the one line that matters and where the options are
    listed, not the whole usage before it (the subcommands' parsers are of this class too)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}\n(`{self.prog} --help` lists every option)", file=sys.stderr)
        raise SystemExit(2)


def _light_help(argv: list[str]) -> argparse.ArgumentParser | None:
    """A parser that answers `argv` without loading the commands, where it only asks for help: `multispec`,
    `multispec --help`, and `multispec generate --help` without --pair (the core's options; a modality pair's own
    options are listed with `--pair NAME --help`, which loads them). None: build the whole command line."""
    if all(a.startswith("-") for a in argv):
        parser = Parser(prog="multispec", description="Speculative generation beyond plain text.")
        sub = parser.add_subparsers(dest="command", required=True)
        for name, help_text in COMMANDS.items():
            sub.add_parser(name, help=help_text)
        return parser
    if argv[0] == "generate" and {"-h", "--help"} & set(argv) and not any(a.startswith("--pair") for a in argv):
        parser = Parser(prog="multispec", description="Speculative generation beyond plain text.")
        generate = parser.add_subparsers(dest="command", required=True).add_parser(
            "generate", help=COMMANDS["generate"], description=GENERATE_DESCRIPTION,
            epilog="The other modalities' pairs take options of their own: `multispec generate --pair NAME --help` "
                   "lists them (`multispec zoo list` names the pairs).",
            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_generate_arguments(generate)
        return parser
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    light = _light_help(argv)
    if light is not None:
        light.parse_args(argv)  # prints the help (or the error) and exits
    commands = importlib.import_module(COMMANDS_MODULE)
    keep_freed_memory()  # every command generates or times on the CPU (multispec.heap)
    return commands.run(commands.build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
