"""Accuracy and latency of every reasoning method on a set of problems, side by side (`multispec eval
reasoning`, `multispec bench reasoning`).

Methods (each a name in `METHODS`):
- `base`, `small`: one model alone, greedy, one token per step through the same lean loop the others use;
- `specreason`: SpecReason (the small model writes, the base scores and rewrites), the base's own steps
  drafted by the small model token by token;
- `spec_thinking`: Speculative Thinking (the small model writes, the base takes over at reflective words);
- `verdict`: Speculative Verdict (the experts answer, consensus keeps the top k, the base decides);
- `exact`, `judge`: token-level speculative decoding of the base with the small model (or
  `Models.token_drafter`) as drafter (chain of `k`), exact and with judge verification; both report the
  mean accepted length (tokens per base forward, the correction included), and `judge` its ratio to exact's
  (`accepted_length_vs_exact`) when both run;
- `generate`, `assisted`: the `transformers` baselines, the base's own greedy `generate` and assisted
  generation with the small model as assistant (lossless, so their accuracy is the base's).

Per method: `accuracy`, `latency_s` (mean per problem), `tokens` (mean generated), `speedup_vs_base`
(base latency / method latency, from the same run), plus the method's own counts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .data import Problem, format_prompt, is_correct

METHODS = ("base", "small", "specreason", "spec_thinking", "verdict", "exact", "judge", "generate", "assisted")


@dataclass
class Models:
    """What the methods run on: the base and small models (one tokenizer), the experts, the judge head."""

    base: object
    small: object
    tokenizer: object
    experts: dict = field(default_factory=dict)
    judge: object = None  # a JudgeHead (trained on the drafts of the token-level rows' drafter)
    prompt: object = format_prompt  # question -> the text the models continue
    token_drafter: object = None  # the draft model of `exact`, `judge`, `assisted` (None: `small`)

    @property
    def drafter_model(self):
        return self.small if self.token_drafter is None else self.token_drafter


@dataclass
class Settings:
    # SpecReason's score threshold (0-9): 3 was chosen for the likelihood scorer on the zoo pair's validation
    # split (benchmarks/reasoning_thresholds.py); the reference's 7 is for its prompt scorer
    threshold: float = 3.0
    scorer: object = "likelihood"
    max_new_tokens: int = 320
    k: int = 4  # drafts per token-level step (exact, judge, and the base's own steps in SpecReason)
    judge_threshold: float = 0.5
    # the judge's floor on the base's own probability of an approved token (Judge.min_target_prob): 0.2 was chosen on
    # the validation split (benchmarks/reasoning_styled_drafter.py); without it the head's approvals cost accuracy
    judge_min_prob: float = 0.2
    verdict_k: int = 2
    thinking: object = None  # a SpeculativeThinkingConfig (default: the reference's knobs, this token budget)


def _run(method: str, models: Models, s: Settings, question: str) -> dict:
    """One problem through one method: the generated text, seconds and the method's counts."""
    from multispec import speculative_generate
    from multispec.drafters import ModelDrafter
    from multispec.judge import Judge, JudgeStats

    from .scoring import _encode
    from .spec_thinking import SpeculativeThinking, SpeculativeThinkingConfig
    from .specreason import SpecReason, SpecReasonConfig
    from .steps import Writer
    from .verdict import LikelihoodVerdict, SpeculativeVerdict, TextExpert

    tok = models.tokenizer
    prompt = _encode(tok, models.prompt(question))
    eos = getattr(tok, "eos_token_id", None)
    t0 = time.perf_counter()
    if method in ("base", "small"):
        writer = Writer.open(models.base if method == "base" else models.small, eos_token_id=eos)
        writer.start(prompt)
        out = writer.write(s.max_new_tokens)
        return {"text": tok.decode(out), "seconds": time.perf_counter() - t0, "tokens": len(out)}
    if method == "specreason":
        sr = SpecReason(models.small, models.base, tok, s.scorer,
                        SpecReasonConfig(threshold=s.threshold, token_budget=s.max_new_tokens),
                        base_drafter=ModelDrafter(models.small), base_tree=s.k)
        r = sr.run(prompt)
        return {"text": r.text, "seconds": r.seconds, "tokens": len(r.tokens),
                "counts": r.counters | {"small_tokens_kept": r.tokens_by.get("small", 0)}}
    if method == "spec_thinking":
        config = s.thinking or SpeculativeThinkingConfig(token_budget=s.max_new_tokens)
        st = SpeculativeThinking(models.small, models.base, tok, config, large_drafter=ModelDrafter(models.small),
                                 large_tree=s.k)
        r = st.run(prompt)
        return {"text": r.text, "seconds": r.seconds, "tokens": len(r.tokens), "counts": r.counters}
    if method == "verdict":
        experts = {name: TextExpert(m, tok, models.prompt, s.max_new_tokens) for name, m in models.experts.items()}
        verdict = LikelihoodVerdict(TextExpert(models.base, tok, models.prompt, s.max_new_tokens))
        r = SpeculativeVerdict(experts, verdict, k=min(s.verdict_k, len(experts))).run(question)
        return {"text": r.text, "answer": r.answer, "seconds": r.seconds, "tokens": 0,
                "counts": {"chosen": r.chosen}}
    if method in ("generate", "assisted"):
        ids = torch.tensor([prompt])
        extra = {"assistant_model": models.drafter_model} if method == "assisted" else {}
        with torch.no_grad():
            seq = models.base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
                                       do_sample=False, eos_token_id=eos, pad_token_id=_pad(tok, eos), **extra)
        new = seq[0, len(prompt):].tolist()
        new = new[: new.index(eos) + 1] if eos in new else new
        return {"text": tok.decode(new), "seconds": time.perf_counter() - t0, "tokens": len(new)}
    if method in ("exact", "judge"):
        rule = None if method == "exact" else Judge(models.judge, s.judge_threshold, s.judge_min_prob)
        tally = JudgeStats()
        ids = torch.tensor([prompt])
        out = speculative_generate(models.base, ModelDrafter(models.drafter_model), ids,
                                   max_new_tokens=s.max_new_tokens, tree=s.k, rule=rule, eos_token_id=eos,
                                   on_step=tally)
        new = out.sequences[0, len(prompt):].tolist()
        new = new[: new.index(eos) + 1] if eos in new else new
        st = out.stats
        return {"text": tok.decode(new), "seconds": time.perf_counter() - t0, "tokens": len(new),
                "counts": {"forwards": len(st.steps), "committed": st.committed, "drafted": st.drafted,
                           "accepted": st.accepted, "overrides": tally.overrides}}
    raise ValueError(f"method: unknown method {method!r}; expected one of {', '.join(METHODS)}")


