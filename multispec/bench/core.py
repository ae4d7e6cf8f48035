"""Core speed benchmark on a random-weight target/draft pair: plain decoding vs our chain and tree
speculation vs `transformers`' assisted generation and prompt lookup, same prompts, same run.

Random weights make acceptance a property of the pair, not of language: the draft here shares the
target's embeddings, first block and head (a layer-skip draft), and the target's other blocks have
damped residual branches, so the pair agrees often, as a trained pair would; the target still pays for
every block.
Trained pairs and real models come from the zoo; this benchmark measures the machinery.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .. import (DynamicTree, NGramDrafter, SuffixDecodingDrafter, TokenRecyclingDrafter,
                 speculative_generate)
from ..testing import make_layer_skip_draft
from ..drafters.recycling import cpu_tree
from .machine import describe, machine_info


@dataclass
class Row:
    method: str
    seconds: float
    new_tokens: int
    ms_per_token: float
    speedup_vs_ar: float
    mean_accepted_length: float | None
    identical_to_ar: bool


def build_pair(quick: bool, seed: int = 0, agreement_damping: float = 0.05):
    torch.manual_seed(seed)
    hidden, layers = (384, 10) if quick else (512, 16)
    config = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=False, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    target = LlamaForCausalLM(config).eval()
    draft_layers = 1
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)  # peaked distributions, like a trained model's
        # Damp the residual branches of the blocks the draft skips: the target still pays for every block,
        # but its predictions stay close to the draft's, as a trained draft's would.
        for block in target.model.layers[draft_layers:]:
            block.self_attn.o_proj.weight.mul_(agreement_damping)
            block.mlp.down_proj.weight.mul_(agreement_damping)
    return target, make_layer_skip_draft(target, layers=draft_layers)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(quick: bool = False, max_new_tokens: int | None = None, prompts: int | None = None,
        json_path: str | None = None, threads: int | None = None, repeats: int | None = None) -> list[Row]:
    if threads:
        torch.set_num_threads(threads)
    target, draft = build_pair(quick)
    n = max_new_tokens or (48 if quick else 128)
    repeats = repeats or (2 if quick else 3)
    g = torch.Generator().manual_seed(1)
    prompt_ids = [torch.randint(3, 4096, (1, 24), generator=g) for _ in range(prompts or (2 if quick else 4))]
    no_eos = dict(eos_token_id=None, pad_token_id=0)

    def hf(**kw):
        return lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, **no_eos, **kw)

    def ours(drafter, tree):
        """`drafter`: a model, or a drafter class (a fresh instance per run: the repeats of a prompt must
        not learn from each other; a model is callable too, so test for a class)."""
        return lambda ids: speculative_generate(target, drafter() if isinstance(drafter, type) else drafter, ids,
                                                max_new_tokens=n, tree=tree, eos_token_id=[], pad_token_id=0)

    methods = {
        "plain (generate)": hf(),
        "hf assisted (draft model)": hf(assistant_model=draft),
        "hf prompt lookup": hf(prompt_lookup_num_tokens=4),
        "ours n-gram chain k=4": ours(NGramDrafter, 4),
        "ours chain k=4": ours(draft, 4),
        "ours dynamic tree": ours(draft, DynamicTree(depth=4, topk=4, total=16)),
        "ours token recycling tree": ours(TokenRecyclingDrafter, cpu_tree()),
        "ours suffix decoding tree": ours(SuffixDecodingDrafter, DynamicTree(depth=4, topk=4, total=16)),
    }
    hf(num_beams=1)(prompt_ids[0][:, :4])  # warm-up
    results: dict[str, tuple[float, int, float | None, bool]] = {}
    reference: list[torch.Tensor] = []
    for name, fn in methods.items():
        total_s, total_tokens, committed, forwards, same = 0.0, 0, 0, 0, True
        for i, ids in enumerate(prompt_ids):
            with torch.no_grad():  # best of `repeats` runs: the machine's noise only ever adds time
                runs = [_timed(lambda: fn(ids)) for _ in range(repeats)]
            out, secs = runs[0][0], min(r[1] for r in runs)
            seq = out.sequences if hasattr(out, "stats") else out
            if name.startswith("plain"):
                reference.append(seq)
            same &= torch.equal(seq, reference[i])
            total_s += secs
            total_tokens += seq.shape[1] - ids.shape[1]
            if hasattr(out, "stats"):
                committed += out.stats.committed
                forwards += sum(s.rows for s in out.stats.steps)
        mal = committed / forwards if forwards else None
        results[name] = (total_s, total_tokens, mal, same)
    base = results["plain (generate)"][0] / results["plain (generate)"][1]
    rows = []
    for name, (secs, toks, mal, same) in results.items():
        per = secs / toks
        rows.append(Row(name, round(secs, 3), toks, round(per * 1e3, 2), round(base / per, 3),
                        None if mal is None else round(mal, 3), same))
    print(f"target: Llama {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params (random), "
          f"draft: {sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M, {len(prompt_ids)} prompts x {n} "
          f"new tokens, greedy, {torch.get_num_threads()} threads, best of {repeats} runs")
    print(f"machine: {describe(machine_info())}")
    print(f"{'method':28s} {'ms/token':>9s} {'speedup':>8s} {'accepted len':>12s} {'identical':>9s}")
    for r in rows:
        mal = "-" if r.mean_accepted_length is None else f"{r.mean_accepted_length:.2f}"
        print(f"{r.method:28s} {r.ms_per_token:9.2f} {r.speedup_vs_ar:7.2f}x {mal:>12s} {str(r.identical_to_ar):>9s}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": machine_info(), "quick": quick, "max_new_tokens": n, "prompts": len(prompt_ids),
                       "rows": [asdict(r) for r in rows],
                       "outputs_identical": all(r.identical_to_ar for r in rows)}, f, indent=2)
    return rows
