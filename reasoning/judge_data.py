"""Training data for judge verification, labelled automatically on problems with checkable answers.

Greedy speculative decoding of the base model with the small model as drafter; wherever the exact rule
rejects a draft token (the first divergence in a step), the divergent token is tried: the text up to it,
the token, then the base model's own greedy continuation to the end. The token is good (label 1) if that
answer checks out, bad (0) otherwise. Its feature is the base's hidden state at the token, the state the
judge reads during verification. Only divergent tokens are labelled: the judge is consulted only where
the exact rule rejects (it is OR-ed with it). Problems the base itself gets wrong are skipped: there a
good token and a bad one both end at a wrong answer, so every label would read "bad".

With `rule` (a `Judge`), the runs are judge decoding itself (on-policy data, DAgger-style): the judge's own
approvals move the text off the base's greedy path, and the divergences met there are the ones the judge
will be asked about. Every token of the output that is not the base's greedy choice (an approval) and every
token both rules rejected is labelled; a divergence whose prefix the base itself can no longer finish
correctly (an earlier approval already broke it) is skipped, for the same reason as above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from multispec import Prompt, Session, StoppingConfig
from multispec.plugin import FeatureRequest, Judge, ModelDrafter, as_target, judge_inputs

from .data import Problem, is_correct


@dataclass
class Divergence:
    prefix: list[int]  # the text before the draft token (prompt included)
    token: int  # the draft token the exact rule rejected
    target_token: int  # what the base chose instead


def divergences(base, small, prompt: list[int], k: int, max_new_tokens: int, eos: int, rule: Judge | None = None
                ) -> tuple[list[Divergence], list[int]]:
    """Every first rejected draft token of a greedy speculative run (one per verification step), and the
    run's output (the base's own greedy text; with `rule`, judge decoding's text, whose approved divergent
    tokens are listed too)."""
    found: list[Divergence] = []
    session = Session(base, ModelDrafter(small), tree=k, rule=rule, rollback=False,
                      stopping=StoppingConfig(eos_token_id=eos))
    session.append(torch.tensor([prompt]))

    def record(draft, verdict, rows):
        acc = int(verdict.num_accepted[0])
        if acc < int(draft.valid[0].sum()):
            before = session.tokens[0] + verdict.tokens[0, :acc].tolist()
            if eos not in before[len(prompt):]:  # a step's drafts past the end of the text are not divergences
                found.append(Divergence(before, int(draft.tokens[0, acc]), int(verdict.tokens[0, acc])))

    out = session.generate(max_new_tokens, on_step=record)[0]
    if rule is not None:  # the approvals: output tokens (up to the end of the text) not the base's greedy choice
        text = prompt + (out[: out.index(eos) + 1] if eos in out else out)
        with torch.no_grad():
            greedy = base(torch.tensor([text])).logits[0, len(prompt) - 1: -1].argmax(-1).tolist()
        found += [Divergence(text[:len(prompt) + i], t, g)
                  for i, (t, g) in enumerate(zip(text[len(prompt):], greedy)) if t != g]
    return found, out


@torch.no_grad()
def judge_input_at(base, ids: list[int], context: bool = False) -> torch.Tensor:
    """What `Judge` reads for a draft token that ends `ids`: the base's final hidden state there [H], or with
    `context` the `judge_inputs` vector (also the state at the token before and the base's distribution
    there, its head applied to that state)."""
    padded = torch.tensor([ids + [0]])  # the prefill feeds all but the last token: pad one past it
    hidden = as_target(base).prefill(Prompt.build(padded), FeatureRequest(hidden=True)).features.hidden[0].float()
    if not context:
        return hidden[-1]
    logits = base.get_output_embeddings()(hidden[-2].to(base.dtype)).float()
    return judge_inputs(hidden[-1], hidden[-2], logits, torch.tensor(ids[-1]))


@torch.no_grad()
def finish_all(base, texts: list[list[int]], prompt: list[int], answer: float, tokenizer, max_new_tokens: int,
               check: Callable[[str, float], bool] = is_correct, batch_size: int = 32) -> list[bool]:
    """Whether the base's greedy continuation of each text (each starts with `prompt`) ends at `answer`, the
    texts continued together (left-padded batches of `generate`); a text that already ends with EOS is read as
    it is (an approved EOS ends the generation)."""
    eos, pad = tokenizer.eos_token_id, getattr(tokenizer, "pad_token_id", None)
    pad = eos if pad is None else pad
    out: dict[int, bool] = {}
    open_rows = []
    for i, t in enumerate(texts):
        if t[-1] == eos and len(t) > len(prompt):
            out[i] = check(tokenizer.decode(t[len(prompt): -1]), answer)
        else:
            open_rows.append(i)
    device = base.device
    for at in range(0, len(open_rows), batch_size):
        rows = open_rows[at: at + batch_size]
        width = max(len(texts[i]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(rows):
            ids[j, width - len(texts[i]):] = torch.tensor(texts[i], device=device)
            mask[j, width - len(texts[i]):] = 1
        room = max(1, max_new_tokens - min(len(texts[i]) - len(prompt) for i in rows))
        seq = base.generate(ids, attention_mask=mask, max_new_tokens=room, do_sample=False, eos_token_id=eos,
                            pad_token_id=pad)
        for j, i in enumerate(rows):
            new = seq[j, width:].tolist()[: max(1, max_new_tokens - (len(texts[i]) - len(prompt)))]  # its own room
            new = new[: new.index(eos)] if eos in new else new
            out[i] = check(tokenizer.decode(texts[i][len(prompt):] + new), answer)
    return [out[i] for i in range(len(texts))]


def label_divergences(base, small, problems: list[Problem], tokenizer, *, k: int = 4, max_new_tokens: int = 256,
                      check: Callable[[str, float], bool] = is_correct, context: bool = False,
                      rule: Judge | None = None, progress: bool = True) -> dict:
    """Judge inputs [N, F] (`judge_input_at`), labels [N], the base's own probability of each labelled token
    [N] (what a `min_target_prob` floor reads) and counts for the divergent draft tokens of `problems` (`rule`:
    label judge decoding's own runs, see the module docstring). The continuations that decide the labels run
    batched (`finish_all`)."""
    eos = tokenizer.eos_token_id
    feats, labels, probs, skipped, doomed = [], [], [], 0, 0

    def finishes(texts: list[list[int]], prompt: list[int], answer: float) -> list[bool]:
        return finish_all(base, texts, prompt, answer, tokenizer, max_new_tokens, check)

    for problem in tqdm(problems, desc="labelling divergences", disable=not progress):
        prompt = tokenizer.encode(problem.prompt())
        found, own = divergences(base, small, prompt, k, max_new_tokens, eos, rule)
        if rule is None:
            base_ok = check(tokenizer.decode(own), problem.answer)
        else:  # the run was judge decoding's: ask the base itself
            base_ok = finishes([prompt], prompt, problem.answer)[0]
        if not base_ok:  # the base's own answer is wrong
            skipped += 1
            continue
        found = [d for d in found if len(d.prefix) + 1 - len(prompt) < max_new_tokens]
        if rule is not None:  # an earlier approval may have broken a prefix: both tokens would read "bad"
            fine = finishes([d.prefix + [d.target_token] for d in found if len(d.prefix) > len(prompt)], prompt,
                            problem.answer)
            verdicts = iter(fine)
            kept = [d for d in found if len(d.prefix) <= len(prompt) or next(verdicts)]
            doomed += len(found) - len(kept)
            found = kept
        for d, good in zip(found, finishes([d.prefix + [d.token] for d in found], prompt, problem.answer)):
            feats.append(judge_input_at(base, d.prefix + [d.token], context))
            labels.append(int(good))
            probs.append(token_prob(base, d.prefix, d.token))
    if not feats:
        raise ValueError(f"problems: no divergent draft tokens to label ({skipped} of {len(problems)} problems skipped "
                         "because the base's own answer is wrong; on the rest the draft agrees with the base)")
    return {"features": torch.stack(feats), "labels": torch.tensor(labels), "target_probs": torch.tensor(probs),
            "skipped_problems": skipped, "skipped_prefixes": doomed}


@torch.no_grad()
def token_prob(base, prefix: list[int], token: int) -> float:
    """The base's probability of `token` after `prefix` (its softmax: what `Judge`'s floor compares)."""
    logits = base(torch.tensor([prefix], device=base.device)).logits[0, -1].float()
    return float(torch.softmax(logits, -1)[token])
