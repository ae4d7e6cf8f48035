"""Accuracy and latency of every reasoning method on a set of problems, side by side (`multispec eval
reasoning`, `multispec bench reasoning`).

Methods (each a name in `METHODS`):
- `base`, `small`: one model alone, greedy, one token per step through the same lean loop the others use;
- `specreason`: SpecReason (the small model writes, the base scores and rewrites), the base's own steps
  drafted by the small model token by token;
- `spec_thinking`: Speculative Thinking (the small model, or `Models.thinker`, writes; the base takes over at
  reflective words);
- `verdict`: Speculative Verdict (the experts answer, consensus keeps the top k, the base decides);
- `exact`, `judge`: token-level speculative decoding of the base with the small model (or
  `Models.token_drafter`) as drafter (chain of `k`), exact and with judge verification; both report the
  mean accepted length (tokens per base forward, the correction included), and `judge` its ratio to exact's
  (`accepted_length_vs_exact`) when both run;
- `judge_approve_all`, `judge_no_floor`: the judge's controls, run beside it: the same rule with a head
  that approves every token at the same probability floor (what the floor alone gives), and the trained
  head with no floor (what the head alone gives); each row's `control` names it ("approve_all_floor",
  "no_floor"; None for `judge`). With `Settings.control_min_prob` a third, `judge_floor_matched`
  ("approve_all_matched"): the approve-all head at the floor chosen for it on the validation split (its
  longest runs within a point of exact's accuracy), the comparison that can show a judge adding to a floor
  (at one floor its approvals are a subset of the approve-all head's);
- `generate`, `assisted`: the `transformers` baselines, the base's own greedy `generate` and assisted
  generation with the small model as assistant (lossless, so their accuracy is the base's).

Timed through the one benchmark recorder (`multispec.bench.recorder`): a warm-up on the first problem, then
the methods interleaved problem by problem, the problems split into rounds; one problem is one unit, so a
method's `speedup` is the baseline's latency over its own within a round (median over rounds, with the
[min, max] spread), the baseline being `base` when it runs (else the first method). Per method, besides the
recorder's fields: `accuracy` (also under `quality`), `latency_s` (mean per problem), `tokens` (mean
generated), `speedup_vs_base` (= `speedup`, when `base` runs), plus the method's own counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from multispec import EngineConfig, StoppingConfig, speculative_generate
from multispec.plugin import Judge, JudgeHead, JudgeStats, ModelDrafter, Recorder, Shards, partition, with_role

from .data import Problem, format_prompt, is_correct
from .scoring import LogLikelihoodScorer, PromptScorer, encode_text
from .spec_thinking import SpeculativeThinking, SpeculativeThinkingConfig
from .specreason import SpecReason, SpecReasonConfig
from .speculative_verdict import LikelihoodVerdict, PromptVerdict, SpeculativeVerdict, TextExpert
from .steps import Writer

METHODS = ("base", "small", "specreason", "specreason_likelihood", "spec_thinking", "verdict", "verdict_likelihood",
           "exact", "judge", "judge_approve_all", "judge_no_floor", "judge_floor_matched", "generate", "assisted")
JUDGE_ROWS = {"judge": None, "judge_approve_all": "approve_all_floor", "judge_no_floor": "no_floor",
              "judge_floor_matched": "approve_all_matched"}  # -> control
# the methods whose greedy output is the base model's own (token-level speculation, transformers' decoding)
LOSSLESS = ("base", "exact", "generate", "assisted")


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
    thinker: object = None  # Speculative Thinking's small writer (None: `small`), e.g. one trained to reflect

    @property
    def drafter_model(self):
        return self.small if self.token_drafter is None else self.token_drafter

    def to(self, device) -> "Models":
        """Every model (and the judge head) on `device`: a data-parallel process's own GPU."""
        for name in ("base", "small", "judge", "token_drafter", "thinker"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        self.experts = {k: m.to(device) for k, m in self.experts.items()}
        return self


@dataclass
class Settings:
    # SpecReason (`specreason`): the base scores each step 0-9 when prompted (the paper's scorer) and a step
    # scoring under `threshold` (the reference's 7) is written again; `score_prompt` (instruction, lead) is the
    # judging prompt (None: the reference's; benchmarks/studies/reasoning_teach_prompts.py tries a short one)
    threshold: float = 7.0
    scorer: object = "prompt"
    score_prompt: tuple[str, str] | None = None
    # `specreason_likelihood`: the step-level lenient rule in SpecReason's place (accept a step when every token
    # has p / p_max >= threshold / 9); 3 was chosen on the zoo pair's validation split
    # (benchmarks/studies/reasoning_thresholds.py)
    likelihood_threshold: float = 3.0
    # `verdict`: the base reads the chosen experts' reasoning and writes the answer (`PromptVerdict`); compact: a
    # plain layout (`task_data.verdict_prompt`), else the reference's
    verdict_compact: bool = False
    max_new_tokens: int = 320
    k: int = 4  # drafts per token-level step (exact, judge, and the base's own steps in SpecReason)
    judge_threshold: float = 0.5
    # the judge's floor on the base's own probability of an approved token (Judge.min_target_prob): 0.2 was chosen on
    # the validation split (benchmarks/studies/reasoning_styled_drafter.py); without it the head's approvals cost accuracy
    judge_min_prob: float = 0.2
    # the approve-all control's own floor (`judge_floor_matched`), chosen on the validation split where its accuracy
    # matches the judge's (benchmarks/studies/reasoning_judge_floors.py); None: that row is not run
    control_min_prob: float | None = None
    verdict_k: int = 2
    thinking: object = None  # a SpeculativeThinkingConfig (default: the reference's knobs, this token budget)


def solve(method: str, models: Models, s: Settings, question: str) -> dict:
    """One problem through one method: the generated text, tokens and the method's counts (the recorder
    times the call; the token-level rows also give their `SpeculativeStats` as `stats`)."""
    tok = models.tokenizer
    prompt = encode_text(tok, models.prompt(question))
    eos = getattr(tok, "eos_token_id", None)
    if method in ("base", "small"):
        writer = Writer.open(models.base if method == "base" else models.small, eos_token_id=eos)
        writer.start(prompt)
        out = writer.write(s.max_new_tokens)
        return {"text": tok.decode(out), "tokens": len(out)}
    if method in ("specreason", "specreason_likelihood"):
        if method == "specreason":
            scorer, threshold = s.scorer, s.threshold
            if scorer == "prompt" and s.score_prompt is not None:
                scorer = PromptScorer.plain(tok, instruction=s.score_prompt[0], lead=s.score_prompt[1])
        else:
            scorer, threshold = LogLikelihoodScorer(), s.likelihood_threshold
        sr = SpecReason(models.small, models.base, tok, scorer,
                        SpecReasonConfig(threshold=threshold, token_budget=s.max_new_tokens),
                        base_drafter=ModelDrafter(models.small), base_tree=s.k)
        r = sr.run(prompt)
        return {"text": r.text, "tokens": len(r.tokens),
                "counts": r.counters | {"small_tokens_kept": r.tokens_by.get("small", 0)}}
    if method == "spec_thinking":
        config = s.thinking or SpeculativeThinkingConfig(token_budget=s.max_new_tokens)
        writer = models.small if models.thinker is None else models.thinker
        st = SpeculativeThinking(writer, models.base, tok, config, large_drafter=ModelDrafter(models.small),
                                 large_tree=s.k)
        r = st.run(prompt)
        return {"text": r.text, "tokens": len(r.tokens), "counts": r.counters}
    if method in ("verdict", "verdict_likelihood"):
        experts = {name: TextExpert(m, tok, models.prompt, s.max_new_tokens) for name, m in models.experts.items()}
        if method == "verdict":
            verdict = PromptVerdict(models.base, tok, s.max_new_tokens, compact=s.verdict_compact)
        else:
            verdict = LikelihoodVerdict(TextExpert(models.base, tok, models.prompt, s.max_new_tokens))
        r = SpeculativeVerdict(experts, verdict, k=min(s.verdict_k, len(experts))).run(question)
        written = sum(len(encode_text(tok, a.text)) for a in r.answers.values())  # every expert's answer
        written += len(encode_text(tok, r.text)) if method == "verdict" else 0  # and the verdict's
        return {"text": r.text, "answer": r.answer, "tokens": written,
                "counts": {"chosen": r.chosen, "experts": {n: a.answer for n, a in r.answers.items()}}}
    if method in ("generate", "assisted"):
        ids = torch.tensor([prompt], device=models.base.device)
        extra = {"assistant_model": models.drafter_model} if method == "assisted" else {}
        with torch.no_grad():
            seq = models.base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
                                       do_sample=False, eos_token_id=eos, pad_token_id=_pad(tok, eos), **extra)
        new = seq[0, len(prompt):].tolist()
        new = new[: new.index(eos) + 1] if eos in new else new
        return {"text": tok.decode(new), "tokens": len(new)}
    if method == "exact" or method in JUDGE_ROWS:
        rule = None
        if method == "judge":
            rule = Judge(models.judge, s.judge_threshold, s.judge_min_prob)
        elif method == "judge_approve_all":  # the control: every token approved, the same floor
            rule = Judge(JudgeHead.approve_all(models.judge.hidden_size, models.judge.context), s.judge_threshold,
                         s.judge_min_prob)
        elif method == "judge_floor_matched":
            if s.control_min_prob is None:
                raise ValueError("methods: 'judge_floor_matched' needs Settings.control_min_prob (the control's floor "
                                 "chosen on the validation split)")
            rule = Judge(JudgeHead.approve_all(models.judge.hidden_size, models.judge.context), s.judge_threshold,
                         s.control_min_prob)
        elif method == "judge_no_floor":
            rule = Judge(models.judge, s.judge_threshold, 0.0)
        tally = JudgeStats()
        ids = torch.tensor([prompt], device=models.base.device)
        out = speculative_generate(models.base, ModelDrafter(models.drafter_model), ids,
                                   max_new_tokens=s.max_new_tokens, tree=s.k, rule=rule,
                                   engine=EngineConfig(on_step=tally), stopping=StoppingConfig(eos_token_id=eos))
        new = out.sequences[0, len(prompt):].tolist()
        new = new[: new.index(eos) + 1] if eos in new else new
        st = out.stats
        return {"text": tok.decode(new), "tokens": len(new), "stats": st,
                "counts": {"drafted": st.drafted, "accepted": st.accepted, "overrides": tally.overrides}}
    raise ValueError(f"method: unknown method {method!r}; expected one of {', '.join(METHODS)}")


