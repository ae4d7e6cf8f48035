"""The options of `multispec train draft` and its run (see `multispec.training.draft`)."""

from __future__ import annotations

import argparse
import json

import torch

from ..cli_types import int_list, positive_int
from . import draft as _draft
from .draft import DraftRun, train_draft
from .kinds import KINDS, KindOptions
from .loop import LoopConfig

DESCRIPTION = _draft.__doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="PATH", help="the target: a causal LM folder with its tokenizer")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="text (.txt, .md, .py), JSONL / JSON of {text} or conversations (ShareGPT 'conversations', "
                        "chat 'messages'), or a folder of them")
    p.add_argument("--out", required=True, metavar="DIR", help="where the drafter, report.json and checkpoints go; "
                   "a folder holding a checkpoint of the same run continues from it")
    p.add_argument("--kind", default="eagle", choices=sorted(KINDS), help="the drafter (default %(default)s)")
    loop = p.add_argument_group("training")
    loop.add_argument("--steps", type=positive_int, default=1000, help="optimiser steps (default %(default)s)")
    loop.add_argument("--batch-size", type=positive_int, default=8, help="sequences per step, over every process")
    loop.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per step in each process")
    loop.add_argument("--lr", type=float, default=5e-4)
    loop.add_argument("--warmup-steps", type=int, default=50)
    loop.add_argument("--seq-len", type=positive_int, default=256, help="tokens per training sequence")
    loop.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (0: at the end)")
    loop.add_argument("--halt-after", type=positive_int, default=None,
                      help="stop after this many steps of this run, checkpointed (time-boxed runs; rerun to go on)")
    loop.add_argument("--autocast", choices=["auto", "bf16", "none"], default="auto",
                      help="bf16 autocast: auto = on a GPU (default)")
    loop.add_argument("--seed", type=int, default=0)
    loop.add_argument("--device", default=None, help="the target's device (default: where it loads; a data-parallel "
                      "run: each process's GPU)")
    loop.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    shape = p.add_argument_group("the drafter's shape (default: mirrors one of the target's layers)")
    shape.add_argument("--draft-vocab", type=positive_int, default=None,
                       help="eagle/eagle3: draft vocabulary size, the most frequent training tokens (default: all)")
    shape.add_argument("--intermediate-size", type=positive_int, default=None)
    shape.add_argument("--heads", type=positive_int, default=None)
    shape.add_argument("--kv-heads", type=positive_int, default=None)
    shape.add_argument("--sliding-window", type=positive_int, default=None, help="eagle: the head's attention window")
    shape.add_argument("--ttt-steps", type=positive_int, default=7, help="eagle3: steps trained on its own predictions")
    shape.add_argument("--aux-layers", type=int_list, default=None, metavar="A,B,C",
                       help="eagle3: the fused target layers (default 2, L/2, L-3)")
    shape.add_argument("--draft-layers", type=positive_int, default=None,
                       help="draft-model: the student's layers (default a quarter of the target's)")
    data = p.add_argument_group("data")
    data.add_argument("--self-distill", type=int, default=0, metavar="N",
                      help="the target rewrites N conversations' assistant turns (or writes N sequences from prompts "
                           "of plain text) to train on beside the data")
    data.add_argument("--eval-prompts", type=positive_int, default=8,
                      help="held-out prompts the accepted length is measured on, before and after training")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.aux_layers is not None and len(args.aux_layers) != 3:
        raise ValueError(f"--aux-layers: expected three layer ids, got {list(args.aux_layers)}")
    draft_run = DraftRun(kind=args.kind, seq_len=args.seq_len, self_distill=args.self_distill,
                         eval_prompts=args.eval_prompts)
    options = KindOptions(draft_vocab=args.draft_vocab, intermediate_size=args.intermediate_size, heads=args.heads,
                          kv_heads=args.kv_heads, sliding_window=args.sliding_window, ttt_steps=args.ttt_steps,
                          aux_layers=args.aux_layers, draft_layers=args.draft_layers, seed=args.seed)
    loop = LoopConfig(steps=args.steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
                      warmup_steps=args.warmup_steps, checkpoint_every=args.checkpoint_every,
                      halt_after=args.halt_after, seed=args.seed, autocast=args.autocast)
    report = train_draft(args.target, args.data, args.out, draft_run, options, loop, device=args.device)
    shown = {k: report[k] for k in ("kind", "steps", "finished", "sequences", "tokens", "final_loss", "final_acc",
                                    "untrained_accepted_length", "accepted_length", "seconds") if k in report}
    print(json.dumps(shown, indent=2))
    return 0


__all__ = ["DESCRIPTION", "add_arguments", "run"]
