"""The options and the run of `multispec eval chat` (`multispec.bench.chat` reads, runs and tabulates)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .. import SamplingConfig, zoo
from ..adaptive import AdaptiveChain
from ..chat import render_ids
from ..cli_types import chain_length, name_list, positive_int
from ..drafters import NGramDrafter, SuffixDecodingDrafter
from ..generate_cli import load_checkpoint
from ..tree import DynamicTree
from .chat import SHIPPED, ChatRunner, leaderboard, plain_methods, read_questions, select, timed
from .machine import busy, save_results
from .recorder import format_table, results
from .rows import Row, keep_rows, method_table
from .text import setup_rows
from .tune import chat_lookup_row
from .text import rows as text_rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--pair", default=None, help="a zoo text pair (default gemma3-270m-eagle)")
    source.add_argument("--target", default=None, metavar="PATH", help="a causal LM folder with its tokenizer "
                        "(rows: n-gram lookup and SuffixDecoding, and --draft)")
    p.add_argument("--draft", default=None, metavar="PATH|eagle:PATH", help="with --target: a draft model folder or "
                   "an EAGLE head (eagle:PATH) for the model rows")
    p.add_argument("--data", default=None, metavar="FILE.jsonl",
                   help="questions in the Spec-Bench / MT-bench format (default: the shipped set)")
    p.add_argument("--split", choices=["validation", "test", "all"], default="test",
                   help="the questions of this split (a file without splits is all test; default %(default)s)")
    p.add_argument("--per-category", type=positive_int, default=None, metavar="N", help="at most N questions a kind")
    p.add_argument("--question-ids", type=name_list, default=None, metavar="ID,ID",
                   help="only these questions of the split (their question_id)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="per turn (default %(default)s)")
    p.add_argument("--max-message-tokens", type=positive_int, default=1024,
                   help="a longer user message keeps its first and last halves (default %(default)s)")
    p.add_argument("--turn-format", choices=["gemma", "plain"], default=None,
                   help="for a tokenizer without a chat template (default: Gemma's markers when it knows them)")
    p.add_argument("--chain-k", type=chain_length, default=None, metavar="K|auto",
                   help="the chain rows' length (default: calibrated here from the pair's step profiles, as bench "
                        "text does; else the pair's, else 4)")
    p.add_argument("--methods", type=name_list, default=None, metavar="A,B",
                   help="only these rows (plain decoding and the peers always run)")
    p.add_argument("--no-sampling", action="store_true", help="the greedy table only")
    p.add_argument("--temperature", type=float, default=0.8, help="the sampled table's (default %(default)s)")
    p.add_argument("--rounds", type=positive_int, default=3, help="timed rounds (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="one validation question a kind, 64 new tokens, 2 rounds, "
                   "greedy, the rows of QUICK_ROWS")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--markdown", default=None, metavar="PATH", help="the leaderboards as markdown")
    p.add_argument("--plot", default=None, metavar="PNG", help="speedup per kind (needs matplotlib)")


def _rows(args, drafter, runner, questions):
    """(greedy methods, the rows, the sampled table's own rows, their chain length and how it was chosen): a zoo
    pair's `bench text` rows, the chain length calibrated where it runs when the pair has step profiles (as `bench
    text` does: a verification's cost by width is the machine's), or for a checkpoint the training-free drafters
    and the one `--draft` names."""
    choice, quick_extra, sampled_only = None, [], []
    if args.pair is not None:
        pair = zoo.load(args.pair)
        firsts = [(f"q{q.question_id}", torch.tensor([render_ids([{"role": "user", "content": runner.messages(q)[0]}],
                                                                 runner.tokenizer, runner.fmt)]))
                  for q in questions]
        setup = setup_rows(pair, args.pair, firsts, args.max_new_tokens, args.chain_k, None, 0)
        chain_k, choice = setup.chain_k, setup.choice
        rows = [r for r in text_rows(setup, compile=False) if not r.name.startswith(("suffix_chain_k",
                                                                                     "hybrid_ngram_suffix"))]
        if pair.chat_lookup is not None:  # prompt lookup chosen for chat on the validation split (zoo tune)
            rows.append(chat_lookup_row(*pair.chat_lookup))
            quick_extra.append(rows[-1].name)
        if pair.chat_lookup_sampled is not None:  # its sampled choice (zoo tune --sampled): the sampled table's row
            row = chat_lookup_row(*pair.chat_lookup_sampled)
            sampled_only = [row] if row.name not in {r.name for r in rows} else []
        draft_model = pair.draft_model
    else:
        # a checkpoint has no step profiles to calibrate from: --chain-k K, else 4
        if args.chain_k == "auto":
            raise ValueError("--chain-k auto: calibrates from a zoo pair's step profiles; give --target a length K "
                             "(the row eagle_chain_auto chooses each step's length itself)")
        chain_k = args.chain_k or 4
        rows = [Row("no_draft", NGramDrafter, 0, sampled=True, role="control"),
                Row(f"ngram_chain_k{chain_k}", NGramDrafter, chain_k),
                Row("suffix_tree", SuffixDecodingDrafter, _default_tree(), fresh=True, sampled=True)]
        draft_model = None
        if args.draft is not None:
            eagle = args.draft.startswith("eagle:")
            rows.append(Row(f"{'eagle' if eagle else 'draft'}_chain_k{chain_k}", drafter, chain_k, sampled=True))
            if eagle:
                rows.append(Row("eagle_chain_auto", drafter, AdaptiveChain(max_k=min(16, 2 * chain_k)), sampled=True))

    def run(q, drafter, tree, options):
        return runner.speculative(q, drafter, tree, options)

    greedy = plain_methods(runner, draft_model) | method_table(rows, run)
    only = args.methods
    if args.quick and only is None:
        quick = [r.replace("{k}", str(chain_k)) for r in QUICK_ROWS] + quick_extra
        only = tuple(n for n in quick if n in greedy)
    sampled_names = {r.name for r in sampled_only}
    greedy = keep_rows(greedy, only if only is None else [n for n in only if n not in sampled_names],
                       ["plain", "hf_prompt_lookup", "hf_assisted"], "greedy")
    rows = [r for r in rows + sampled_only if only is None or r.name in only]
    return greedy, rows, sampled_names, chain_k, choice


# `--quick`'s rows (with plain decoding and the peers): no drafts, prompt lookup and SuffixDecoding, the pair's
# EAGLE head with its length chosen each step (`tree="auto"`: it stops drafting where the head is not accepted) and
# its hybrid with prompt lookup; and the pair's prompt lookup chosen for chat, where it has one
QUICK_ROWS = ("no_draft", "ngram_chain_k{k}", "eagle_chain_auto", "hybrid_chain_k{k}", "suffix_tree")


def _default_tree():
    return DynamicTree(depth=4, topk=4, total=15)


def _load(args):
    """(target, tokenizer, the --draft drafter or None)."""
    if args.target is not None:
        target, drafter, tokenizer = load_checkpoint(args.target, args.draft)
        return target, tokenizer, drafter if args.draft else None
    pair = zoo.load(args.pair)
    return pair.target, pair.tokenizer, None


def run(args: argparse.Namespace) -> int:
    args.pair = args.pair if args.pair is not None or args.target is not None else "gemma3-270m-eagle"
    if args.draft is not None and args.target is None:
        raise ValueError("--draft: goes with --target (a zoo pair brings its drafters)")
    questions = read_questions(args.data or SHIPPED)  # a bad file fails before any model loads
    if args.quick:
        args.split, args.per_category = ("validation" if args.data is None else args.split), args.per_category or 1
        args.max_new_tokens, args.rounds = min(args.max_new_tokens, 64), min(args.rounds, 2)
        args.no_sampling = True
    chosen = select(questions, args.split, args.per_category, args.question_ids)
    warning = busy()
    if warning:
        print(f"warning: {warning}")
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer, drafter = _load(args)
    greedy_runner = ChatRunner(target, tokenizer, args.max_new_tokens, args.turn_format, args.max_message_tokens,
                               SamplingConfig())
    greedy, rows, sampled_names, chain_k, choice = _rows(args, drafter, greedy_runner, chosen)
    tables, kinds = {}, {}
    def first_look(table):
        print(format_table(f"chat, greedy, first of {args.rounds} rounds (the full tables follow)", table), flush=True)

    tables["greedy"], kinds["greedy"] = timed(greedy, chosen, args.rounds, compare=True, desc="chat, greedy",
                                              first_round=first_look)
    _show("greedy", tables, kinds)
    if not args.no_sampling:
        sampled_runner = ChatRunner(target, tokenizer, args.max_new_tokens, args.turn_format,
                                    args.max_message_tokens, SamplingConfig(do_sample=True,
                                                                           temperature=args.temperature))

        def run_sampled(q, drafter, tree, options):
            return sampled_runner.speculative(q, drafter, tree, options)

        sampled = plain_methods(sampled_runner, peers=False) | method_table(rows, run_sampled, sampled=True)
        sampled = keep_rows(sampled, args.methods, ["plain", "no_draft"], "sampling")
        tables["sampling"], kinds["sampling"] = timed(sampled, chosen, args.rounds, compare=False, redraw=True,
                                                      desc="chat, sampling")
        _show("sampling", tables, kinds)
    order = list(dict.fromkeys(q.kind for q in chosen))
    boards = {name: leaderboard(tables[name], kinds[name], order) for name in tables}
    settings = {"source": args.pair or args.target, "data": str(args.data or "shipped: " + SHIPPED.name),
                "split": args.split, "questions": [q.question_id for q in chosen], "kinds": order,
                "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "chain_k": chain_k,
                "chain_k_by": "calibrated here" if choice else "given, the pair's stored choice or 4",
                "pad_widths": {str(m): w for m, w in choice.pad_widths.items()} if choice else {},
                "verify_ms": {str(m): round(v, 2) for m, v in choice.cost.ms.items()} if choice else {},
                "turn_format": greedy_runner.fmt.name if greedy_runner.fmt else "chat template",
                "long_messages": f"a user message over {args.max_message_tokens} tokens keeps its first and last "
                                 f"{args.max_message_tokens // 2}", "temperature": args.temperature,
                "sampled_only_rows": sorted(sampled_names), "quick": args.quick,
                "threads": torch.get_num_threads(), "busy": warning}
    res = results("chat", settings, tables, per_kind=kinds, leaderboards=boards,
                  outputs_identical=all(set(r.get("outputs", {"identical": 1})) == {"identical"}
                                        for r in tables["greedy"]["methods"].values()))
    save_results(res, args.json)
    if args.markdown:
        Path(args.markdown).write_text("\n\n".join(f"{n}:\n\n{b}" for n, b in boards.items()) + "\n")
    if args.plot:
        plot(res, Path(args.plot))
    return 0


def _show(name: str, tables: dict, kinds: dict) -> None:
    """Print a table as soon as it is measured."""
    order = list(dict.fromkeys(k for m in kinds[name].values() for k in m))
    print(format_table(f"chat, {name}", tables[name]))
    print(f"\n{name}: speedup over plain decoding by kind (medians over rounds)\n"
          + leaderboard(tables[name], kinds[name], order) + "\n", flush=True)


def plot(res: dict, path: Path) -> None:
    import matplotlib  # optional: the report extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = res["settings"]["kinds"]
    per = res["per_kind"]["greedy"]
    methods = [m for m in per if m != "plain"]
    fig, ax = plt.subplots(figsize=(max(6, len(kinds) * 1.6), 4))
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        ax.bar([k + i * width for k in range(len(kinds))], [per[m].get(kind, {}).get("speedup", 0) for kind in kinds],
               width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], kinds, rotation=20, ha="right")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["add_arguments", "plot", "run"]
