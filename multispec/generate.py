"""`speculative_generate`: one prompt, one generation (a `Session` with one `append` and one `generate`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .config import EngineConfig, StoppingConfig, check_max_new_tokens, checked, refuse_moved
from .metrics import SpeculativeStats
from .prompt import Prompt
from .rules import AcceptanceRule
from .sampling import SamplingConfig
from .session import Session
from .tree import TreeSpec


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
    input_ids: torch.Tensor,  # [B, L] left-padded prompt ids
    *,
    max_new_tokens: int = 32,
    tree: TreeSpec | int | None = None,
    rule: AcceptanceRule | str | None = None,
    sampling: SamplingConfig | None = None,
    stopping: StoppingConfig | None = None,
    engine: EngineConfig | None = None,
    generator: torch.Generator | None = None,
    **model_inputs,
) -> SpeculativeOutput:
    """Generate with speculative decoding; lossless with the default rules.

    Args:
        target: a `transformers` model (wrapped by `as_target`: `HFCausalLM`, or the adapter a modality
            registered for its class) or a `Target`; `GuidedTarget(target, scale)` for classifier-free guidance.
        drafter: a smaller `transformers` model with the same vocabulary, a `Drafter`, or a drafter name
            ("ngram", "recycling", "suffix").
        input_ids: left-padded prompts [B, L]; rows may have different lengths (`attention_mask=` [B, L], 1 for
            a real token, as `generate` takes it).
        max_new_tokens: new tokens per row at most.
        tree: None (a 4-token chain), an int k (a k-token chain), `Chain`, `StaticTree` or `DynamicTree`.
        rule: None (Greedy, or Exact when sampling), "greedy", "exact" or any `AcceptanceRule`.
        sampling: `SamplingConfig` (default greedy): do_sample, temperature, top_k, top_p, logits hooks, as in
            `generate` (but `top_k=None` means no top-k).
        stopping: `StoppingConfig`: EOS ids, pad id (default: the target's generation config, as `generate`)
            and stop sequences.
        engine: `EngineConfig`: the step ("eager", "static": fixed shapes, CUDA graphs on CUDA, or "compiled";
            the static engines are built on the first call and kept on the models), node padding, progress bar,
            `on_step` (called after each verification with the draft tree, the verdict and the original batch
            rows they cover, e.g. `multispec.trace.StepRecorder`, which the demos render).
        generator: the `torch.Generator` all randomness is drawn from (seeded runs reproduce).
        **model_inputs: `attention_mask` and the target's other prefill inputs, by the model's own names, as
            `generate` takes
            them (`pixel_values`, `image_grid_thw`, `mm_token_type_ids`, ...); one the target does not take
            raises a TypeError naming it.

    Returns `SpeculativeOutput(sequences, stats, num_new_tokens)`.
    """
    refuse_moved(model_inputs)
    attention_mask = model_inputs.pop("attention_mask", None)
    prompt = Prompt.build(input_ids, attention_mask, **model_inputs)
    check_max_new_tokens(max_new_tokens)
    engine = checked(engine, EngineConfig, "engine")
    if engine.step != "eager":  # the session builds the static engines, sized for this call
        engine = replace(engine, session_tokens=prompt.input_ids.shape[1] + max_new_tokens)
    session = Session(target, drafter, tree=tree, rule=rule, sampling=sampling, stopping=stopping, engine=engine,
                      generator=generator, rollback=False)
    b = prompt.batch_size
    if max_new_tokens == 0:
        session.target.check_prompt(prompt)
        return SpeculativeOutput(prompt.input_ids, session.stats, [0] * b)
    session.append(prompt.input_ids, prompt.attention_mask, **prompt.inputs)
    new = session.generate(max_new_tokens)
    width = max(len(t) for t in new.values())
    tail = torch.full((b, width), session.pad_token_id, dtype=torch.long, device="cpu")  # host: one copy below
    for r, toks in new.items():
        tail[r, : len(toks)] = torch.tensor(toks, dtype=torch.long, device="cpu")
    sequences = torch.cat([prompt.input_ids, tail.to(prompt.input_ids.device)], dim=1)
    return SpeculativeOutput(sequences, session.stats, [len(new[r]) for r in range(b)])
