"""`multispec generate`: the runs (`multispec.generate_args` holds the options and the modes' registry)."""


from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from . import zoo
from .bench.machine import busy
from .cli_types import parse_tree
from .generate_args import DEFAULT_MAX_NEW_TOKENS, GENERATE_MODES, GenerateMode  # noqa: F401 (the modes import them here)
from .config import EngineConfig, StoppingConfig
from .drafters import ModelDrafter, NGramDrafter, SuffixDecodingDrafter
from .drafters.formats import load_eagle
from .generate import speculative_generate
from .sampling import SamplingConfig
from .tree import DynamicTree


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    """--sample / --temperature as the `SamplingConfig` every generation of the command shares."""
    return SamplingConfig(do_sample=bool(args.sample), temperature=args.temperature if args.sample else 1.0)


def tree_option(text: str | None):
    if text is None:
        return None
    if text.isdigit():
        k = int(text)
        if k < 1:
            raise ValueError(f"--tree: a chain needs at least one draft, got {text!r}")
        return k
    try:
        return parse_tree(text)
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"--tree: expected K or DEPTH/TOPK/TOTAL, e.g. 4 or 4/4/15; got {text!r}") from err


def prompts(args: argparse.Namespace) -> list[str]:
    """The texts of --prompt or --prompts FILE (one per line, \\n escapes allowed)."""
    if args.prompt is None and args.prompts is None:
        raise ValueError("--prompt: give the text with --prompt TEXT or a file of them with --prompts FILE")
    if args.prompt is not None:
        if not args.prompt:
            raise ValueError("--prompt: empty; give some text to continue")
        return [args.prompt]
    path = Path(args.prompts)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts: {path} is not a file")
    lines = [line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"--prompts: {path} holds no prompt")
    return lines


def _mode(args: argparse.Namespace) -> GenerateMode | None:
    """The modality mode serving --pair (None: text), refusing another mode's options."""
    mode = next((m for m in GENERATE_MODES.values() if args.pair in m.pairs), None)
    for other in GENERATE_MODES.values():
        given = [flag for dest, flag in other.options.items() if getattr(args, dest, None) is not None]
        if other is not mode and given:
            raise ValueError(f"{given[0]}: only for {other.name} pairs ({', '.join(other.pairs)})")
    if mode is not None and args.draft is not None:
        raise ValueError("--draft: a zoo pair brings its drafter; use --target PATH to choose one")
    if mode is not None and args.step != "eager" and not mode.static_step:
        raise ValueError(f"--step: {args.step!r} serves the text, vision-language and image pairs; {mode.name} pairs "
                         "run the eager step")
    return mode


def check_sampling(args: argparse.Namespace) -> None:
    if args.sample and not args.temperature > 0:
        raise ValueError(f"--temperature: expected a positive number, got {args.temperature}")


def _check(args: argparse.Namespace) -> None:
    """Everything that can be checked before a model loads."""
    if args.pair is not None:
        if args.pair not in zoo.names():
            raise ValueError(f"--pair: unknown zoo pair {args.pair!r}; expected one of {', '.join(zoo.names())}")
        if args.draft is not None:
            raise ValueError("--draft: a zoo pair brings its drafter; use --target PATH to choose one")
    else:
        check_checkpoint(args.target, args.draft)
    check_sampling(args)


def check_checkpoint(target: str, draft: str | None) -> None:
    """`--target PATH [--draft ...]` as `load_checkpoint` takes them, checked before anything loads."""
    if not Path(target, "config.json").is_file():
        raise FileNotFoundError(f"--target: no config.json in {target}")
    draft = draft or "ngram"
    if draft.startswith("eagle:") and not Path(draft[6:]).is_dir():
        raise FileNotFoundError(f"--draft: no EAGLE head folder at {draft[6:]}")
    if draft not in ("ngram", "suffix") and not draft.startswith("eagle:") and not Path(draft, "config.json").is_file():
        raise FileNotFoundError(f"--draft: expected ngram, suffix, eagle:PATH or a model folder; no config.json "
                                f"in {draft}")


def _load(args: argparse.Namespace, prompts: list[str]):
    """(target, drafter, tokenizer, tree, eos id)."""
    if args.pair is not None:
        pair = zoo.load(args.pair)
        config = getattr(pair.target, "config", None)
        if getattr(config, "image_token_id", None) is not None or not callable(pair.tokenizer) \
                or not hasattr(pair.tokenizer, "decode"):
            raise ValueError(f"--pair: {args.pair} is not a text pair, and no installed modality package serves it in "
                             "generate")
        tree = tree_option(args.tree) or pair.tree or pair.chain_k or 4
        eos = getattr(pair.tokenizer, "eos_token_id", None)
        return pair.target, pair.drafter, pair.tokenizer, tree, eos
    target, drafter, tokenizer = load_checkpoint(args.target, args.draft, prompts)
    return target, drafter, tokenizer, tree_option(args.tree) or 4, tokenizer.eos_token_id


