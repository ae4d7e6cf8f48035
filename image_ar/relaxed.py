"""LANTERN's relaxed acceptance for image-token drafts (lossy, with a stated bound).

Visual AR models spread their mass over many interchangeable codes, so exact verification rejects drafts
that would look the same. `Relaxed` verifies a drafted code x against a relaxed target p~ that moves onto
x the mass of A(x): the longest prefix n_1..n_J of x's latent neighbourhood B_k(x) (its k nearest codes in
the VQ codebook, nearest first) whose cumulative mass c_J = p(n_1) + ... + p(n_J) fits the budget:

    LANTERN   (delta):  c_J <= delta - (mass already moved at this position)
    LANTERN++ (lam):    c_J <= (lam - 1) * p(x)            (so p~(x) <= lam * p(x))

p~(x) = p(x) + c_J, p~(n_i) = 0 for i <= J, p~ = p elsewhere; TV(p, p~) = c_J. Then it is ordinary
speculative sampling against p~: accept x iff u * q(x) < p~(x) (q one-hot for deterministic drafts);
on rejection the residual is norm(max(p~ - q, 0)), so exactly the merged mass leaves with x (LANTERN's
reference code zeroes the first k+1 neighbours instead, whatever J was, and renormalises to a uniform
distribution when nothing is left: this rule does neither; an empty residual falls back to p, as the
core's kernels do). Trees are walked sibling by sibling as in `Exact`; the siblings at one position share
the delta budget (each sibling's c_J is charged against what the earlier ones used), so the bound holds
per position, not per sibling.

Bound: for deterministic drafts (q one-hot; EAGLE-2 dynamic trees, greedy chains) the emitted token's
distribution at a position is p with each tried sibling's A(x) merged onto it, and its total variation
from p is at most the reported value <= delta. `RelaxedVerdict.tvd` reports, per emitted token, the mass
the rule moved at that position (summed over the siblings tried there). With sampled drafts the rule
verifies each sibling against a p~ within that distance of the distribution it would otherwise use.
With delta = 0 (or lam = 1) nothing moves and the rule is `Exact` token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multispec.plugin import (AcceptanceRule, DraftTree, Features, SamplingConfig, Verdict, argmax_ref, backend_for,
                              check_logits, exponential, full_tree_tokens, nan_safe_argmax, sample_ref, uniform,
                              walk_tree)

from .neighbourhood import check_table, latent_neighbours, neighbour_mass, neighbour_mass_ref

# below this many rows, walking each row on its own (a few tensor ops per sibling try) is faster than the
# lockstep walk over all rows (a few dozen ops per try); both give the same tokens (tested)
BATCHED_FROM = 16


@dataclass
class RelaxedVerdict(Verdict):
    """A `Verdict` plus `tvd[b, i]`: the target mass the relaxation moved at emitted token i (the accepted
    drafts, then the correction or bonus token); 0 where nothing moved, and for padding."""

    tvd: torch.Tensor | None = None  # [B, D + 1] float32


class Relaxed(AcceptanceRule):
    """LANTERN (`delta`) or LANTERN++ (`lam`) relaxed acceptance over latent neighbourhoods.

    Args:
        neighbours: [V, >= k] int table of each code's nearest other codes, nearest first
            (`latent_neighbours`, or `Relaxed.from_codebook`).
        delta: the per-position total-variation budget, in [0, 1] (LANTERN; the papers use 0.1-0.4).
        lam: the multiplicative cap p~(x) <= lam * p(x), lam >= 1 (LANTERN++; the papers use 5-20).
        k: use the first k columns of `neighbours` (default: all).
    """

    lossless = False

    def __init__(self, neighbours: torch.Tensor, delta: float | None = None, lam: float | None = None,
                 k: int | None = None, backend: str | None = None):
        if (delta is None) == (lam is None):
            raise ValueError("delta/lam: give exactly one (delta: LANTERN's TVD budget; lam: LANTERN++'s cap)")
        if delta is not None and (isinstance(delta, bool) or not 0.0 <= float(delta) <= 1.0):
            raise ValueError(f"delta: expected a number in [0, 1], got {delta!r}")
        if lam is not None and (isinstance(lam, bool) or not float(lam) >= 1.0):
            raise ValueError(f"lam: expected a number >= 1, got {lam!r}")
        table = check_table(neighbours)
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= table.shape[1]:
                raise ValueError(f"k: expected an int in [0, {table.shape[1]}] (the table's columns), got {k!r}")
            table = table[:, :k]
        self.neighbours = table.long().contiguous()
        self.delta = None if delta is None else float(delta)
        self.lam = None if lam is None else float(lam)
        self.backend = backend

    @classmethod
    def from_codebook(cls, latents: torch.Tensor, k: int, **kwargs) -> "Relaxed":
        """Neighbourhoods from codebook vectors [V, D] (e.g. `VQVAE.codebook_latents()`, or a Janus model's
        `model.model.vqmodel.quantize.embedding.weight`)."""
        return cls(latent_neighbours(latents, k), **kwargs)

    def __repr__(self) -> str:
        bound = f"delta={self.delta}" if self.delta is not None else f"lam={self.lam}"
        return f"Relaxed({bound}, k={self.neighbours.shape[1]})"

    # ---- pieces ------------------------------------------------------------------------------------------
    def _budget(self, used: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
        if self.delta is not None:
            return (self.delta - used).clamp(min=0.0)
        return (self.lam - 1.0) * px

    def _merged(self, base: torch.Tensor, x: torch.Tensor, count: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
        """p~: `base` [R, V] with the first `count` neighbours of x zeroed and their `mass` added to x."""
        table = self.neighbours if self.neighbours.device == base.device else self.neighbours.to(base.device)
        k = table.shape[1]
        out = base.clone()
        if k:
            nb = table[x]  # [R, k]
            merged = torch.arange(k, device=base.device)[None, :] < count[:, None]
            out.scatter_(1, nb, torch.where(merged, 0.0, out.gather(1, nb)))
        rows = torch.arange(len(x), device=base.device)
        out[rows, x] = base[rows, x] + mass
        return out

    def _residual_source(self, base: torch.Tensor, x: torch.Tensor, count: torch.Tensor,
                         mass: torch.Tensor) -> torch.Tensor:
        """The distribution a rejected sibling's q is subtracted from: the relaxed p~ itself (the tests swap
        in the reference code's choice and show that it leaves the analytic output distribution)."""
        return self._merged(base, x, count, mass)

    def _aggregate(self, base: torch.Tensor, x: torch.Tensor, budget: torch.Tensor):
        if self.neighbours.device != base.device:
            self.neighbours = self.neighbours.to(base.device)
        if backend_for(base, self.backend) == "torch":  # the reference, without the public wrapper's checks
            return neighbour_mass_ref(base, x, self.neighbours, budget)
        return neighbour_mass(base, x, self.neighbours, budget, backend=self.backend)

    # ---- the rule ----------------------------------------------------------------------------------------
    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None, features: Features | None = None) -> RelaxedVerdict:
        check_logits(draft, target_logits)
        b, t, v = target_logits.shape
        if self.neighbours.shape[0] != v:
            raise ValueError(f"neighbours: a table for {self.neighbours.shape[0]} codes, the target scores {v}")
        if draft.draft_probs is not None and draft.draft_probs.shape[-1] != v:
            raise ValueError(f"draft_probs: vocabulary {draft.draft_probs.shape[-1]} does not match the target's {v}")
        fc, ns = draft.linked()
        tokens = full_tree_tokens(draft)
        if not sampling.do_sample:
            return self._greedy_walk(tokens, fc, ns, sampling.process(target_logits))
        p = sampling.probs(target_logits)
        device = p.device
        uniforms = uniform((b, t), generator, device)  # drawn as `Exact` draws them: delta = 0 reproduces it
        noise = exponential((b, v), generator, device)
        q = None
        if draft.draft_probs is not None:
            q = torch.cat([torch.zeros(b, 1, v, device=device), draft.draft_probs.float().to(device)], dim=1)
        walk = self._random_walk if b >= BATCHED_FROM else self._row_walk
        return walk(tokens, fc, ns, p, q, uniforms, noise)

    def _random_walk(self, tokens, fc, ns, p_all, q_all, u_all, noise) -> RelaxedVerdict:
        """Every row in lockstep, one sibling try per iteration: the core's walk (`walk_tree`, as `Exact`'s
        batched walk) with the relaxation in its sibling test."""
        b, t, v = p_all.shape
        dev = p_all.device
        p_all = torch.nan_to_num(p_all.float(), nan=0.0)
        tvd = torch.zeros(b, t, device=dev)
        r, scale = p_all[:, 0].clone(), torch.ones(b, device=dev)  # the running residual is r / scale
        used = torch.zeros(b, device=dev)  # mass moved at the current position so far

        def accept(walk, c, x, trying):
            nonlocal used
            rows = walk.rows
            inb = trying & (x >= 0) & (x < v)
            xs = x.clamp(0, v - 1)
            if q_all is None:
                q = torch.zeros(b, v, device=dev)
                q[rows[inb], xs[inb]] = 1.0
            else:
                q = q_all[rows, c]
            base = r / scale[:, None]
            px = base[rows, xs]
            mass, count = self._aggregate(base, xs, self._budget(used, px))
            mass = torch.where(inb, mass, 0.0)
            count = torch.where(inb, count, 0)
            ok = inb & (u_all[rows, c] * torch.where(inb, q[rows, xs], 0.0) < px + mass)
            rejected = trying & ~ok
            if bool(rejected.any()):
                src = self._residual_source(base[rejected], xs[rejected], count[rejected], mass[rejected])
                new_r = (src - q[rejected]).clamp(min=0.0)
                total = new_r.double().sum(dim=-1).float()
                r[rejected], scale[rejected] = new_r, torch.where(total > 0, total, torch.ones_like(total))
                used = torch.where(rejected, used + mass, used)
            if bool(ok.any()):
                tvd[rows[ok], walk.acc[ok]] = used[ok] + mass[ok]
                r[ok] = p_all[rows[ok], c[ok]]
                scale[ok] = 1.0
                used = torch.where(ok, 0.0, used)
            return ok

        walk = walk_tree(tokens, fc, ns, accept)
        rows = walk.rows
        walk.out[rows, walk.acc] = sample_ref(r, p_all[rows, walk.cur], noise)
        tvd[rows, walk.acc] = used
        return RelaxedVerdict(walk.out, walk.acc, walk.path, tvd)

    def _row_walk(self, tokens, fc, ns, p_all, q_all, u_all, noise) -> RelaxedVerdict:
        """The same walk one row at a time (the same fp32 operations on [1, V] slices, so the same tokens)."""
        b, t, v = p_all.shape
        dev = p_all.device
        p_all = torch.nan_to_num(p_all.float(), nan=0.0)
        out = torch.full((b, t), -1, dtype=torch.long, device=dev)
        path = torch.full((b, t), -1, dtype=torch.long, device=dev)
        path[:, 0] = 0
        tvd = torch.zeros(b, t, device=dev)
        acc = torch.zeros(b, dtype=torch.long, device=dev)
        tok, first, nxt = tokens.tolist(), fc.tolist(), ns.tolist()
        one = torch.ones(1, device=dev)
        for row in range(b):
            cur, a = 0, 0
            r, scale, used = p_all[row, :1], one, torch.zeros(1, device=dev)
            child = first[row][0]
            while child != -1:
                x = tok[row][child]
                if not 0 <= x < v:  # an out-of-vocabulary draft: rejected, nothing merged
                    child = nxt[row][child]
                    continue
                xs = torch.tensor([x], device=dev)
                if q_all is None:
                    q = torch.zeros(1, v, device=dev)
                    q[0, x] = 1.0
                else:
                    q = q_all[row, child][None]
                base = r / scale[:, None]
                px = base[:, x]
                mass, count = self._aggregate(base, xs, self._budget(used, px))
                if bool(u_all[row, child] * q[0, x] < px + mass):
                    tvd[row, a] = used + mass
                    out[row, a] = x
                    a += 1
                    path[row, a] = child
                    cur = child
                    r, scale, used = p_all[row, child][None], one, torch.zeros(1, device=dev)
                    child = first[row][child]
                    continue
                new_r = (self._residual_source(base, xs, count, mass) - q).clamp(min=0.0)
                total = new_r.double().sum(dim=-1).float()
                r, scale = new_r, torch.where(total > 0, total, torch.ones_like(total))
                used = used + mass
                child = nxt[row][child]
            out[row, a] = sample_ref(r, p_all[row, cur][None], noise[row][None])[0]
            tvd[row, a] = used[0]
            acc[row] = a
        return RelaxedVerdict(out, acc, path, tvd)

    def _greedy_walk(self, tokens, fc, ns, logits) -> RelaxedVerdict:
        """Temperature 0: accept a sibling iff it is the argmax of its own p~ (with nothing merged, iff it is
        the target's argmax, as `Greedy`); the correction is the target's argmax."""
        b, t, v = logits.shape
        dev = logits.device
        p_all = torch.softmax(torch.nan_to_num(logits.float(), nan=float("-inf")), dim=-1)
        p_all = torch.nan_to_num(p_all, nan=0.0)
        argmax = nan_safe_argmax(logits)
        tvd = torch.zeros(b, t, device=dev)

        def accept(walk, c, x, trying):
            rows, cur = walk.rows, walk.cur
            inb = trying & (x >= 0) & (x < v)
            xs = x.clamp(0, v - 1)
            base = p_all[rows, cur]
            mass, count = self._aggregate(base, xs, self._budget(torch.zeros(b, device=dev), base[rows, xs]))
            relaxed_top = argmax_ref(self._merged(base, xs, count, mass))
            ok = inb & torch.where(count > 0, relaxed_top == xs, xs == argmax[rows, cur])
            tvd[rows[ok], walk.acc[ok]] = mass[ok]
            return ok

        walk = walk_tree(tokens, fc, ns, accept)
        walk.out[walk.rows, walk.acc] = argmax[walk.rows, walk.cur]
        return RelaxedVerdict(walk.out, walk.acc, walk.path, tvd)
