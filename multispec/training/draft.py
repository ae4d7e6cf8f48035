"""`multispec train draft`: a drafter for a user's own target, from the command line.

    multispec train draft --target PATH --data PATH --out DIR [--kind eagle|eagle3|draft-model] [--steps N]

Steps: load the target (a checkpoint folder with its tokenizer), read the data (`multispec.training.data`), hold
out every twentieth document, optionally let the target rewrite part of it (`--self-distill N`), cut the text
into sequences, keep the `--steps x --batch-size` of them the steps read (drawn by the seed, when there are more:
the target's features are captured for those alone), measure the untrained drafter's accepted length on held-out prompts, train
(`multispec.training.loop`: resumable, data parallel under `accelerate launch`), save the drafter in `--out`
with `report.json` (the accepted length after training beside the untrained one, the data, the time).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..shards import current
from ..chat import stop_ids, turn_format
from ..config import StoppingConfig
from ..generate import speculative_generate
from .data import TextData, chunks, read_documents, split
from .kinds import KINDS, DraftKind, KindOptions
from .loop import LoopConfig, TrainLoop
from .regenerate import regenerate_conversations, regenerate_text


@dataclass
class DraftRun:
    """What one `train draft` run takes besides the kind's shape (`KindOptions`) and the loop (`LoopConfig`)."""

    kind: str = "eagle"
    seq_len: int = 256
    self_distill: int = 0  # sequences (or conversations) the target rewrites itself
    self_distill_prompt: int = 64  # plain text: tokens of each sequence the target continues from
    self_distill_tokens: int = 256  # conversations: tokens per regenerated turn at most
    eval_prompts: int = 8
    eval_prompt_tokens: int = 128
    eval_new_tokens: int = 64
    eval_k: int = 4


def load_target(path: str | Path, device: str | None = None):
    """(model, tokenizer) of a causal LM checkpoint folder, with a clear error for a folder that is not one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--target: no config.json in {path}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if device:
        model = model.to(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"--target: {path} has no tokenizer transformers can load ({err})") from None
    return model, tokenizer


def training_sequences(target, tokenizer, data: TextData, run: DraftRun, seed: int) -> tuple[list[list[int]], dict]:
    """The training sequences of `seq_len` tokens (the human text, and what the target wrote itself), and an
    account of them for the report."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    docs = list(data.train)
    regenerated = 0
    if run.self_distill and any(d.messages for d in docs):
        # a turn ends at the EOS or the turn format's end-of-turn marker (Gemma's <end_of_turn>)
        rewritten = regenerate_conversations(target, tokenizer, docs, run.self_distill, run.self_distill_tokens,
                                             eos=stop_ids(tokenizer, turn_format(tokenizer)) or None, pad=pad)
        # a conversation of prompts alone (its assistant turns empty) trains through its rewrite only
        docs = [d for d in docs if not _prompts_only(d)] + rewritten
        regenerated = len(rewritten)
    sequences = chunks(docs, run.seq_len)
    if run.self_distill and not any(d.messages for d in data.train):
        written = regenerate_text(target, sequences, run.self_distill, run.self_distill_prompt, run.seq_len,
                                  seed=seed, pad=pad)
        sequences += written
        regenerated = len(written)
    if not sequences:
        raise ValueError(f"--data: {data.tokens} training tokens make no sequence of --seq-len {run.seq_len}")
    return sequences, {"documents": len(data.train), "heldout_documents": len(data.heldout),
                       "sequences": len(sequences), "tokens": len(sequences) * run.seq_len,
                       "self_distilled": regenerated}


def _prompts_only(doc) -> bool:
    turns = [m for m in doc.messages or () if m["role"] == "assistant"]
    return bool(turns) and not any(m["content"].strip() for m in turns)


def bounded(sequences: list[list[int]], account: dict, loop: LoopConfig) -> list[list[int]]:
    """The sequences the run's steps read: all of them when one epoch of `steps x batch_size` covers them, else that
    many drawn by the run's seed (so the target's features are captured for what is trained on, not for all of
    `--data`); the account says how many there were."""
    reads = loop.steps * loop.batch_size
    account["sequences_available"] = len(sequences)
    if len(sequences) <= reads:
        return sequences
    keep = sorted(torch.randperm(len(sequences), generator=torch.Generator().manual_seed(loop.seed))[:reads].tolist())
    account["sequences"], account["tokens"] = reads, reads * len(sequences[0])
    return [sequences[i] for i in keep]