def load_checkpoint(target_path: str, draft: str | None, prompts: list[str] = ()):
    """(target, drafter, tokenizer) of a causal LM folder and a --draft spec: a draft model folder, ngram
    (prompt lookup, the default), suffix (SuffixDecoding over `prompts`) or eagle:PATH."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(target_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    draft = draft or "ngram"
    if draft == "ngram":
        drafter = NGramDrafter()
    elif draft == "suffix":
        drafter = SuffixDecodingDrafter(corpus=[tokenizer(p)["input_ids"] for p in prompts])
    elif draft.startswith("eagle:"):  # a multispec, EAGLE-3 (vLLM / SGLang) or reference EAGLE-1/2 head
        drafter = load_eagle(draft[6:], target)
    else:
        drafter = ModelDrafter(AutoModelForCausalLM.from_pretrained(draft).eval())
    return target, drafter, tokenizer


class _Stream:
    """Prints a row's committed tokens as they come, up to its first EOS and `limit` tokens; holds back a
    trailing partial character (a byte-level tokenizer may split one)."""

    def __init__(self, decode: Callable[[list[int]], str], eos: int | None, limit: int, enabled: bool):
        self.decode, self.eos, self.limit, self.enabled = decode, eos, limit, enabled
        self.ids: list[int] = []
        self.shown = ""
        self.ended = False

    def __call__(self, draft, verdict, rows) -> None:
        if self.ended or 0 not in rows:
            return
        row = rows.index(0)
        new = verdict.tokens[row, : int(verdict.num_accepted[row]) + 1].tolist()
        for t in new:
            if len(self.ids) >= self.limit:
                self.ended = True
                break
            self.ids.append(t)
            if t == self.eos:
                self.ended = True
                break
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            text = text[:-1]
        if self.enabled and text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
            self.shown = text


def run(args: argparse.Namespace) -> int:
    mode = _mode(args)
    if mode is not None:
        return mode.run(args)
    texts = prompts(args)
    args.max_new_tokens = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    _check(args)
    tree_option(args.tree)
    target, drafter, tokenizer, tree, eos = _load(args, texts)
    records = []
    for i, prompt in enumerate(texts):
        if len(texts) > 1:
            print(f"--- prompt {i + 1} of {len(texts)}")
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        records.append(generate_one(target, drafter, tokenizer.decode, {"input_ids": ids}, prompt, args, tree, eos))
    write_json(args, {"source": args.pair or args.target, "tree": tree_name(tree), "sample": args.sample,
                      "records": records})
    return 0


def generate_one(target, drafter, decode: Callable[[list[int]], str], inputs: dict, shown: str,
                 args: argparse.Namespace, tree, eos: int | None, pad: int | None = None) -> dict:
    """One input through `speculative_generate` (`inputs`: the model inputs, `input_ids` first), streamed after
    `shown` (the prompt as the user gave it), with speed and accepted length printed; `--compare` also runs the
    target's own `generate` on the same inputs. Returns the JSON record."""
    ids = inputs["input_ids"]
    stream = _Stream(decode, eos, args.max_new_tokens, not args.no_stream)
    if not args.no_stream:
        sys.stdout.write(shown)  # the continuation streams after it
        sys.stdout.flush()
    pad = pad if pad is not None else (eos if eos is not None else 0)
    generator = _generator(args)
    t0 = time.perf_counter()
    out = speculative_generate(target, drafter, max_new_tokens=args.max_new_tokens, tree=tree,
                               sampling=sampling_config(args),
                               stopping=StoppingConfig(eos_token_id=eos, pad_token_id=pad), generator=generator,
                               engine=EngineConfig(step=args.step, on_step=stream), **inputs)
    seconds = time.perf_counter() - t0
    new = out.sequences[0, ids.shape[1]: ids.shape[1] + out.num_new_tokens[0]].tolist()
    text = decode(new)
    if args.no_stream:
        print(shown + text)
    elif text.startswith(stream.shown):
        print(text[len(stream.shown):])
    record = {"prompt": shown, "text": text, "new_tokens": len(new), "seconds": round(seconds, 4),
              "tokens_per_s": round(len(new) / max(seconds, 1e-9), 2),
              "mean_accepted_length": round(out.stats.mean_accepted_length, 3), "steps": len(out.stats.steps)}
    line = (f"[{len(new)} tokens in {seconds:.2f} s, {record['tokens_per_s']:.1f} tokens/s, "
            f"mean accepted length {record['mean_accepted_length']:.2f} tokens per target forward]")
    if args.compare:
        run = dict(max_new_tokens=args.max_new_tokens, tree=tree, sampling=sampling_config(args),
                   stopping=StoppingConfig(eos_token_id=eos, pad_token_id=pad), engine=EngineConfig(step=args.step))
        timed = timed_rounds(lambda: speculative_generate(target, drafter, generator=_generator(args), **run, **inputs),
                             lambda: _plain(target, inputs, args, eos, pad), args.rounds,
                             units=lambda out: len(out["tokens"]) if isinstance(out, dict) else int(out.num_new_tokens[0]))
        record["plain"] = timed["plain_output"]
        record.update(comparison_record(timed))
        line += "\n" + comparison_line("speculative", timed, "tokens")
        if not args.sample:
            record["identical_to_plain"] = timed["plain_output"]["tokens"] == new
            line += f"\n[outputs {'identical' if record['identical_to_plain'] else 'differ'}]"
    print(line)
    return record


