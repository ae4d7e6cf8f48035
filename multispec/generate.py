"""`speculative_generate`: one prompt, one generation (a `Session` with one `append` and one `generate`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .drafters import as_drafter
from .metrics import SpeculativeStats
from .prompt import Prompt
from .rules import AcceptanceRule, Verdict
from .sampling import SamplingConfig
from .session import Session, check_max_new_tokens
from .targets.static_step import static_engines
from .tree import DraftTree, TreeSpec, as_tree_spec


@dataclass
class SpeculativeOutput:
    """`sequences` is laid out like `generate`'s: the prompt (with its padding) followed by the new
    tokens, rows that stopped early padded with `pad_token_id`."""

    sequences: torch.Tensor
    stats: SpeculativeStats
    num_new_tokens: list[int]


def speculative_generate(
    target,
    drafter,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    tree: TreeSpec | int | None = None,
    rule: AcceptanceRule | str | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    sampling: SamplingConfig | None = None,
    progress: bool = False,
    on_step: Callable[[DraftTree, Verdict, list[int]], None] | None = None,
    guidance_scale: float | None = None,
    step: str = "eager",
    pad_widths: dict[int, int] | None = None,
    **model_inputs,
) -> SpeculativeOutput:
    """Generate with speculative decoding; lossless with the default rules.

    Args:
        target: a `transformers` causal LM (wrapped in `HFCausalLM`) or a target adapter.
        drafter: a smaller `transformers` model with the same vocabulary, a `Drafter`, or "ngram".
        input_ids / attention_mask: left-padded prompts [B, L]; rows may have different lengths.
        max_new_tokens: new tokens per row at most.
        do_sample, temperature, top_k, top_p: as in `generate` (but `top_k=None` means no top-k).
        tree: None (a 4-token chain), an int k (a k-token chain), `Chain`, `StaticTree` or `DynamicTree`.
        rule: None (Greedy, or Exact when sampling), "greedy", "exact" or any `AcceptanceRule`.
        generator: the `torch.Generator` all randomness is drawn from (seeded runs reproduce).
        eos_token_id / pad_token_id: default to the target's generation config, as `generate` does.
        sampling: a full `SamplingConfig` (e.g. with logits hooks) instead of the four arguments.
        progress: show a progress bar over generated tokens.
        on_step: called after each verification with the draft tree, the verdict and the original batch
            rows they cover (e.g. `multispec.trace.StepRecorder`, which the demos render).
        guidance_scale: classifier-free guidance, for targets that build their own unconditional prompt
            (Janus image generation), as their `generate` takes it; `GuidedTarget` for any other.
        step: "eager" (default), "static" (the fixed-shape step: preallocated caches, a padded node
            budget, replayed from CUDA graphs on CUDA) or "compiled" (that step under `torch.compile`), for
            Llama-family targets and their EAGLE heads / lean draft models; the engines are built on the
            first call and kept on the models (`multispec.targets.static_step`).
        pad_widths: verify a step of M nodes (root included) as `pad_widths[M]` nodes, padding with invalid
            ones, where a CPU's matrix kernels run the wider batch faster (`multispec.draft_length`:
            `VerifyCost.measure(target, ...).padding()`); the output is unchanged, only the cost.
        **model_inputs: the target's other prefill inputs, by the model's own names, as `generate` takes
            them (`pixel_values`, `image_grid_thw`, `mm_token_type_ids`, ...); one the target does not take
            raises a TypeError naming it.

    Returns `SpeculativeOutput(sequences, stats, num_new_tokens)`.
    """
    prompt = Prompt.build(input_ids, attention_mask, **model_inputs)
    check_max_new_tokens(max_new_tokens)
    if step != "eager":
        if pad_widths:
            raise ValueError(f"pad_widths: the {step} step has a fixed node budget; padding is for step='eager'")
        target, drafter = static_engines(target, as_drafter(drafter), step, prompt.input_ids.shape[1],
                                         max_new_tokens, as_tree_spec(tree).max_nodes)
    session = Session(target, drafter, tree=tree, rule=rule, sampling=sampling, do_sample=do_sample,
                      temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                      eos_token_id=eos_token_id, pad_token_id=pad_token_id, guidance_scale=guidance_scale,
                      rollback=False, pad_widths=pad_widths)
    b = prompt.batch_size
    if max_new_tokens == 0:
        session.target.check_prompt(prompt)
        return SpeculativeOutput(prompt.input_ids, session.stats, [0] * b)
    session.append(prompt.input_ids, prompt.attention_mask, **prompt.inputs)
    new = session.generate(max_new_tokens, progress=progress, on_step=on_step)
    width = max(len(t) for t in new.values())
    tail = torch.full((b, width), session.pad_token_id, dtype=torch.long, device="cpu")  # host: one copy below
    for r, toks in new.items():
        tail[r, : len(toks)] = torch.tensor(toks, dtype=torch.long, device="cpu")
    sequences = torch.cat([prompt.input_ids, tail.to(prompt.input_ids.device)], dim=1)
    return SpeculativeOutput(sequences, session.stats, [len(new[r]) for r in range(b)])
