"""The options of `multispec train draft` and its run (see `multispec.training.draft`).

Text decoders are the core's; a modality package serves its own targets (VLMs, state-space models, image
generators) with `register_trainer`: the options it adds appear under its heading, the target's config decides
which family serves a run, and another family's options are refused by name.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from ..cli_types import int_list, positive_int
from . import draft as _draft
from .draft import DraftRun, train_draft
from .kinds import KINDS, KindOptions
from .loop import LoopConfig

DESCRIPTION = _draft.__doc__


@dataclass(frozen=True)
class TargetTrainer:
    """How `train draft` serves one family of targets: `matches(config)` on the target folder's config, its
    `kinds`, its own options (added under a heading by `add_arguments`; `options` maps each one's dest to its flag:
    they default to None), and `run(args) -> exit code`."""

    name: str
    matches: Callable[[Any], bool]
    kinds: tuple[str, ...]
    options: dict[str, str]
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    run: Callable[[argparse.Namespace], int]


TRAINERS: dict[str, TargetTrainer] = {}
# the text trainer's own options, refused for another family's target: dest -> flag (the "training" group's
# options are every family's: each trains on the shared loop, `multispec.training.loop`)
TEXT_OPTIONS = {"seq_len": "--seq-len", "draft_vocab": "--draft-vocab",
                "intermediate_size": "--intermediate-size", "heads": "--heads", "kv_heads": "--kv-heads",
                "sliding_window": "--sliding-window", "ttt_steps": "--ttt-steps", "aux_layers": "--aux-layers",
                "draft_layers": "--draft-layers", "self_distill": "--self-distill", "format": "--format",
                "self_distill_tokens": "--self-distill-tokens"}


def register_trainer(trainer: TargetTrainer) -> None:
    """Called by a modality package on import (before the CLI builds its parser)."""
    TRAINERS[trainer.name] = trainer


def trainer_for(target: str) -> TargetTrainer | None:
    """The registered family whose `matches` takes the target folder's config (None: a text decoder, the core's)."""
    if not Path(target, "config.json").is_file():
        raise FileNotFoundError(f"--target: no config.json in {target}")
    config = AutoConfig.from_pretrained(target)
    return next((t for t in TRAINERS.values() if t.matches(config)), None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="PATH", help="the target: a causal LM folder with its tokenizer")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="text (.txt, .md, .py), JSONL / JSON of {text} or conversations (ShareGPT 'conversations', "
                        "chat 'messages'), or a folder of them")
    p.add_argument("--out", required=True, metavar="DIR", help="where the drafter, report.json and checkpoints go; "
                   "a folder holding a checkpoint of the same run continues from it")
    kinds = sorted(set(KINDS) | {k for t in TRAINERS.values() for k in t.kinds})
    p.add_argument("--kind", default=None, choices=kinds,
                   help="the drafter (default: eagle for a text decoder, the first of its family's kinds otherwise)")
    loop = p.add_argument_group("training")
    loop.add_argument("--steps", type=positive_int, default=1000, help="optimiser steps (default %(default)s)")
    loop.add_argument("--batch-size", type=positive_int, default=8, help="sequences per step, over every process")
    loop.add_argument("--grad-accum", type=positive_int, default=None, help="micro-batches per step in each process "
                      "(default 1)")
    loop.add_argument("--lr", type=float, default=5e-4)
    loop.add_argument("--warmup-steps", type=int, default=50)
    loop.add_argument("--seq-len", type=positive_int, default=None, help="tokens per training sequence (default 256)")
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
    shape.add_argument("--ttt-steps", type=positive_int, default=None,
                       help="eagle3: steps trained on its own predictions (default 7)")
    shape.add_argument("--aux-layers", type=int_list, default=None, metavar="A,B,C",
                       help="eagle3: the fused target layers (default 2, L/2, L-3)")
    shape.add_argument("--draft-layers", type=positive_int, default=None,
                       help="draft-model: the student's layers (default a quarter of the target's)")
    shape.add_argument("--format", choices=["eagle3", "speculators"], default=None,
                       help="eagle3: the layout written: eagle3 (default; vLLM and SGLang read it) or speculators "
                            "(speculators' SpeculatorModel.from_pretrained loads it unchanged)")
    data = p.add_argument_group("data")
    data.add_argument("--self-distill", type=int, default=None, metavar="N",
                      help="the target rewrites N conversations' assistant turns (or writes N sequences from prompts "
                           "of plain text) to train on beside the data")
    data.add_argument("--self-distill-tokens", type=positive_int, default=None, metavar="T",
                      help="the most tokens the target writes per rewritten turn (default 256)")
    data.add_argument("--eval-prompts", type=positive_int, default=8,
                      help="held-out prompts the accepted length is measured on, before and after training")
    for trainer in TRAINERS.values():
        trainer.add_arguments(p.add_argument_group(f"{trainer.name} targets (--kind {'|'.join(trainer.kinds)})"))


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    family = trainer_for(args.target)
    refused = TEXT_OPTIONS if family is not None else {}
    for other in TRAINERS.values():
        if other is not family:
            refused = refused | other.options
    given = [flag for dest, flag in refused.items() if getattr(args, dest, None) is not None]
    if given:
        served = family.name if family is not None else "a text decoder"
        raise ValueError(f"{given[0]}: not an option for this target ({served})")
    kinds = family.kinds if family is not None else tuple(KINDS)
    args.kind = args.kind or kinds[0]
    if args.kind not in kinds:
        raise ValueError(f"--kind: {args.kind} does not train for this target; its kinds: {', '.join(kinds)}")
    if family is not None:
        return family.run(args)
    return _run_text(args)


def loop_config(args: argparse.Namespace, **overrides) -> LoopConfig:
    """The shared loop's settings from the "training" options (every family's)."""
    fields = dict(steps=args.steps, batch_size=args.batch_size, grad_accum=args.grad_accum or 1, lr=args.lr,
                  warmup_steps=args.warmup_steps, checkpoint_every=args.checkpoint_every, halt_after=args.halt_after,
                  seed=args.seed, autocast=args.autocast)
    return LoopConfig(**(fields | overrides))


def loop_report(args: argparse.Namespace, trainer, history: list[dict], **fields) -> dict:
    """What every family's report.json starts with: the run, how far the loop went, its last loss; then `fields`."""
    return {"kind": args.kind, "target": args.target, "data": args.data, **fields, "steps": trainer.step,
            "finished": trainer.finished, "processes": trainer.shards.world,
            "final_loss": history[-1]["total"] if history else None}