def _pad(tok, eos):
    pad = getattr(tok, "pad_token_id", None)
    return eos if pad is None else pad


def evaluate(models: Models, problems: Sequence[Problem], methods: Sequence[str] = METHODS,
             settings: Settings | None = None, progress: bool = True, warmup: bool = True, rounds: int = 3,
             controls: bool = True) -> dict:
    """Every method's row (method -> row) of `evaluate_table`, for callers that read rows by method."""
    return evaluate_table(models, problems, methods, settings, warmup, rounds, progress, controls=controls)["methods"]


def evaluate_table(models: Models, problems: Sequence[Problem], methods: Sequence[str] = METHODS,
                   settings: Settings | None = None, warmup: bool = True, rounds: int = 3,
                   progress: bool = True, shards: Shards | None = None, controls: bool = True) -> dict:
    """Run every method on every problem through the recorder (methods interleaved problem by problem, the
    problems split into `rounds`, fewer when there are fewer problems) and return its table, each row with
    the method's accuracy and counts. `warmup`: run every method once on the first problem, untimed;
    `progress`: show progress bars; `shards`: this process's part of a data-parallel run (`multispec.shards`:
    each process solves its share of every round, and every process returns the table of all problems);
    `controls=False`: a judge row without its controls (for a sweep that runs them itself, as
    benchmarks/studies/reasoning_judge_floors.py does)."""
    s = settings or Settings()
    _check(models, methods)
    if "judge" in methods and controls:  # a judge's figure is reported beside its controls, never alone
        methods = list(methods) + [m for m in JUDGE_ROWS if m not in methods and
                                   (m != "judge_floor_matched" or s.control_min_prob is not None)]
    if not problems:
        raise ValueError("problems: expected at least one problem")
    answers: dict[str, list[dict]] = {m: [] for m in methods}

    def observe(method: str, problem: Problem, result: dict) -> None:
        answers[method].append(result | {"correct": _correct(result, problem.answer), "truth": problem.answer})

    # roles: the small model alone is a reference, transformers' generate and assisted generation are peers, the
    # judge's controls are controls; the rest are the methods under test
    roles = {"small": "reference", "generate": "peer", "assisted": "peer"} | {
        m: "control" for m, control in JUDGE_ROWS.items() if control is not None}
    calls = {m: with_role(roles.get(m, "speculative"), lambda p, m=m: solve(m, models, s, p.question)) for m in methods}
    baseline = "base" if "base" in methods else methods[0]
    table = Recorder(calls, baseline, unit="problems", count=lambda p, r: 1, stats_of=lambda r: r.get("stats"),
                     observe=observe).run(partition(problems, rounds), warmup=list(problems[:1]) if warmup else [],
                                          desc="problems", round_inputs="partition", progress=progress,
                                          shards=shards)
    if shards is not None and shards.world > 1:  # every process's answers, for the figures of all problems
        parts = shards.gather(answers)
        answers = {m: [r for part in parts for r in part[m]] for m in methods}
    rows = table["methods"]
    for m, row in rows.items():
        row |= _figures(m, answers[m], row)
        if baseline == "base":  # the name readers of the earlier layout use
            row["speedup_vs_base"] = row["speedup"]
        row["method"] = m
        row["lossless"] = m in LOSSLESS  # greedy output equal to the base's; the step-level methods and judges are not
        row.setdefault("mean_accepted_length", None)  # a token-level row's (tokens per base forward)
        row["control"] = JUDGE_ROWS.get(m)
    for m in JUDGE_ROWS:  # judge verification's gain: how much longer its accepted runs are than exact's
        if m in rows:
            if "exact" in rows:
                rows[m]["accepted_length_vs_exact"] = round(rows[m]["mean_accepted_length"] /
                                                            max(rows["exact"]["mean_accepted_length"], 1e-9), 3)
    if "judge" in rows and "judge_approve_all" in rows:  # the judge against its control at the same floor
        rows["judge"]["accepted_length_vs_control"] = round(
            rows["judge"]["mean_accepted_length"] / max(rows["judge_approve_all"]["mean_accepted_length"], 1e-9), 3)
    if "judge" in rows and "judge_floor_matched" in rows:  # ... and against the control at its own chosen floor
        rows["judge"]["accepted_length_vs_matched_control"] = round(
            rows["judge"]["mean_accepted_length"] / max(rows["judge_floor_matched"]["mean_accepted_length"], 1e-9), 3)
    return table


