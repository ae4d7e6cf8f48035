"""Speculation that adapts to load: each step's chain length, zero included, chosen for tokens per second.

A chain of k drafts at batch B yields, for a row whose drafted tokens are each accepted with probability a (after
their predecessors were), 1 + a + ... + a^k tokens in expectation, and costs a verification of B rows of k + 1
nodes, k draft steps and the step's own overhead. When B grows, the verification of the drafts costs more while
what a row gains stays the same, so the best k falls, to 0 (plain steps of our engine) once drafts no longer
pay. `AdaptiveChain` (`tree="auto"`) prices every k with what it measures where it runs and picks the best:

- each row's acceptance: a Beta prior updated by what the row accepted at each step (a rejection counts where
  its chain stopped short); the prior is what every row so far accepted, pooled, worth `prior_weight` trials
  (a new prompt starts from what the drafter usually does, not from scratch), or Beta(1, 2) before any;
- how acceptance changes with depth: a drafter's d-th token is accepted less often than its first (an EAGLE head
  drafts from its own features past the first), so a row's rate is scaled at depth d by the pooled rate at d over
  the pooled rate overall (each depth's rate shrunk towards the overall one by `prior_weight` trials). With one
  rate for every depth the longest chains look better than they are;
- the verification's time by batch size and width (an exponential average of the steps' own verify times;
  widths not seen yet at this batch size interpolated between seen ones; the first steps at a new batch size
  warm up (untimed), then try the longest chain, none and half, so both ends are known), the step's other time
  (mostly the commit, which grows with what a long chain accepts) likewise, and the draft's time per drafted
  token by batch size.

A batch ends when its last row does. Given the tokens each row may still emit (the session passes them), a
chain is priced by when the batch ends, not by one step's tokens: rows that draw drafts move apart, and the batch
waits for the row that drew fewest, while steps without drafts keep them in step. The part of a step that stays as
rows finish (weights read once a step) is paid until the unluckiest row is done (`finish_steps`), the part per row
for each row's own steps (`batch_steps`); that share is fitted to the costs timed at smaller batch sizes (the whole
step until one is). The batch's spread is priced with every row at the pooled rate: the largest of the rows' noisy
estimates runs high. On a device where a step of 1 row costs about what a step of 8 does, a chain that emits a
little more a step than none can end a batch later than none would (docs/benchmarks/chat.md).

Lossless whatever it picks: the length of a chain changes what is verified, never how. A chain must beat no chain
by `margin` (3%): where drafts are barely accepted the two are a near tie within the timings' noise, and a wrong
chain costs more than a wrong k = 0. Every `probe_every` steps it looks again where its estimates may be stale:
after chains, longer and shorter than the chosen chain in turn (the longer one: the longest expected to keep half a
token more per row, so a width timed once while the machine was busy is timed again; where drafts are barely
accepted, just one longer: a probe at the longest chain there costs most and shows nothing); after a run of k = 0,
at the cheapest chain by its measured cost (a wide verification can cost less than a narrow one on a CPU), and a
probe that does not pay (its measured tokens per second, the drafter's catch-up included, not `margin` above a
step without drafts) doubles the wait before the next (up to `max_probe_every`), so drafts that never pay cost a
vanishing share of the steps.

What the chains deliver is checked against what was promised: the tokens the chain steps emitted over the tokens
their predicted rates promised for the time they took (sums over the recent chain steps at a batch size, each
step's weight decaying by `delivery_decay`) scales every chain's promise at that size (with timings measured
here; a `verify_cost` given beforehand prices in its own units and is taken as it is). Costs the
model does not see (an EAGLE head catching up on the tokens of steps without drafts, a row's acceptance estimate
that runs high) then count, so a near tie that chains keep losing goes to k = 0, and a probe that delivers brings
the chains back.

    out = speculative_generate(target, drafter, ids, tree="auto")      # AdaptiveChain(max_k=8)
    out = speculative_generate(target, drafter, ids, tree=AdaptiveChain(max_k=12))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class AdaptiveChain:
    """A chain whose length each step is chosen (see the module docstring). `max_k`: the longest chain;
    `smoothing`: the weight of a new timing in the averages; `probe_every`: steps between probes; `margin`: how
    much more tokens per second a chain must promise than none; `verify_cost(batch, width)`: seconds of a
    verification when known beforehand (e.g. measured with `multispec.draft_length.VerifyCost` per batch size),
    instead of the steps' own timings; `delivery_decay`: the weight a chain step's delivery keeps at each later
    one; `delivery_prior`: steps that delivered their promise, assumed before any is measured. The timings carry
    over from one generation to the next (they are the machine's); the rows' acceptance starts over at each prompt
    (`start`)."""

    max_k: int = 8
    smoothing: float = 0.3
    probe_every: int = 16
    max_probe_every: int = 256
    prior: tuple[float, float] = (1.0, 2.0)
    prior_weight: float = 4.0
    margin: float = 0.03
    verify_cost: Callable[[int, int], float] | None = None
    verify_s: dict = field(default_factory=dict)  # (batch, width) -> seconds
    draft_s: dict = field(default_factory=dict)  # batch -> seconds per drafted token
    other_s: dict = field(default_factory=dict)  # (batch, width) -> seconds per step beyond drafting and verifying
    accepted: dict = field(default_factory=dict)  # row -> (accepted, trials)
    pooled: tuple = (0, 0)  # every row's (accepted, trials) so far, across prompts
    by_depth: dict = field(default_factory=dict)  # depth d >= 1 -> (accepted, trials) at d, pooled likewise
    delivery_decay: float = 0.9
    delivery_prior: float = 4.0
    delivered: dict = field(default_factory=dict)  # batch -> (tokens emitted, tokens promised, steps), decayed
    promise: float = 0.0  # the tokens per second the last chosen chain was predicted to deliver (0: none)
    chosen: list = field(default_factory=list)  # every step's k, for reports
    warmed: set = field(default_factory=set)  # batch sizes whose first (untimed) step has run
    _since_probe: int = 0
    _wait: int = 0  # steps between probes now (0: `probe_every`)
    _probing: bool = False
    _probe_up: bool = False  # the last probe after chains went longer (the next goes one shorter)

    def __post_init__(self) -> None:
        if not isinstance(self.max_k, int) or self.max_k < 1:
            raise ValueError(f"max_k: expected an int >= 1, got {self.max_k!r}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing: expected a number in (0, 1], got {self.smoothing!r}")
        if not self.margin >= 0:
            raise ValueError(f"margin: expected a number >= 0, got {self.margin!r}")
        if not 0 <= self.delivery_decay < 1:
            raise ValueError(f"delivery_decay: expected a number in [0, 1), got {self.delivery_decay!r}")
        if not self.delivery_prior >= 0:
            raise ValueError(f"delivery_prior: expected a number >= 0, got {self.delivery_prior!r}")

    # the TreeSpec face: the widest step the session must make room for
    @property
    def max_nodes(self) -> int:
        return self.max_k

    @property
    def feed_ids_bound(self) -> int:
        return self.max_k

    def start(self) -> None:
        """A new prompt: the rows' acceptance starts from the prior again."""
        self.accepted.clear()

    # ---- the choice -------------------------------------------------------------------------------------------
    def choose(self, rows: list[int], room: int | Sequence[int] | None = None) -> int:
        """The chain length for a step of the active `rows` (original row indices). `room`: the most tokens a row
        may still emit, one number for every row or one per row. A chain longer than the largest `room - 1` drafts
        what no row can keep, so it is cut there; with the rooms known the choice prices when the batch ends
        (`finish_steps`)."""
        rooms = None if room is None else [room] * len(rows) if isinstance(room, int) else list(room)
        if rooms is not None and len(rooms) != len(rows):
            raise ValueError(f"room: expected one number per row ({len(rows)}), got {len(rooms)}")
        k = self._choose(rows, rooms)
        most = max(rooms) if rooms else None
        if most is not None and k > max(most - 1, 0):
            k = self.chosen[-1] = max(most - 1, 0)
            self.promise = 0.0  # a cut chain was not what was priced
        return k

    def _choose(self, rows: list[int], rooms: list[int] | None) -> int:
        batch = len(rows)
        self.promise = 0.0
        if self.verify_cost is None and self._near(batch) is None:
            if batch not in self.warmed:
                return self._record(self.max_k)  # the warm-up step: its timings are not kept
            seen = sorted(w for b, w in self.verify_s if b == batch)
            for k in (self.max_k, 0, self.max_k // 2):  # a new batch size: both ends and the middle first
                if k + 1 not in seen:
                    return self._record(k)
        factors = [self.depth_factor(d) for d in range(1, self.max_k + 1)]
        moments = [self._moments(self.acceptance(r), factors) for r in rows]
        tokens = [sum(m[k][0] for m in moments) for k in range(self.max_k + 1)]
        costs = [self._cost(batch, k) for k in range(self.max_k + 1)]
        promised = {k: tokens[k] / costs[k] for k in range(self.max_k + 1)}
        kept = self.delivery(batch)  # what chains delivered of their promise here
        rates = {k: promised[k] * (kept if k else 1.0) for k in promised}  # tokens per second of this step
        # with equal rooms a chain's rate over the batch is at most its rate a step (its last row's steps are no
        # fewer than room / mean), and none's is the same: where no chain pays a step, none pays the batch
        step_pays = max(rates[k] for k in range(1, self.max_k + 1)) >= rates[0] * (1 + self.margin)
        if rooms is not None and batch > 1 and (step_pays or len(set(rooms)) > 1):
            # the batch's end: its steps priced as the batch shrinks, for every row's tokens
            # every row at the pooled rate: the batch's spread is the draws' own; the rows' estimates would add
            # their noise, and the largest of noisy estimates runs high (a row that drew two rejections early)
            work, shares = float(sum(rooms)), self._fixed_shares(batch, costs)
            typical = self._moments(self.pooled_rate(), factors)
            rates = {k: work / (costs[k] * batch_steps([typical[k]] * batch, rooms, shares[k]))
                     * (kept if k else 1.0) for k in promised}
        k = max(rates, key=rates.get)
        if k and rates[k] < rates[0] * (1 + self.margin):  # drafts must clearly pay: a near tie is noise
            k = 0
        self._since_probe += 1
        if self._since_probe >= (self._wait or self.probe_every):  # look again where the estimates may be stale
            self._since_probe = 0
            self._probing = k == 0
            if k == 0:
                k = min(range(1, self.max_k + 1), key=lambda j: costs[j])
            else:  # longer and shorter than the chosen length in turn
                self._probe_up = not self._probe_up
                k = self._longer(k, tokens, len(rows)) if self._probe_up else k - 1
        # a given `verify_cost` prices in its own units: there is no measured promise to hold the chains to
        self.promise = promised[k] if k and self.verify_cost is None else 0.0
        return self._record(k)

    def _fixed_shares(self, batch: int, costs: list[float]) -> list[float]:
        """For each chain length, the share of a step's cost at `batch` rows (`costs`) that stays when rows finish,
        from the costs at the batch sizes timed here of at most half `batch` (a line through the cost at `batch`;
        closer sizes leave the share to the timings' noise); 1, the whole step, before one is (a batch ends no
        sooner than its last row, whatever its steps cost then). On a CPU with a large vocabulary a step of 1 row
        costs about what 8 do; small models cost by the row."""
        if self.verify_cost is not None:
            sizes = [1]
        else:
            sizes = sorted({b for b, _ in self.verify_s if 2 * b <= batch})
        if not sizes:
            return [1.0] * len(costs)
        shares = []
        for k, full in enumerate(costs):  # the line through (batch, full) fitted to the smaller sizes' costs
            xs = [b / batch - 1 for b in sizes]
            ys = [self._cost(b, k) / full - 1 if full > 0 else 0.0 for b in sizes]
            slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)  # the cost share per row x batch
            shares.append(min(max(1 - slope, 0.0), 1.0))
        return shares

    def _longer(self, k: int, tokens: list[float], rows: int) -> int:
        """The probe above `k`: the longest chain expected to keep at least half a token more per row (its
        timing may be stale: a width timed once on a busy machine), else one longer (drafts barely accepted: a
        long probe would cost most and show nothing)."""
        far = [j for j in range(k + 1, self.max_k + 1) if tokens[j] - tokens[k] >= 0.5 * rows]
        return far[-1] if far else min(k + 1, self.max_k)

    def _near(self, batch: int) -> int | None:
        """The batch size whose timings stand in for `batch`'s: itself once explored, else the nearest timed one
        within a factor of 1.5 (rows that finish shrink a batch a row at a time: 8 -> 7 -> 6 costs about what 8
        did, and exploring each would spend the longest chain's steps where a generation ends). None: explore."""
        sizes = {b for b, _ in self.verify_s}
        if sum(b == batch for b, _ in self.verify_s) >= 3:
            return batch
        near = [b for b in sizes if b != batch and max(b, batch) <= 1.5 * min(b, batch)]
        return min(near, key=lambda b: (abs(b - batch), -b)) if near else None

    def _delivery_key(self, batch: int) -> int:
        near = self._near(batch)
        return batch if near is None else near

    def delivery(self, batch: int) -> float:
        """The tokens the chains emitted at this batch size over those their predicted rates promised for the time
        they took, with `delivery_prior` steps that delivered what they promised (one step that drew a rejected
        first draft must not end the chains): 1 before any chain step was measured there."""
        got, owed, steps = self.delivered.get(self._delivery_key(batch), (0.0, 0.0, 0.0))
        if owed <= 0:
            return 1.0
        prior = self.delivery_prior * owed / steps
        return (got + prior) / (owed + prior)

    def _record(self, k: int) -> int:
        self.chosen.append(k)
        return k

    def acceptance(self, row: int) -> float:
        a, n = self.accepted.get(row, (0, 0))
        alpha, beta = self.prior
        got, trials = self.pooled
        if trials:  # the pooled rate, worth `prior_weight` trials
            alpha = self.prior_weight * (got + 1) / (trials + 2)
            beta = self.prior_weight - alpha
        return (a + alpha) / (n + alpha + beta)

    def pooled_rate(self) -> float:
        """What every row so far accepted, pooled (the prior before any)."""
        got, trials = self.pooled
        alpha, beta = self.prior
        return (got + alpha) / (trials + alpha + beta)

    def depth_factor(self, depth: int) -> float:
        """The pooled acceptance at `depth` over the pooled acceptance overall (1 before anything is measured)."""
        got, trials = self.pooled
        if not trials:
            return 1.0
        overall = (got + 1) / (trials + 2)
        at, tried = self.by_depth.get(depth, (0, 0))  # smoothed as the overall rate, then shrunk towards it
        return (at + 1 + self.prior_weight * overall) / (tried + 2 + self.prior_weight) / overall

    def _moments(self, a: float, factors: list[float]) -> list[tuple[float, float]]:
        """For each k in 0..max_k, the mean and variance of the tokens a chain of k emits for a row accepting at
        rate `a`, scaled at depth d by `factors[d - 1]`: T = 1 + (drafts kept), P(T > j) = p1...pj, so
        E[T] = 1 + sum_j p1...pj and E[T^2] = 1 + sum_j (2j + 1) p1...pj."""
        reach, mean, square, out = 1.0, 1.0, 1.0, [(1.0, 0.0)]
        for j, f in enumerate(factors, start=1):
            reach *= min(a * f, 0.999)
            mean += reach
            square += (2 * j + 1) * reach
            out.append((mean, max(square - mean * mean, 0.0)))
        return out

    def _cost(self, batch: int, k: int) -> float:
        near = self._near(batch)
        draft = self.draft_s.get(batch, self.draft_s.get(near, 0.0))
        return self._verify(batch, k + 1) + k * draft + self._estimate(self.other_s, batch, k + 1)

    def _verify(self, batch: int, width: int) -> float:
        """The given cost, else the measured time at this width, else estimated (`_estimate`)."""
        if self.verify_cost is not None:
            return float(self.verify_cost(batch, width))
        return self._estimate(self.verify_s, batch, width)

    def _estimate(self, table: dict, batch: int, width: int) -> float:
        """`table`'s time at (batch, width): measured; else interpolated between the widths seen at this batch size;
        else the nearest batch size's (`_near`) shape, at this batch size's level where one width is timed here."""
        own = sorted(w for b, w in table if b == batch)
        near = self._near(batch)
        if (batch, width) in table or near in (None, batch) or own and own[0] < width < own[-1]:
            return _at_width(table, batch, width)
        there = _at_width(table, near, width)
        if not own:
            return there
        w0 = min(own, key=lambda w: abs(w - width))
        base = _at_width(table, near, w0)
        return there * table[(batch, w0)] / base if base > 0 else there

    # ---- what a step measured ----------------------------------------------------------------------------------
    def observe(self, rows: list[int], k: int, accepted: list[int], verify_s: float, draft_s: float,
                other_s: float, promised: float = 0.0) -> None:
        """A finished step of chain length `k` over `rows`: each row's accepted drafts, the step's times, and the
        tokens per second its choice promised (`promise` after that `choose`; 0: none to hold it to)."""
        batch = len(rows)
        if batch not in self.warmed:
            self.warmed.add(batch)
            if self.verify_cost is None and self._near(batch) is None:
                return  # a new batch size's first step (its warm-up): not timed
        # a batch shrunk by rows that finished takes a nearby size's costs and is timed from its first step: the
        # costs of the sizes a batch shrinks through price its stragglers (`_fixed_shares`)
        self._average(self.verify_s, (batch, k + 1), verify_s)
        if k:
            self._average(self.draft_s, batch, draft_s / k)
            for r, a in zip(rows, accepted):
                got, trials = self.accepted.get(r, (0, 0))
                self.accepted[r] = (got + a, trials + a + (1 if a < k else 0))
                total, tried = self.pooled
                self.pooled = (total + a, tried + a + (1 if a < k else 0))
                for d in range(1, min(a + 1, k) + 1):  # depths 1..a accepted; a + 1 tried and rejected
                    at, tried_d = self.by_depth.get(d, (0, 0))
                    self.by_depth[d] = (at + (d <= a), tried_d + 1)
        seconds = verify_s + draft_s + other_s
        if k and promised > 0 and seconds > 0:  # what the chain delivered of what its choice promised
            key, d = self._delivery_key(batch), self.delivery_decay
            got, owed, steps = self.delivered.get(key, (0.0, 0.0, 0.0))
            self.delivered[key] = (d * got + batch + sum(accepted), d * owed + promised * seconds, d * steps + 1)
        if self._probing:  # a probe after a run of k = 0: one that did not pay waits twice as long for the next
            self._probing = False
            self._wait = 0 if self._paid(batch, accepted, seconds) else min(
                self.max_probe_every, 2 * (self._wait or self.probe_every))
        self._average(self.other_s, (batch, k + 1), other_s)  # the commit grows with what a long chain accepts

    def _paid(self, batch: int, accepted: list[int], seconds: float) -> bool:
        """Whether a probe's tokens per second, measured (the EAGLE head's catch-up over the skipped steps
        included), beat a step without drafts by `margin`: drafts that are accepted now and then but never pay
        must not bring the probes back every `probe_every` steps."""
        none = self._cost(batch, 0)
        if none <= 0 or seconds <= 0:
            return any(accepted)
        return (batch + sum(accepted)) / seconds > batch / none * (1 + self.margin)

    def _average(self, table: dict, key, value: float) -> None:
        table[key] = value if key not in table else (1 - self.smoothing) * table[key] + self.smoothing * value


def _at_width(table: dict, batch: int, width: int) -> float:
    """`table[(batch, width)]`, else interpolated linearly in the width between the nearest widths seen at this batch
    size (the nearest one beyond them); 0 before any."""
    if (batch, width) in table:
        return table[(batch, width)]
    seen = sorted((w, t) for (b, w), t in table.items() if b == batch)
    below = [p for p in seen if p[0] < width]
    above = [p for p in seen if p[0] > width]
    if below and above:
        (w0, t0), (w1, t1) = below[-1], above[0]
        return t0 + (t1 - t0) * (width - w0) / (w1 - w0)
    return below[-1][1] if below else above[0][1] if above else 0.0


def finish_steps(moments: Sequence[tuple[float, float]], rooms: Sequence[int]) -> float:
    """The expected number of steps until every row has emitted its room, each row emitting tokens of the given
    (mean, variance) a step. A row needs about room / mean steps, with variance room * variance / mean^3 (renewal
    theory); the batch needs the largest of them, whose mean is folded pairwise over the rows as the maximum of two
    normals (Clark 1961). Rows that emit one token a step need exactly their room; rows that draw more vary, and a
    batch of B such rows waits for its unluckiest: about 1.4 standard deviations past the mean at B = 8. Checked
    against simulated batches (tests/core/test_adaptive.py); rough with a few tokens to go (the normal's tail is
    thinner than the steps'), where it is capped at the largest room."""
    mean, var = None, 0.0
    for (m, v), room in zip(moments, rooms):
        mu, s2 = row_steps(m, v, room), room * v / m ** 3
        mean, var = (mu, s2) if mean is None else _max_of_normals(mean, var, mu, s2)
    return min(max(mean or 0.0, 1.0), float(max(rooms, default=1)))  # no row takes more steps than its room


def batch_steps(moments: Sequence[tuple[float, float]], rooms: Sequence[int], fixed_share: float) -> float:
    """A batch's steps in units of a whole batch's step: a step costs a part that stays as rows finish (the
    weights read once a step) and a part per row, so the batch costs fixed x (its last row's steps) + per row x
    (its rows' mean steps)."""
    mean = sum(row_steps(m, v, r) for (m, v), r in zip(moments, rooms)) / len(rooms)
    return fixed_share * finish_steps(moments, rooms) + (1 - fixed_share) * mean


def row_steps(mean: float, var: float, room: int) -> float:
    """The expected steps until a row emitting tokens of this mean and variance a step has `room` of them: the
    last step overshoots, (room - 1) / mean + (E[T^2] + mean) / (2 mean^2) for whole tokens (renewal theory)."""
    return min((room - 1) / mean + (var + mean * mean + mean) / (2 * mean * mean), float(room))


def _max_of_normals(m1: float, v1: float, m2: float, v2: float) -> tuple[float, float]:
    """The mean and variance of the larger of two independent normals (Clark's moments)."""
    theta2 = v1 + v2
    if theta2 <= 1e-12:
        return (m1, v1) if m1 >= m2 else (m2, v2)
    theta = math.sqrt(theta2)
    alpha = (m1 - m2) / theta
    cdf = 0.5 * (1 + math.erf(alpha / math.sqrt(2)))
    pdf = math.exp(-0.5 * alpha * alpha) / math.sqrt(2 * math.pi)
    mean = m1 * cdf + m2 * (1 - cdf) + theta * pdf
    square = (m1 * m1 + v1) * cdf + (m2 * m2 + v2) * (1 - cdf) + (m1 + m2) * theta * pdf
    return mean, max(square - mean * mean, 0.0)


__all__ = ["AdaptiveChain", "batch_steps", "finish_steps", "row_steps"]
