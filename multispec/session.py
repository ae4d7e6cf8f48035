"""A speculative generation that lasts across calls: the target's and the drafter's caches are kept, so a
caller can append text, generate up to a stop, score a candidate span, and roll back, without prefilling
the context again (step-level reasoning speculation lives on this). `speculative_generate` is one
`append` and one `generate`.

    session = Session(target, drafter, tree=4, sampling=SamplingConfig(do_sample=True))
    session.append(prompt_ids)                       # prefill
    step = session.generate(64, stop=[[271]])        # up to a "\n\n" token
    mark = session.checkpoint()
    score = session.score(candidate_ids)             # log p of a span, nothing committed
    session.rollback(mark)                           # back to the checkpoint

The loop per step: draft -> verify (one target pass over the tree) -> accept -> commit, for a batch of rows
whose lengths drift apart. A row that stops while others go on leaves the session (as in `generate`, its
text is final); rows that stop together, or a single row, stay and can continue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from tqdm.auto import tqdm

from .config import EngineConfig, StoppingConfig, check_max_new_tokens, checked, stop_sequences
from .drafters import Drafter, as_drafter
from .host import deferred_checks
from .metrics import SpeculativeStats, StepStats
from .prompt import Prompt
from .rules import AcceptanceRule, Verdict, resolve_rule
from .sampling import SamplingConfig, check_logits_finite
from .step_read import StepClock, read_step
from .targets import Target, as_target
from .targets.base import Features
from .targets.static import static_engines
from .adaptive import AdaptiveChain
from .tree import Chain, DraftTree, TreeSpec, as_tree_spec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class SpanScore:
    """`logprobs[b, i]`: the target's log-probability of span token i after the context and tokens < i
    (raw logits, no sampling transform); `top_logprobs[b, i]`: the largest log-probability at that position
    (the target's own choice there), `top_tokens[b, i]` that choice (the argmax: what greedy decoding
    would have written); `next_logits[b]`: the target's logits after the whole span (None after `append`,
    whose pass does not read the last appended token)."""

    logprobs: torch.Tensor
    top_logprobs: torch.Tensor
    next_logits: torch.Tensor | None = None
    top_tokens: torch.Tensor | None = None

    @staticmethod
    def of(logits: torch.Tensor, tokens: torch.Tensor, next_logits: torch.Tensor | None = None) -> "SpanScore":
        """From the logits predicting `tokens` [B, n] ([B, n, V])."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        top = logp.max(dim=-1)
        return SpanScore(logp.gather(2, tokens[..., None])[..., 0], top.values, next_logits, top.indices)

    @property
    def total(self) -> torch.Tensor:
        return self.logprobs.sum(dim=-1)


@dataclass(frozen=True)
class Checkpoint:
    rows: tuple[int, ...]
    lengths: tuple[int, ...]
    roots: torch.Tensor
    target_state: Any