def _generator(args: argparse.Namespace) -> torch.Generator | None:
    return torch.Generator().manual_seed(args.seed) if args.sample else None


def timed_rounds(speculative: Callable[[], object], plain: Callable[[], object], rounds: int,
                 units: Callable[[object], float] = lambda out: 1.0) -> dict:
    """Speculation against plain decoding, fairly: both warmed up (the caller's displayed speculative run warmed
    speculation; plain runs once untimed here, its output returned as "plain_output"), then `rounds` rounds
    alternating which goes first; the rate per run (`units(output)` per second: tokens, images, problems), the
    speedup per round, the medians, and a note ("noisy") when the rounds disagree by more than 20% or the machine
    is busy."""
    warm = plain()
    spec_rates, plain_rates, speedups = [], [], []
    for r in range(rounds):
        timed = {}
        for name in (("plain", "speculative") if r % 2 == 0 else ("speculative", "plain")):
            t0 = time.perf_counter()
            out = plain() if name == "plain" else speculative()
            timed[name] = units(out) / max(time.perf_counter() - t0, 1e-9)
        plain_rates.append(timed["plain"])
        spec_rates.append(timed["speculative"])
        speedups.append(timed["speculative"] / max(timed["plain"], 1e-9))
    median = statistics.median(speedups)
    notes = []
    if rounds > 1 and (max(speedups) - min(speedups)) > 0.2 * median:
        notes.append(f"the rounds' speedups range {round(min(speedups), 3):.2f}-{round(max(speedups), 3):.2f}x (more "
                     f"than 20% apart): short runs time noisily; more --rounds or a longer --max-new-tokens steady "
                     f"the median")
    if busy():
        notes.append(busy())
    return {"plain_output": warm, "plain_rate": statistics.median(plain_rates), "plain_rates": plain_rates,
            "speculative_rate": statistics.median(spec_rates), "speculative_rates": spec_rates, "rounds": rounds,
            "speedup": round(median, 3), "speedup_spread": [round(min(speedups), 3), round(max(speedups), 3)],
            **({"noisy": "; ".join(notes)} if notes else {})}


def comparison_line(what: str, timed: dict, unit: str, baseline: str = "plain generate") -> str:
    """The printed summary of `timed_rounds`: medians, spread, and the noise note when there is one."""
    spread = timed["speedup_spread"]
    line = (f"[timed, warmed up, {timed['rounds']} alternating rounds (medians): {baseline} {timed['plain_rate']:.2f} "
            f"{unit}/s, {what} {timed['speculative_rate']:.2f} {unit}/s: {timed['speedup']:.2f}x "
            f"[{spread[0]:.2f}-{spread[1]:.2f} across rounds]")
    return line + "]" + (f"\n[noisy: {timed['noisy']}]" if "noisy" in timed else "")


def comparison_record(timed: dict) -> dict:
    """The JSON fields of `timed_rounds`."""
    keep = {k: v for k, v in timed.items() if k != "plain_output"}
    for key in ("plain_rate", "speculative_rate"):
        keep[key] = round(keep[key], 3)
    for key in ("plain_rates", "speculative_rates"):
        keep[key] = [round(x, 3) for x in keep[key]]
    return keep


def write_json(args: argparse.Namespace, payload: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2))


def tree_name(tree) -> str:
    return f"{tree.depth}/{tree.topk}/{tree.total}" if isinstance(tree, DynamicTree) else str(tree)


def _plain(target, inputs: dict, args: argparse.Namespace, eos: int | None, pad: int) -> dict:
    """The target's own `generate` on the same inputs (greedy, or sampling at the same temperature)."""
    extra = dict(do_sample=True, temperature=args.temperature, top_k=0) if args.sample else dict(do_sample=False)
    if args.sample:
        torch.manual_seed(args.seed)
    device = next(target.parameters()).device  # the model's own generate takes inputs on its device
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    ids = inputs["input_ids"]
    if "attention_mask" not in inputs:
        inputs["attention_mask"] = torch.ones_like(ids)
    t0 = time.perf_counter()
    with torch.no_grad():
        seq = target.generate(**inputs, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                              **extra)
    seconds = time.perf_counter() - t0
    tokens = seq[0, ids.shape[1]:].tolist()
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return {"tokens": tokens, "seconds": round(seconds, 4), "tokens_per_s": round(len(tokens) / max(seconds, 1e-9), 2)}
