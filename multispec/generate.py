"""The speculative loop: draft -> verify -> accept -> commit, for a batch of ragged rows."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .acceptance import AcceptanceRule, Verdict, resolve_rule
from .drafters import Drafter, as_drafter
from .metrics import SpeculativeStats, StepStats
from .sampling import SamplingConfig, check_logits_finite
from .targets import as_target
from .tree import DraftTree, TreeSpec, as_tree_spec


@dataclass
class SpeculativeOutput:
    """`sequences` is laid out like `generate`'s: the prompt (with its padding) followed by the new
    tokens, rows that stopped early padded with `pad_token_id`."""

    sequences: torch.Tensor
    stats: SpeculativeStats
    num_new_tokens: list[int]


def _eos_ids(eos_token_id: int | Sequence[int] | torch.Tensor | None) -> tuple[int, ...]:
    """EOS ids in the order given (the first is `generate`'s default pad id), without repeats."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, int):
        return (eos_token_id,)
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    return tuple(dict.fromkeys(int(x) for x in eos_token_id))


def _default_ids(target) -> tuple[tuple[int, ...], int | None]:
    """The target's own generation-config EOS and pad ids (what `generate` would use)."""
    model = getattr(target, "model", None)
    config = getattr(model, "generation_config", None)
    eos = _eos_ids(getattr(config, "eos_token_id", None)) if config is not None else ()
    pad = getattr(config, "pad_token_id", None) if config is not None else None
    return eos, pad


def _check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids: expected a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids: expected a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids: expected an integer tensor, got {input_ids.dtype}")
    input_ids = input_ids.long()
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    else:
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask: shape {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}")
        attention_mask = attention_mask.long()
        if ((attention_mask != 0) & (attention_mask != 1)).any():
            raise ValueError("attention_mask: expected only 0 and 1 entries")
        if (attention_mask[:, 1:] < attention_mask[:, :-1]).any():
            raise ValueError("attention_mask: only left padding is supported (zeros before ones in every row)")
        if (attention_mask[:, -1] == 0).any():
            raise ValueError("attention_mask: every row needs at least one real token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens: expected an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
    return input_ids, attention_mask


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

    Returns `SpeculativeOutput(sequences, stats, num_new_tokens)`.
    """
    input_ids, attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens)
    if sampling is None:
        sampling = SamplingConfig(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
    elif not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
    target = as_target(target)
    drafter = as_drafter(drafter)
    spec = as_tree_spec(tree)
    rule = resolve_rule(rule, sampling.do_sample)
    if drafter.vocab_size is not None and drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"drafter: vocabulary size {drafter.vocab_size} does not match the target's {target.vocab_size}; "
            "a draft model must share the target's tokenizer and output vocabulary")
    if int(input_ids.max()) >= target.vocab_size or int(input_ids.min()) < 0:
        raise ValueError(f"input_ids: token ids must lie in [0, {target.vocab_size})")
    default_eos, default_pad = _default_ids(target)
    eos_ids = _eos_ids(eos_token_id) if eos_token_id is not None else default_eos
    if pad_token_id is None:  # as `generate`: the config's pad id, else the first EOS id
        pad_token_id = default_pad if default_pad is not None else (eos_ids[0] if eos_ids else 0)
    eos = set(eos_ids)
    max_pos = getattr(getattr(getattr(target, "model", None), "config", None), "max_position_embeddings", None)
    if isinstance(max_pos, int) and input_ids.shape[1] + max_new_tokens + spec.max_nodes > max_pos:
        raise ValueError(
            f"max_new_tokens: prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) + draft nodes "
            f"({spec.max_nodes}) exceed the target's max_position_embeddings ({max_pos})")

    b = input_ids.shape[0]
    stats = SpeculativeStats()
    new_tokens: list[list[int]] = [[] for _ in range(b)]
    if max_new_tokens > 0:
        _run(target, drafter, input_ids, attention_mask, max_new_tokens, sampling, spec, rule, generator, eos,
             stats, new_tokens, progress, on_step)
    width = max(len(t) for t in new_tokens)
    tail = torch.full((b, width), pad_token_id, dtype=torch.long)
    for r, toks in enumerate(new_tokens):
        tail[r, : len(toks)] = torch.tensor(toks, dtype=torch.long)
    sequences = torch.cat([input_ids, tail.to(input_ids.device)], dim=1)
    return SpeculativeOutput(sequences, stats, [len(t) for t in new_tokens])


@torch.no_grad()
def _run(target, drafter: Drafter, input_ids, attention_mask, max_new_tokens, sampling, spec, rule, generator,
         eos, stats, new_tokens, progress, on_step=None) -> None:
    device = target.device
    who = f"target ({type(getattr(target, 'model', target)).__name__})"
    t0 = time.perf_counter()
    wants = drafter.uses_target_features
    if wants:
        roots, features = target.start(input_ids, attention_mask, output_hidden_states=True)
        drafter.start(input_ids, attention_mask, features=features)
    else:
        roots = target.start(input_ids, attention_mask)
        drafter.start(input_ids, attention_mask)
    _sync(device)
    stats.prefill_s = time.perf_counter() - t0
    active = list(range(input_ids.shape[0]))  # original row of each active row
    bar = tqdm(total=max_new_tokens * len(active), disable=not progress, desc="speculative", unit="tok")
    while active:
        t0 = time.perf_counter()
        draft = drafter.propose(roots, spec, sampling, generator).trimmed()
        _sync(device)
        t1 = time.perf_counter()
        tokens = torch.cat([roots[:, None], draft.tokens.to(device)], dim=1)
        features = None
        if wants:
            logits, features = target.forward(tokens, draft.full_parents(), draft.full_valid(),
                                              output_hidden_states=True)
        else:
            logits = target.forward(tokens, draft.full_parents(), draft.full_valid())
        check_logits_finite(logits, who)
        verdict = rule.accept(draft, logits, sampling, generator)
        _sync(device)
        t2 = time.perf_counter()
        if drafter.observes_target:  # counted with the commits: the drafter updates itself
            drafter.observe(tokens, logits, draft.full_valid())
        if on_step is not None:
            on_step(draft, verdict, list(active))
        counts = (verdict.num_accepted + 1).tolist()
        emitted = verdict.tokens.tolist()
        finished, committed = [], 0
        reach = []  # per row: how many of this step's positions could still be emitted (EOS, length cut)
        for i, row in enumerate(active):
            room = max_new_tokens - len(new_tokens[row])
            toks = emitted[i][: min(counts[i], room)]
            reach.append(room)
            for j, tok in enumerate(toks):
                if tok in eos:
                    toks = toks[: j + 1]
                    reach[-1] = j + 1
                    break
            new_tokens[row].extend(toks)
            committed += len(toks)
            if len(new_tokens[row]) >= max_new_tokens or (toks and toks[-1] in eos):
                finished.append(i)
        drafted, accepted = _countable(draft, verdict, reach)
        target.commit(verdict.path)
        drafter.commit(draft, verdict, features=features)
        roots = verdict.tokens.gather(1, verdict.num_accepted[:, None].to(verdict.tokens.device))[:, 0].to(device)
        if finished:
            keep = torch.tensor([i for i in range(len(active)) if i not in set(finished)], dtype=torch.long)
            active = [active[i] for i in keep.tolist()]
            if active:
                target.select(keep)
                drafter.select(keep)
                roots = roots[keep.to(device)]
        _sync(device)
        t3 = time.perf_counter()
        stats.steps.append(StepStats(rows=len(counts), drafted=drafted, accepted=accepted, committed=committed,
                                     draft_s=t1 - t0, verify_s=t2 - t1, commit_s=t3 - t2))
        bar.update(committed)
    bar.close()


def _countable(draft: DraftTree, verdict: Verdict, reach: list[int]) -> tuple[int, int]:
    """(drafted, accepted) counting only drafts that could have been emitted: a node deeper than its row's
    reach (the tokens left before `max_new_tokens`, or up to an emitted EOS) never could."""
    accepted = int(verdict.num_accepted.cpu().clamp(max=torch.tensor(reach)).sum())
    if draft.num_nodes == 0 or min(reach) >= draft.num_nodes:  # no row is cut short: every node counts
        return int(draft.valid.sum()), accepted
    depth = draft.depths()[:, 1:].cpu()
    drafted = int((draft.valid.cpu() & (depth <= torch.tensor(reach)[:, None])).sum())
    return drafted, accepted
