"""Core speed benchmark on a random-weight target/draft pair: plain decoding vs our chain and tree
speculation vs `transformers`' assisted generation and prompt lookup, same prompts, same run.

Random weights make acceptance a property of the pair, not of language: the draft here shares the
target's embeddings, first block and head (a layer-skip draft), and the target's other blocks have
damped residual branches, so the pair agrees often, as a trained pair would; the target still pays for
every block.
Trained pairs and real models come from the zoo; this benchmark measures the machinery.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .. import (DynamicTree, NGramDrafter, SuffixDecodingDrafter, TokenRecyclingDrafter,
                 speculative_generate)
from ..testing import make_layer_skip_draft
from ..drafters.recycling import cpu_tree
from .machine import describe, save_results
from .options import BenchOptions
from .recorder import LEGEND, Recorder, format_table, outputs_identical, repeat, results, sequences, with_role
from ..config import StoppingConfig


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


def run(options: BenchOptions = BenchOptions(), prompts: int | None = None) -> dict:
    """`bench core` on a random Llama and its layer-skip draft: `prompts` random prompts (default 4, 2 with
    `quick`), 128 new tokens (48 with `quick`), 3 rounds."""
    options.apply_threads()
    quick, rounds = options.quick, options.rounds_or(3)
    target, draft = build_pair(quick)
    n = options.max_new_tokens or (48 if quick else 128)
    g = torch.Generator().manual_seed(1)
    prompt_ids = [torch.randint(3, 4096, (1, 24), generator=g) for _ in range(prompts or (2 if quick else 4))]
    no_eos = dict(eos_token_id=None, pad_token_id=0)

    def hf(**kw):
        return lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, **no_eos, **kw)

    def ours(drafter, tree):
        """`drafter`: a model, or a drafter class (a fresh instance per call: the training-free drafters
        must not learn from an earlier round's output for the same prompt; a model is callable too, so
        test for a class)."""
        return lambda ids: speculative_generate(target, drafter() if isinstance(drafter, type) else drafter, ids,
                                                max_new_tokens=n, tree=tree, stopping=StoppingConfig.never())

    methods = {
        "plain": hf(),
        "hf_assisted": with_role("peer", hf(assistant_model=draft)),
        "hf_prompt_lookup": with_role("peer", hf(prompt_lookup_num_tokens=4)),
        "ngram_chain_k4": ours(NGramDrafter, 4),
        "draft_chain_k4": ours(draft, 4),
        "draft_dynamic_tree": ours(draft, DynamicTree(depth=4, topk=4, total=16)),
        "recycling_tree": ours(TokenRecyclingDrafter, cpu_tree()),
        "suffix_tree": ours(SuffixDecodingDrafter, DynamicTree(depth=4, topk=4, total=16)),
    }
    compare = lambda ref, out, ids: "identical" if torch.equal(sequences(ref), sequences(out)) else "mismatch"  # noqa: E731
    with torch.no_grad():
        table = Recorder(methods, "plain", compare=compare, also_against=["hf_assisted"]).run(
            repeat(prompt_ids, rounds), desc="bench core")
    settings = {"quick": quick, "max_new_tokens": n, "prompts": len(prompt_ids), "rounds": rounds, "greedy": True,
                "threads": torch.get_num_threads(),
                "target": f"Llama {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params (random)",
                "draft": f"{sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M params (the target's first block)"}
    tables = {"greedy": table}
    out = results("core", settings, tables, outputs_identical=outputs_identical(tables))
    print(f"target: {settings['target']}, draft: {settings['draft']}, {len(prompt_ids)} prompts x {n} new tokens, "
          f"greedy, {settings['threads']} threads")
    print(f"machine: {describe(out['machine'])}")
    print(format_table("greedy", table))
    print(LEGEND)
    return save_results(out, options.json_path)