def _check(models: Models, methods: Sequence[str]) -> None:
    if not methods:
        raise ValueError(f"methods: expected some of {', '.join(METHODS)}")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: unknown method {m!r}; expected some of {', '.join(METHODS)}")
    for m in JUDGE_ROWS:
        if m in methods and models.judge is None:
            raise ValueError(f"methods: '{m}' needs a trained judge head (multispec train judge)")
    if "verdict" in methods and len(models.experts) < 2:
        raise ValueError("methods: 'verdict' needs at least 2 experts")


def _correct(result: dict, answer: float) -> bool:
    if "answer" in result:
        return result["answer"] is not None and abs(result["answer"] - float(answer)) < 1e-6
    return is_correct(result["text"], answer)


def _figures(method: str, rs: list[dict], row: dict) -> dict:
    """One method's figures from its per-problem results (`row`: the recorder's, for the timing)."""
    n = len(rs)
    accuracy = round(sum(r["correct"] for r in rs) / n, 4)
    tokens = sum(r["tokens"] for r in rs)
    out = {"quality": {"accuracy": accuracy}, "accuracy": accuracy, "latency_s": round(row["seconds"] / n, 4),
           "tokens": round(tokens / n, 1)}
    counts = [r.get("counts", {}) for r in rs]
    total = lambda key: sum(c[key] for c in counts)  # noqa: E731
    if method.startswith("specreason"):
        out |= {"steps_accepted": total("accepted"), "steps_rejected": total("rejected"),
                "step_acceptance": round(total("accepted") / max(total("scored"), 1), 4),
                "small_token_share": round(total("small_tokens_kept") / max(tokens, 1), 4)}
    if method == "spec_thinking":
        out |= {k: total(k) for k in ("triggers", "takeovers", "verify_spans", "recaps")}
        out["large_token_share"] = round(total("large_tokens_written") / max(tokens, 1), 4)
        out["takeover_share"] = round(sum(c["takeovers"] > 0 for c in counts) / n, 4)  # problems it took over
    if method.startswith("verdict"):  # each expert alone, on the same problems
        names = counts[0]["experts"]
        out["expert_accuracy"] = {e: round(sum(_correct({"answer": c["experts"][e]}, r["truth"])
                                               for c, r in zip(counts, rs)) / n, 4) for e in names}
        out["best_expert_accuracy"] = max(out["expert_accuracy"].values())
    if method == "exact" or method in JUDGE_ROWS:  # the recorder's mean_accepted_length comes from their stats
        out |= {"acceptance_rate": round(total("accepted") / max(total("drafted"), 1), 4),
                "overrides": total("overrides")}
    return out