@torch.no_grad()
def accepted_length(target, drafter, prompts: list[list[int]], k: int, new_tokens: int,
                    desc: str = "accepted length") -> float | None:
    """Tokens committed per target forward over greedy generations from `prompts` (batch 1 each), with a progress
    bar over the prompts."""
    committed = forwards = 0
    device = next(target.parameters()).device
    for prompt in tqdm(prompts, desc=desc, unit="prompt", leave=False):
        out = speculative_generate(target, drafter, torch.tensor([prompt], device=device), max_new_tokens=new_tokens,
                                   tree=k, stopping=StoppingConfig.never())
        committed += out.stats.committed
        forwards += sum(s.rows for s in out.stats.steps)
    return round(committed / forwards, 4) if forwards else None


def heldout_prompts(data: TextData, run: DraftRun) -> list[list[int]]:
    """Up to `eval_prompts` prompts from the held-out documents: windows of `eval_prompt_tokens` tokens (of half a
    document, for shorter ones), spread over each document."""
    out = []
    for doc in data.heldout:
        width = min(run.eval_prompt_tokens, len(doc.ids) // 2)
        if width < 2:
            continue
        room = len(doc.ids) - width
        count = max(1, min(run.eval_prompts - len(out), room // width))
        out += [doc.ids[i * room // count: i * room // count + width] for i in range(count)]
        if len(out) >= run.eval_prompts:
            break
    return out[: run.eval_prompts]


def train_draft(target_path: str, data_path: str, out: str, run: DraftRun, kind_options: KindOptions,
                loop: LoopConfig, device: str | None = None) -> dict:
    """Train and save a drafter (see the module docstring); returns the report (rank 0 writes it)."""
    if run.kind not in KINDS:
        raise ValueError(f"--kind: expected one of {', '.join(KINDS)}, got {run.kind!r}")
    start = time.time()
    shards = current()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_target(target_path, device or (str(shards.device) if shards.world > 1 else None))
    data = split(read_documents(data_path, tokenizer))
    sequences, account = training_sequences(target, tokenizer, data, run, loop.seed)
    sequences = bounded(sequences, account, loop)
    kind: DraftKind = KINDS[run.kind](target, sequences, kind_options)
    prompts = heldout_prompts(data, run)
    untrained = accepted_length(target, kind.drafter(), prompts, run.eval_k, run.eval_new_tokens,
                                "accepted length, untrained") if shards.main else None
    trainer = TrainLoop(kind.module, kind.losses, len(sequences), loop, out_dir, shards, desc=f"train {run.kind}")
    history = trainer.run()
    report = {"kind": run.kind, "target": str(target_path), "data": str(data_path), **account,
              "steps": trainer.step, "finished": trainer.finished, "processes": shards.world,
              "final_loss": history[-1]["total"] if history else None,
              "final_acc": history[-1].get("acc") if history else None,
              "seconds": round(time.time() - start, 1), "loop": asdict(loop), "run": asdict(run),
              "options": asdict(kind_options), **kind.describe()}
    if trainer.finished and shards.main:
        kind.save(out_dir)
        if run.kind == "draft-model":  # a model folder `--draft DIR` loads with its tokenizer
            tokenizer.save_pretrained(out_dir)
        report["accepted_length"] = accepted_length(target, kind.drafter(), prompts, run.eval_k, run.eval_new_tokens,
                                                    "accepted length, trained")
        report["untrained_accepted_length"] = untrained
        report["eval"] = {"prompts": len(prompts), "prompt_tokens": run.eval_prompt_tokens,
                          "new_tokens": run.eval_new_tokens, "chain_k": run.eval_k, "split": "held-out documents"}
    if shards.main:
        (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


__all__ = ["DraftRun", "accepted_length", "heldout_prompts", "load_target", "train_draft", "training_sequences"]