class Session:
    """Speculative generation over a target and a drafter that keeps both caches between calls."""

    def __init__(self, target, drafter="ngram", *, tree: TreeSpec | int | None = None,
                 rule: AcceptanceRule | str | None = None, sampling: SamplingConfig | None = None,
                 stopping: StoppingConfig | None = None, engine: EngineConfig | None = None,
                 generator: torch.Generator | None = None, rollback: bool = True):
        """Arguments as `speculative_generate`'s (which see). With a fixed-shape `engine.step` the static engines
        of the target and the drafter are built here (kept on the models for the next session), with room for
        `engine.session_tokens` tokens in all; nothing runs until the first `append`. `rollback=False` skips
        keeping what a rollback needs (the target features a feature-level drafter read so far): for one-shot
        generation."""
        self.sampling = checked(sampling, SamplingConfig, "sampling")
        self.stopping = checked(stopping, StoppingConfig, "stopping")
        self.engine = checked(engine, EngineConfig, "engine")
        self._columns: int | None = None  # the fixed-shape caches' room, in tokens (None: eager, unbounded)
        if self.engine.step != "eager":
            target, drafter = static_engines(target, as_drafter(drafter), self.engine.step, 0,
                                             self.engine.session_tokens, as_tree_spec(tree).max_nodes)
            self._columns = self.engine.session_tokens
        self.target: Target = as_target(target)
        self.drafter: Drafter = as_drafter(drafter)
        self.target.check_request(self.drafter.feature_request)
        if self.drafter.vocab_size is not None and self.drafter.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"drafter: vocabulary size {self.drafter.vocab_size} does not match the target's "
                f"{self.target.vocab_size}; a draft model must share the target's tokenizer and output vocabulary")
        self.spec = as_tree_spec(tree)
        self.rule = resolve_rule(rule, self.sampling.do_sample)
        self.rule.check_target(self.target)
        self.target.check_request(self.rule.feature_request, who="rule")
        # what each verification pass returns: the drafter's features and the rule's (a judge's hidden states)
        self._score_request = self.drafter.feature_request | self.rule.feature_request
        self.generator = generator
        default_eos, default_pad = self.target.generation_defaults()
        stop = self.stopping
        self.eos = stop.eos_token_id if stop.eos_token_id is not None else default_eos
        pad = stop.pad_token_id
        if pad is None:  # as `generate`: the config's pad id, else the first EOS id
            pad = default_pad if default_pad is not None else (self.eos[0] if self.eos else 0)
        self.pad_token_id = pad
        self.stats = SpeculativeStats()
        self.tokens: list[list[int]] = []  # per original row: its real tokens so far (the root last)
        self.active: list[int] = []  # original rows still in the caches, in batch order
        self.roots: torch.Tensor | None = None  # [active rows] each row's last committed token
        self._prompt: Prompt | None = None
        self.can_rollback = bool(rollback)
        self._features: list[list[Features]] = []  # per row, when the drafter reads target features
        self._who = f"target ({type(self.target.user_model).__name__})"

    # ---- properties ------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self.roots is not None

    def _require_started(self, what: str) -> None:
        if not self.started:
            raise RuntimeError(f"{what}: append a prompt first")
        if not self.active:
            raise RuntimeError(f"{what}: every row has left the session")

    def _check_room(self, extra: int) -> None:
        max_pos = self.target.max_positions
        longest = max(len(self.tokens[r]) for r in self.active) if self.active else 0
        if max_pos is not None and longest + extra + self.spec.max_nodes > max_pos:
            raise ValueError(f"max_new_tokens: context ({longest}) + new tokens ({extra}) + draft nodes "
                             f"({self.spec.max_nodes}) exceed the target's max_position_embeddings ({max_pos})")
        if self._columns is not None and longest + extra > self._columns:
            raise ValueError(f"max_new_tokens: context ({longest}) + new tokens ({extra}) exceed the fixed-shape "
                             f"caches of this session (EngineConfig(session_tokens={self._columns})); build the "
                             "session with more")

    # ---- append -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def append(self, input_ids: torch.Tensor,  # [B, L] the prompt (left-padded); later [active rows, n]
               attention_mask: torch.Tensor | None = None,  # [B, L], the first call only
               **model_inputs) -> SpanScore | None:
        """The first call prefills a (left-padded) prompt with the model's inputs (`pixel_values`, ...); later
        calls append the same number of tokens [rows, n] to every active row (text written elsewhere),
        through one target pass and without a new prefill, and return the target's scores of the appended
        tokens (as `score`, without `next_logits`), which that pass computes anyway."""
        if not self.started:  # the API boundary: the prompt moves to the target's device
            self._prefill(Prompt.build(input_ids, attention_mask, **model_inputs).to(self.target.device))
            return None
        self._require_started("append")
        if attention_mask is not None or model_inputs:
            name = "attention_mask" if attention_mask is not None else sorted(model_inputs)[0]
            raise ValueError(f"{name}: only the first append (the prompt) takes it")
        tokens = input_ids[None] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 1 else input_ids
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"input_ids: expected a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dim() != 2 or tokens.shape[0] != len(self.active):
            raise ValueError(f"input_ids: expected [{len(self.active)}, n] tokens (one row per active row), got "
                             f"{tuple(tokens.shape)}")
        if tokens.shape[1] == 0:
            empty = tokens.new_zeros(tokens.shape, dtype=torch.float32)
            return SpanScore(empty, empty.clone())
        self._check_ids(tokens)
        t0 = time.perf_counter()
        tokens = tokens.long().to(self.target.device)
        n = tokens.shape[1]
        draft = DraftTree.chain(tokens[:, :-1])
        full = torch.cat([self.roots[:, None], draft.tokens], 1)
        scored = self.target.score(full, draft.full_parents(), draft.full_valid(), self.drafter.feature_request)
        check_logits_finite(scored.logits, self._who)
        a = len(self.active)
        path = torch.arange(n, device=full.device).expand(a, n)
        verdict = Verdict(tokens, torch.full((a,), n - 1, dtype=torch.long, device=full.device), path)
        self._commit(draft, verdict, full, scored, drafted_here=False)
        _sync(self.target.device)
        self.stats.prefill_s += time.perf_counter() - t0  # appended text is prefilled too (a conversation's turn)
        # the pass read the old root and tokens[:-1]: its n logits predict the n appended tokens
        return SpanScore.of(scored.logits[:, :n], tokens)

    def _check_ids(self, ids: torch.Tensor, vocab: int | None = None) -> None:
        vocab = vocab or self.target.vocab_size
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids: expected an integer tensor, got {ids.dtype}")
        if ids.numel() and (int(ids.max()) >= vocab or int(ids.min()) < 0):
            raise ValueError(f"input_ids: token ids must lie in [0, {vocab})")

    def _prefill(self, prompt: Prompt) -> None:
        self._check_ids(prompt.input_ids, self.target.prompt_vocab_size)
        self.target.check_prompt(prompt)
        t0 = time.perf_counter()
        request = self.drafter.feature_request
        if isinstance(self.spec, AdaptiveChain):
            self.spec.start()
        prefilled = self.target.prefill(prompt, request)
        self.drafter.start(prompt, prefilled.features)
        _sync(self.target.device)
        self.stats.prefill_s += time.perf_counter() - t0
        self._prompt = prompt
        self.roots = prefilled.roots
        mask = prompt.attention_mask.bool()
        self.tokens = [row[m].tolist() for row, m in zip(prompt.input_ids, mask)]
        self.active = list(range(prompt.batch_size))
        if not request.empty and self.can_rollback:
            lengths = mask.sum(dim=1).tolist()
            width = prompt.length - 1
            self._features = [[_row_features(prefilled.features, r, width - (n - 1), width)]
                              for r, n in enumerate(lengths)]

    # ---- generate -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, max_new_tokens: int, stop: Sequence[int | Sequence[int]] | None = None,
                 on_step: Callable[[DraftTree, Verdict, list[int]], None] | None = None) -> dict[int, list[int]]:
        """Generate up to `max_new_tokens` per active row, stopping a row after an EOS id or after any stop
        sequence: the session's (`stopping.stop`) and this call's `stop` (token ids, or lists of ids for
        multi-token delimiters). `on_step(draft, verdict, rows)` is called after each verification (default: the
        engine's `EngineConfig.on_step`). Returns each row's new tokens by original row index (the stop
        included)."""
        on_step = on_step if on_step is not None else self.engine.on_step
        check_max_new_tokens(max_new_tokens)
        self._require_started("generate")
        stops = [*self.stopping.stop, *stop_sequences(stop), *((e,) for e in self.eos)]
        self._check_room(max_new_tokens)
        new: dict[int, list[int]] = {row: [] for row in self.active}
        if max_new_tokens == 0:
            return new
        adaptive = self.spec if isinstance(self.spec, AdaptiveChain) else None
        pending = None  # an adaptive step waiting for its timings (read one step later: no wait on CUDA)
        device = self.target.device
        bar = tqdm(total=max_new_tokens * len(self.active), disable=not self.engine.progress, desc="speculative",
                   unit="tok")
        clock = StepClock(device)
        steps: list[StepStats] = []
        while True:
            clock.mark(new_step=True)
            # the step reads the device once (`read_step`); checks that would read it wait for that read
            with deferred_checks() as checks:
                spec = self.spec if adaptive is None else Chain(adaptive.choose(
                    list(self.active), room=[max_new_tokens - len(new[r]) for r in self.active]))
                # an adaptive step without drafts skips the drafter where it can catch up later in one pass (an
                # EAGLE head queues the committed tokens): a step of no drafts then costs what our plain step costs
                skipped = adaptive is not None and spec.k == 0 and self.drafter.supports_skipped_steps
                draft = (DraftTree.empty(len(self.active), device) if skipped else
                         self.drafter.propose(self.roots, spec, self.sampling, self.generator).trimmed())
                pad_widths = self.engine.pad_widths
                if pad_widths:  # verified nodes = the root + the draft's
                    draft = draft.padded(pad_widths.get(draft.num_nodes + 1, draft.num_nodes + 1) - 1)
                clock.mark()
                full = torch.cat([self.roots[:, None], draft.tokens.to(device)], dim=1)
                scored = self.target.score(full, draft.full_parents(), draft.full_valid(), self._score_request)
                check_logits_finite(scored.logits, self._who)
                verdict = self.rule.accept(draft, scored.logits, self.sampling, self.generator,
                                           features=scored.features)
            clock.mark()
            read = read_step(draft, verdict, checks, device)
            if adaptive is not None:
                if pending is not None:  # the previous step's work is done: its timings are read without a wait
                    draft_s, verify_s, commit_s = clock.step_phases(-2)
                    rows, k, accepted, promised = pending
                    adaptive.observe(rows, k, accepted, verify_s=verify_s, draft_s=draft_s, other_s=commit_s,
                                     promised=promised)
                pending = (list(self.active), spec.k, list(read.num_accepted), adaptive.promise)
            if on_step is not None:
                on_step(draft, verdict, list(self.active))
            emitted, done, reach = self._emit(read, new, max_new_tokens, stops)
            drafted, accepted = read.countable(reach)  # before the cut: a kept draft was accepted
            verdict = _cut(verdict, [len(t) for t in emitted], read.num_accepted)
            self._commit(draft, verdict, full, scored, drafted_here=not skipped, emitted=emitted)
            committed = sum(len(t) for t in emitted)
            if all(done):
                finished = []
            else:
                finished = [i for i, d in enumerate(done) if d]
            if finished:
                self._retire(finished)
            clock.mark()
            steps.append(StepStats(rows=len(emitted), drafted=drafted, accepted=accepted, committed=committed,
                                   draft_s=0.0, verify_s=0.0, commit_s=0.0))
            bar.update(committed)
            if all(done):
                break
        bar.close()
        for step, (draft_s, verify_s, commit_s) in zip(steps, clock.phases()):
            step.draft_s, step.verify_s, step.commit_s = draft_s, verify_s, commit_s
        self.stats.steps.extend(steps)
        return new

    def _emit(self, read, new: dict[int, list[int]], max_new_tokens: int, stops) -> tuple[list, list, list]:
        """Each active row's emitted tokens, cut after a stop or at its budget (appended to `new`); whether the
        row is done; how far its draft could have counted (`reach`: the cut, else the room it had)."""
        emitted, done, reach = [], [], []
        for row, toks, n_acc in zip(self.active, read.tokens, read.num_accepted):
            room = max_new_tokens - len(new[row])
            toks = toks[: min(n_acc + 1, room)]
            cut = _first_stop(new[row], toks, stops)
            if cut is not None:
                toks = toks[:cut]
            reach.append(len(toks) if cut is not None else room)
            emitted.append(toks)
            new[row].extend(toks)
            done.append(cut is not None or len(new[row]) >= max_new_tokens)
        return emitted, done, reach

    def _commit(self, draft: DraftTree, verdict: Verdict, full: torch.Tensor, scored, drafted_here: bool,
                emitted: list[list[int]] | None = None) -> None:
        """Commit the verdict's path in the target and the drafter; its last token becomes the new root.
        `emitted`: each row's committed tokens, when the host has read them already (`verdict.host_counts`
        is then set: the engines commit without reading the device)."""
        if self.drafter.observes_target:  # the drafter learns from the target's verdict on every node
            self.drafter.observe(full, scored.logits, draft.full_valid())
        if verdict.host_counts is not None and self.target.accepts_host_counts:
            self.target.commit(verdict.path, counts=verdict.host_counts)
        else:
            self.target.commit(verdict.path)
        if not drafted_here:
            if not self.drafter.supports_skipped_steps:
                raise TypeError(f"drafter: {type(self.drafter).__name__} cannot take text it did not draft "
                                "(supports_skipped_steps); use another drafter for sessions that append")
            self.drafter.skip(self.roots)
        self.drafter.commit(draft, verdict, features=scored.features)
        self.roots = verdict.tokens.gather(1, verdict.num_accepted[:, None].to(verdict.tokens.device))[:, 0]
        self.roots = self.roots.to(self.target.device)
        if emitted is None:
            counts = (verdict.num_accepted + 1).tolist()
            emitted = [toks[:c] for toks, c in zip(verdict.tokens.tolist(), counts)]
        for i, (row, toks) in enumerate(zip(self.active, emitted)):
            c = len(toks)
            self.tokens[row].extend(toks)
            if self._features:
                kept = verdict.path[i: i + 1, :c]  # the root and the accepted nodes: now fed and committed
                self._features[row].append(scored.features.select(torch.tensor([i], device=kept.device)).gather(kept))

    def _retire(self, positions: list[int]) -> None:
        """Drop the rows at these batch positions (they stopped while others go on)."""
        keep = [i for i in range(len(self.active)) if i not in set(positions)]
        index = torch.tensor(keep, dtype=torch.long, device=self.target.device)
        self.active = [self.active[i] for i in keep]
        if keep:
            self.target.select(index)
            self.drafter.select(index)
            self.roots = self.roots[index.to(self.roots.device)]

    # ---- score --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, tokens: torch.Tensor) -> SpanScore:  # tokens: [active rows, m] int64
        """The target's log-probabilities of a candidate span [rows, m] after each row's text, and its logits
        after the span, in one pass; nothing is committed."""
        self._require_started("score")
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        if tokens.dim() != 2 or tokens.shape[0] != len(self.active) or tokens.shape[1] == 0:
            raise ValueError(f"tokens: expected [{len(self.active)}, m>0], got {tuple(tokens.shape)}")
        self._check_ids(tokens)
        tokens = tokens.long().to(self.target.device)
        draft = DraftTree.chain(tokens)
        full = torch.cat([self.roots[:, None], tokens], 1)
        logits = self.target.score(full, draft.full_parents(), draft.full_valid()).logits
        self.target.discard()
        check_logits_finite(logits, self._who)
        return SpanScore.of(logits[:, :-1], tokens, logits[:, -1])

    # ---- checkpoints --------------------------------------------------------------------------------------
    def checkpoint(self) -> Checkpoint:
        """A mark to `rollback` to (valid while no row leaves the session)."""
        self._require_started("checkpoint")
        if not self.can_rollback:
            raise RuntimeError("checkpoint: this session was created with rollback=False")
        return Checkpoint(tuple(self.active), tuple(len(self.tokens[r]) for r in self.active), self.roots.clone(),
                          self.target.checkpoint())

    @torch.no_grad()
    def rollback(self, mark: Checkpoint) -> None:
        """Forget everything after `mark`: the target's cache shrinks to it; the drafter starts again on the
        text as it was (with the target features it read, for feature-level drafters)."""
        if not isinstance(mark, Checkpoint):
            raise TypeError(f"mark: expected a Checkpoint, got {type(mark).__name__}")
        if tuple(self.active) != mark.rows:
            raise ValueError("mark: rows left the session since this checkpoint; it no longer applies")
        self.target.rollback(mark.target_state)
        for row, n in zip(self.active, mark.lengths):
            del self.tokens[row][n:]
        self.roots = mark.roots.clone()
        prompt = self._current_prompt()
        features = None
        if self._features:
            for r in self.active:  # every fed token up to the mark, as one chunk per row
                self._features[r] = [_joined_features(self._features[r], len(self.tokens[r]) - 1)]
            features = _left_padded([self._features[r][0] for r in self.active], prompt.length - 1)
        self.drafter.start(prompt, features)

    def _current_prompt(self) -> Prompt:
        """The active rows' text as one left-padded prompt, with the first prompt's model inputs (per-token
        inputs such as `mm_token_type_ids` extended with the text's type)."""
        rows = [self.tokens[r] for r in self.active]
        width = max(len(t) for t in rows)
        # laid out on the host (one copy to the prompt's device at the end, not one per row)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long, device="cpu")
        mask = torch.zeros(len(rows), width, dtype=torch.long, device="cpu")
        for i, t in enumerate(rows):
            ids[i, width - len(t):] = torch.tensor(t, dtype=torch.long, device="cpu")
            mask[i, width - len(t):] = 1
        inputs = {}
        first = self._prompt
        per_token, appended = self.target.per_token_inputs, self.target.appended_token_type
        for name, value in first.inputs.items():
            if name in per_token:  # one value per token (e.g. mm_token_type_ids): appended text's type is the
                # target's `appended_token_type` (0; a prefix LM's generated suffix: 1)
                laid = torch.full((len(rows), width), appended, dtype=value.dtype, device="cpu")
                for i, r in enumerate(self.active):
                    real = value[r][first.attention_mask[r].bool()].cpu()
                    laid[i, width - len(rows[i]): width - len(rows[i]) + len(real)] = real
                value = laid.to(value.device)
            inputs[name] = value
        return Prompt(ids.to(first.input_ids.device), mask.to(first.input_ids.device), inputs)