def _speedup(r: dict) -> str:
    if "speedup_spread" in r:
        lo, hi = r["speedup_spread"]
        return f"{r['speedup']:.2f}x [{lo:.2f}-{hi:.2f}]"
    return f"{r['speedup_vs_base']:.2f}x" if "speedup_vs_base" in r else "-"  # rows stored before the recorder


def markdown(results: dict) -> str:
    """A Markdown table of an `evaluate_table` table, or of method rows (`evaluate`, or stored results)."""
    rows = results["methods"] if "baseline" in results else results
    lines = ["| method | accuracy | latency (s) | speedup [spread] | tokens | notes |", "|---|---|---|---|---|---|"]
    for m, r in rows.items():
        notes = []
        if "step_acceptance" in r:
            notes.append(f"steps accepted {r['steps_accepted']}, rejected {r['steps_rejected']}")
        if "triggers" in r:
            notes.append(f"triggers {r['triggers']}, large share {r['large_token_share']:.2f}")
        if "overrides" in r:
            notes.append(f"mean accepted length {r['mean_accepted_length']:.2f}, overrides {r['overrides']}")
        if "accepted_length_vs_exact" in r:
            notes.append(f"{r['accepted_length_vs_exact']:.2f}x exact's accepted length")
        if "accepted_length_vs_control" in r:
            notes.append(f"{r['accepted_length_vs_control']:.2f}x the approve-all control's")
        if "accepted_length_vs_matched_control" in r:
            notes.append(f"{r['accepted_length_vs_matched_control']:.2f}x the control at its own floor")
        if r.get("control"):
            notes.append(f"control: {r['control']}")
        lines.append(f"| {m} | {r['accuracy']:.3f} | {r['latency_s']:.3f} | {_speedup(r)} | {r['tokens']:.0f} "
                     f"| {'; '.join(notes)} |")
    if "baseline" in results:
        processes = f", across {results['processes']} processes" if results.get("processes") else ""
        lines += ["", f"{results['rounds']} rounds ({results['round_inputs']}, problems per round "
                      f"{results['inputs_per_round']}{processes}); speedup: median of the per-round ratios of "
                      f"`{results['baseline']}`'s latency to the method's, [min-max] across rounds"]
    return "\n".join(lines)