def _pad(tok, eos):
    pad = getattr(tok, "pad_token_id", None)
    return eos if pad is None else pad


def evaluate(models: Models, problems: Sequence[Problem], methods: Sequence[str] = METHODS,
             settings: Settings | None = None, progress: bool = True, warmup: bool = True) -> dict:
    """Run every method on every problem (methods interleaved problem by problem, so machine drift hits
    all alike) and summarise per method."""
    s = settings or Settings()
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: unknown method {m!r}; expected some of {', '.join(METHODS)}")
    if "judge" in methods and models.judge is None:
        raise ValueError("methods: 'judge' needs a trained judge head (multispec train judge)")
    if "verdict" in methods and len(models.experts) < 2:
        raise ValueError("methods: 'verdict' needs at least 2 experts")
    if warmup and problems:
        for m in methods:
            _run(m, models, s, problems[0].question)
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    for p in tqdm(problems, desc="problems", disable=not progress):
        for m in methods:
            r = _run(m, models, s, p.question)
            r["correct"] = _correct(r, p.answer)
            rows[m].append(r)
    return summarise(rows)


def _correct(result: dict, answer: float) -> bool:
    if "answer" in result:
        return result["answer"] is not None and abs(result["answer"] - float(answer)) < 1e-6
    return is_correct(result["text"], answer)


def summarise(rows: dict[str, list[dict]]) -> dict:
    out = {}
    for m, rs in rows.items():
        n = len(rs)
        entry = {"accuracy": round(sum(r["correct"] for r in rs) / n, 4),
                 "latency_s": round(sum(r["seconds"] for r in rs) / n, 4),
                 "tokens": round(sum(r["tokens"] for r in rs) / n, 1), "problems": n}
        counts = [r.get("counts", {}) for r in rs]
        if m == "specreason":
            scored = sum(c["scored"] for c in counts)
            entry |= {"steps_accepted": sum(c["accepted"] for c in counts),
                      "steps_rejected": sum(c["rejected"] for c in counts),
                      "step_acceptance": round(sum(c["accepted"] for c in counts) / max(scored, 1), 4),
                      "small_token_share": round(sum(c["small_tokens_kept"] for c in counts) /
                                                 max(sum(r["tokens"] for r in rs), 1), 4)}
        if m == "spec_thinking":
            entry |= {k: sum(c[k] for c in counts) for k in ("triggers", "takeovers", "verify_spans", "recaps")}
            entry["large_token_share"] = round(sum(c["large_tokens_written"] for c in counts) /
                                               max(sum(r["tokens"] for r in rs), 1), 4)
        if m in ("exact", "judge"):
            forwards = sum(c["forwards"] for c in counts)
            entry |= {"mean_accepted_length": round(sum(c["committed"] for c in counts) / max(forwards, 1), 3),
                      "acceptance_rate": round(sum(c["accepted"] for c in counts) /
                                               max(sum(c["drafted"] for c in counts), 1), 4),
                      "overrides": sum(c["overrides"] for c in counts)}
        out[m] = entry
    if "base" in out:
        for entry in out.values():
            entry["speedup_vs_base"] = round(out["base"]["latency_s"] / entry["latency_s"], 3)
    if "exact" in out and "judge" in out:  # judge verification's gain: how much longer its accepted runs are
        out["judge"]["accepted_length_vs_exact"] = round(out["judge"]["mean_accepted_length"] /
                                                         max(out["exact"]["mean_accepted_length"], 1e-9), 3)
    return out


def markdown(results: dict) -> str:
    lines = ["| method | accuracy | latency (s) | vs base | tokens | notes |", "|---|---|---|---|---|---|"]
    for m, r in results.items():
        notes = []
        if "step_acceptance" in r:
            notes.append(f"steps accepted {r['steps_accepted']}, rejected {r['steps_rejected']}")
        if "triggers" in r:
            notes.append(f"triggers {r['triggers']}, large share {r['large_token_share']:.2f}")
        if "mean_accepted_length" in r:
            notes.append(f"mean accepted length {r['mean_accepted_length']:.2f}, overrides {r['overrides']}")
        if "accepted_length_vs_exact" in r:
            notes.append(f"{r['accepted_length_vs_exact']:.2f}x exact's accepted length")
        vs = f"{r['speedup_vs_base']:.2f}x" if "speedup_vs_base" in r else "-"
        lines.append(f"| {m} | {r['accuracy']:.3f} | {r['latency_s']:.3f} | {vs} | {r['tokens']:.0f} "
                     f"| {'; '.join(notes)} |")
    return "\n".join(lines)
