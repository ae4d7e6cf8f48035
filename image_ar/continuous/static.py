"""The continuous loop's fixed-shape step: `generate_continuous(step="static" | "compiled")`.

The eager loop (`multispec.continuous.continuous_generate` over `targets.PatchARTarget` and a drafter) keeps
Python ints for the caches' lengths, shortens the last chain, and runs the residual's proposals in batches
until one is kept: each a shape or a branch read from the device. Here one function of tensors runs a whole
step, drafting, scoring, judging and committing, on buffers of fixed addresses:

- the caches' lengths, the root (the last committed trajectory) and an EAGLE draft's next condition are device
  tensors the step reads and advances; positions go to the layers as tensors (`patch_ar.run_layers_at`), so one
  captured graph serves every step of a generation;
- every chain has k drafts (the last step's extra ones are cut by the host, which changes no emitted token's
  law: a prefix of an exact chain is exact);
- the rule's `accept_fixed` draws every residual proposal of a row at once (`TrajectoryRatio.fixed_tries`) and
  keeps the first kept one, `residual`'s law, and every row computes its fallback draw;
- the rows in lockstep keep the shortest accepted run plus one, decided on the device.

The caller's generator draws every random number before the step, in the eager loop's order for the drafts and
their coins (a test compares the two on one step), so the step itself is deterministic: on CUDA it is captured
once in a CUDA graph and replayed ("static"), or run under `torch.compile(fullgraph=True)` ("compiled"). The host
reads the device once a step: the accepted counts, the fallbacks and the committed count in one tensor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from multispec.plugin import ContinuousOutput, SpeculativeStats, StepStats, capture_graph, uniform

from .drafters import PatchEagle
from .head_sampler import HeadConditions, HeadSampler
from .patch_ar import PatchAR, run_layers_at
from .runner import Runner
from .trajectory import TrajectoryDraft, TrajectoryNodes
from .trajectory_ratio import TrajectoryRatio


@dataclass
class StaticResult:
    """`StaticContinuous.generate`'s result: the loop's output and the readouts (x̂0) of the new tokens."""

    output: ContinuousOutput
    readouts: torch.Tensor  # [B, n, D]
    steps: int  # fixed-shape steps run


class StaticContinuous:
    """A `PatchAR` target with its drafter (a smaller `PatchAR` with its own head, or a `PatchEagle` on the
    target's head) at fixed shapes (see the module docstring). `compile`: run the step under
    `torch.compile(fullgraph=True)` (True, or a backend's name); `cuda_graphs` (default: on CUDA): capture it once
    and replay."""

    def __init__(self, target: PatchAR, labels: torch.Tensor, sampler: HeadSampler, draft: PatchAR | PatchEagle,
                 draft_sampler: HeadSampler, k: int, rule: TrajectoryRatio, *, compile: bool | str = False,
                 cuda_graphs: bool | None = None):
        if not isinstance(rule, TrajectoryRatio):
            raise TypeError(f"rule: the static step runs a TrajectoryRatio, got {type(rule).__name__}")
        self.device = target.pos.device
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs: the model is not on a CUDA device")
        self.target, self.draft, self.k, self.rule = target, draft, k, rule
        self.p, self.q = sampler, draft_sampler
        self.eagle = isinstance(draft, PatchEagle)
        extra = k + 2  # a chain (or the EAGLE pairs) overhanging the image's last position
        self.runner = Runner(target, labels, sampler)
        self.runner.cache = target.new_cache(len(self.runner.labels), extra=extra)
        if self.eagle:
            self.draft_cache = draft.new_cache(len(self.runner.labels), extra=extra)
        else:
            self.draft_runner = Runner(draft, labels, draft_sampler)
            self.draft_runner.cache = draft.new_cache(len(self.runner.labels), extra=extra)
        self.batch = len(labels)
        long = dict(dtype=torch.long, device=self.device)
        self.target_len, self.draft_len = torch.zeros((), **long), torch.zeros((), **long)
        self.made, self.budget = torch.zeros((), **long), torch.zeros((), **long)  # new tokens: made, asked
        self.root = self.z_root = None
        self.tv_sum, self.judged = torch.zeros((), device=self.device), torch.zeros((), **long)
        self._graph = None
        self._step = self.fixed_step
        if compile is not False:
            backend = {} if compile is True else {"backend": compile}
            self._step = torch.compile(self.fixed_step, fullgraph=True, dynamic=False, **backend)

    # ---- the eager prefill --------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, values: torch.Tensor, max_new_tokens: int) -> None:
        """Set up the caches after the committed trajectories `values` [B, m, S*D] (m >= 1)."""
        features = self.runner.start(values[:, :-1])
        self.target_len.fill_(self.runner.cache.length)
        if self.eagle:  # the pairs (z_j, x_j) of the prefilled tokens; the last output is the first draft's z
            self.draft_cache.length = 0
            z = self.draft(features, self.runner.tokens(values), self.draft_cache)
            self.z_root = z[:, -1].contiguous()
            self.draft_len.fill_(values.shape[1])
        else:
            self.draft_runner.start(values[:, :-1])
            self.draft_len.fill_(self.draft_runner.cache.length)
        self.root = values[:, -1].clone()
        self.tv_sum.zero_()
        self.judged.zero_()
        self.made.zero_()
        self.budget.fill_(max_new_tokens)

    # ---- the step's draws (outside the graph, from the caller's generator) -------------------------------
    def draw(self, generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        """The step's random numbers, the drafts' noise and coins first, in the eager loop's order."""
        b, k = self.batch, self.k
        drafts = torch.stack([self.q.noise(b, generator) for _ in range(k)])
        u_accept = uniform((b, k), generator, self.device)
        tries = self.rule.fixed_tries
        proposals = self.p.noise(b * tries, generator)
        u_proposals = uniform((b, tries), generator, self.device)
        fallback = self.p.noise(b, generator)
        return drafts, u_accept, proposals, u_proposals, fallback

    # ---- the fixed-shape step -------------------------------------------------------------------------
    def _propose(self, noise: torch.Tensor) -> TrajectoryDraft:
        """k draft trajectories after the root (their noise: `noise` [k, B, S, D])."""
        b, k, q = self.batch, self.k, self.q
        payloads, means, logq, conds = [], [], [], []
        z = self.z_root
        previous = self.root[:, None]
        for j in range(k):
            if self.eagle:
                cond = self.runner.conditions(z)
            else:
                pos = (self.draft_len + j)[None]
                tokens = self.draft_runner.tokens(previous)
                cond = self.draft_runner.conditions(run_layers_at(self.draft, self.draft.inputs_at(tokens, pos),
                                                                  self.draft_runner.cache, pos))
            states, mean = q.sample(cond, noise[j])
            payloads.append(states.reshape(b, 1, -1))
            means.append(mean)
            logq.append(q.log_density(states, mean))
            conds.append(cond)
            previous = payloads[-1]
            if self.eagle and j + 1 < k:
                pos = (self.draft_len + j)[None]
                z = self.draft.forward_at(z[:, None], self.runner.tokens(previous), self.draft_cache, pos)[:, 0]
        if self.rule.bonus and not self.eagle:  # a bonus keeps k + 1: the last draft must be in the cache
            pos = (self.draft_len + k)[None]
            run_layers_at(self.draft, self.draft.inputs_at(self.draft_runner.tokens(previous), pos),
                          self.draft_runner.cache, pos)
        stack = lambda ts: torch.stack(ts, 1).flatten(0, 1)  # noqa: E731
        conditions = HeadConditions(stack([c.cond for c in conds]),
                                    None if conds[0].uncond is None else stack([c.uncond for c in conds]),
                                    conds[0].scale)
        return TrajectoryDraft(torch.cat(payloads, 1), torch.stack(logq, 1), TrajectoryNodes(q, conditions, (b, k)),
                               torch.stack(means, 1))

    def fixed_step(self, drafts, u_accept, proposals, u_proposals, fallback):
        """One speculative step of fixed shapes: (payload [B, k + 1, S*D], readouts [B, k + 1, D], counts [B + 2]:
        each row's accepted drafts, the fallbacks, the committed count n)."""
        b, k = self.batch, self.k
        draft = self._propose(drafts)
        chain = torch.cat([self.root[:, None], draft.payload], 1)
        positions = self.target_len + torch.arange(k + 1, device=self.device)
        z = run_layers_at(self.target, self.target.inputs_at(self.runner.tokens(chain), positions),
                          self.runner.cache, positions)
        nodes = TrajectoryNodes(self.p, self.runner.conditions(z), (b, k + 1))
        reach = (self.budget - self.made).clamp(max=k)  # the drafts that can still be emitted
        verdict = self.rule.accept_fixed(draft, nodes, u_accept, proposals, u_proposals, fallback, reach)
        n = verdict.num_accepted.min()
        kept = n + 1 if self.rule.bonus else n + (n < k).long()
        # the readout (x̂0) of every node's emitted token; the host keeps the first `kept`
        readouts = self.p.readout(nodes.conditions, verdict.payload[..., -self.p.dim:].reshape(b * (k + 1), -1))
        last = (kept - 1).view(1)
        self.root.copy_(verdict.payload.index_select(1, last)[:, 0])
        if self.eagle:  # the pairs (z_t, x_t) of the committed tokens; the last one's output drafts next
            pairs = self.draft.forward_at(z, self.runner.tokens(verdict.payload), self.draft_cache,
                                          self.draft_len + torch.arange(k + 1, device=self.device))
            self.z_root.copy_(pairs.index_select(1, last)[:, 0])
        self.target_len.add_(kept)
        self.draft_len.add_(kept)
        self.made.add_(kept)
        self.tv_sum.add_(verdict.tv_sum)
        self.judged.add_(verdict.judged)
        counts = torch.cat([verdict.num_accepted, verdict.fallbacks.view(1), kept.view(1)])
        return verdict.payload, readouts.view(b, k + 1, -1), counts

    def run_step(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The step on `inputs` (`draw`'s): replayed from its CUDA graph when captured (the graph's output
        buffers: the caller copies what it keeps before the next step)."""
        if not self.cuda_graphs:
            return self._step(*inputs)
        if self._graph is None:
            return self.capture(inputs)
        for static, new in zip(self._graph.inputs, inputs):
            static.copy_(new)
        self._graph.graph.replay()
        return self._graph.outputs

    def capture(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Capture the step. The capture's warm-up runs advance what the step advances (the lengths, the root,
        the accounts; the caches only past the lengths, which later steps overwrite before reading), so that
        state is saved first and put back before the replay whose outputs this call returns."""
        state = [self.target_len, self.draft_len, self.made, self.tv_sum, self.judged, self.root]
        state += [self.z_root] if self.eagle else []
        saved = [t.clone() for t in state]
        self._graph = capture_graph(self._step, inputs, self.device)
        for t, s in zip(state, saved):
            t.copy_(s)
        self._graph.graph.replay()
        return self._graph.outputs

    # ---- the loop ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, values: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None
                 ) -> StaticResult:
        """`max_new_tokens` trajectories after `values` [B, m, S*D] (see `continuous_generate`)."""
        stats = SpeculativeStats()
        t0 = time.perf_counter()
        self.prefill(values, max_new_tokens)
        stats.prefill_s = time.perf_counter() - t0
        out, reads = [values], []
        made, fallbacks, steps, b = 0, 0, 0, self.batch
        while made < max_new_tokens:
            t0 = time.perf_counter()
            reach = min(self.k, max_new_tokens - made)
            payload, readouts, counts = self.run_step(self.draw(generator))
            read = counts.tolist()  # the step's one read
            t1 = time.perf_counter()
            kept, accepted = read[-1], read[:b]
            out.append(payload[:, :kept].clone())
            reads.append(readouts[:, :kept].clone())
            fallbacks += read[b]
            stats.steps.append(StepStats(rows=b, drafted=b * reach, accepted=sum(min(a, reach) for a in accepted),
                                         committed=b * min(kept, max_new_tokens - made), draft_s=0.0,
                                         verify_s=t1 - t0, commit_s=time.perf_counter() - t1))
            made += kept
            steps += 1
        n = values.shape[1] + max_new_tokens
        tv_sum, judged = torch.stack([self.tv_sum, self.judged.float()]).tolist()  # the generation's last read
        output = ContinuousOutput(torch.cat(out, 1)[:, :n], stats, fallbacks, tv_sum=tv_sum, judged=round(judged))
        return StaticResult(output, torch.cat(reads, 1)[:, :max_new_tokens], steps)


__all__ = ["StaticContinuous", "StaticResult"]