def write_report(out: str | Path, report: dict) -> None:
    """report.json beside the drafter, and the same on stdout (rank 0 calls it)."""
    Path(out, "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def _run_text(args: argparse.Namespace) -> int:
    if args.aux_layers is not None and len(args.aux_layers) != 3:
        raise ValueError(f"--aux-layers: expected three layer ids, got {list(args.aux_layers)}")
    if args.format is not None and args.kind != "eagle3":
        raise ValueError(f"--format: a layout of EAGLE-3 heads (--kind eagle3), not of --kind {args.kind}")
    draft_run = DraftRun(kind=args.kind, seq_len=args.seq_len or 256, self_distill=args.self_distill or 0,
                         self_distill_tokens=args.self_distill_tokens or 256, eval_prompts=args.eval_prompts)
    options = KindOptions(draft_vocab=args.draft_vocab, intermediate_size=args.intermediate_size, heads=args.heads,
                          kv_heads=args.kv_heads, sliding_window=args.sliding_window, ttt_steps=args.ttt_steps or 7,
                          aux_layers=args.aux_layers, draft_layers=args.draft_layers, seed=args.seed,
                          layout=args.format or "eagle3", verifier=str(args.target))
    report = train_draft(args.target, args.data, args.out, draft_run, options, loop_config(args), device=args.device)
    shown = {k: report[k] for k in ("kind", "steps", "finished", "sequences", "tokens", "final_loss", "final_acc",
                                    "untrained_accepted_length", "accepted_length", "seconds") if k in report}
    print(json.dumps(shown, indent=2))
    return 0


__all__ = ["DESCRIPTION", "TargetTrainer", "add_arguments", "loop_config", "loop_report", "register_trainer", "run", "trainer_for",
           "write_report"]