def _first_stop(before: list[int], toks: list[int], stops: list[tuple[int, ...]]) -> int | None:
    """How many of `toks` to keep so that the text ends with a stop sequence (None: no stop inside)."""
    text = before + toks
    for j in range(len(toks)):
        end = len(before) + j + 1
        for s in stops:
            if end >= len(s) and tuple(text[end - len(s): end]) == s:
                return j + 1
    return None


def _cut(verdict: Verdict, keep: list[int], num_accepted: list[int]) -> Verdict:
    """The verdict shortened to `keep[b]` emitted tokens per row (a stop or the budget inside it), with the
    host's counts (`num_accepted`: as read with the step)."""
    if all(k == n + 1 for k, n in zip(keep, num_accepted)):
        return replace(verdict, host_counts=tuple(keep))
    keep_t = torch.tensor(keep, dtype=torch.long, device=verdict.path.device)
    idx = torch.arange(verdict.path.shape[1], device=verdict.path.device)[None]
    path = torch.where(idx < keep_t[:, None], verdict.path, -1)
    return Verdict(verdict.tokens, (keep_t - 1).clamp(min=0).to(verdict.num_accepted.device), path,
                   host_counts=tuple(keep))


def _row_features(features: Features, row: int, start: int, end: int) -> Features:
    def part(t: torch.Tensor) -> torch.Tensor:
        return t[row: row + 1, start:end]

    return Features(None if features.hidden is None else part(features.hidden),
                    {i: part(t) for i, t in features.layers.items()})


def _joined_features(chunks: list[Features], n: int) -> Features:
    """One row's feature chunks joined along positions, the first `n` kept."""
    hidden = [c.hidden for c in chunks if c.hidden is not None]
    return Features(torch.cat(hidden, 1)[:, :n] if hidden else None,
                    {i: torch.cat([c.layers[i] for c in chunks], 1)[:, :n] for i in chunks[0].layers})


def _left_padded(rows: list[Features], width: int) -> Features:
    """Rows of [1, n_r, H] features placed right-aligned in [B, width, H] (zeros before)."""
    def stack(parts: list[torch.Tensor]) -> torch.Tensor:
        out = parts[0].new_zeros(len(parts), width, parts[0].shape[-1])
        for i, p in enumerate(parts):
            if p.shape[1]:
                out[i, width - p.shape[1]:] = p[0]
        return out

    hidden = None if rows[0].hidden is None else stack([r.hidden for r in rows])
    return Features(hidden, {i: stack([r.layers[i] for r in rows]) for i in rows[0].layers})
