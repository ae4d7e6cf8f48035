"""What limits continuous speculative decoding on `mnist-patch-diffusion`: the draft's context or its head?

Teacher-forced acceptance α = E[min(1, p(τ)/q(τ))] of one draft trajectory per token on held-out MNIST digits
(prefixes noised to the stop level as the models are trained; guidance as in the benchmark), for
- the shipped draft (its own 1-layer transformer and 1-block head), and
- a head of the given size fed the *target's own* condition z (the best an EAGLE-style draft, which
  predicts z from the target's features, could do with that head), distilled on the target's noise
  predictions (both guidance halves at uniform t, the guided prediction at the grid's steps weighted as
  in the acceptance log ratio).

    python benchmarks/studies/continuous_draft_bound.py [--width 64 --blocks 1] [--steps 1500] [--json PATH]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from multispec.bench.machine import describe, machine_info, save_results
from multispec.image_ar.continuous.training import grid_weights
from multispec.image_ar.continuous.training import optimizer as _optimizer
from multispec.image_ar.continuous.zoo_pair import CFG_SCALE, load_pair
from multispec.image_ar.data import load_digits_dataset
from multispec.image_ar.continuous.diffusion_head import TRAIN_STEPS, Trajectory, schedule_scheduler
from multispec.image_ar.continuous.head_sampler import HeadSampler
from multispec.image_ar.continuous.patch_ar import PatchAR, PatchARConfig, patchify
from multispec.image_ar.continuous.trajectory_kernel import trajectory_log_ratio


@torch.no_grad()
def conditions(model: PatchAR, images: torch.Tensor, labels: torch.Tensor, seed: int):
    """Tokens [N*L, D] and the model's (cond, uncond) transformer outputs [N*L, H] on noised prefixes."""
    c = model.config
    ac = schedule_scheduler().alphas_cumprod
    x0 = patchify(images, c.patch)
    g = torch.Generator().manual_seed(seed)
    noisy = ac[c.stop].sqrt() * x0 + (1 - ac[c.stop]).sqrt() * torch.randn(x0.shape, generator=g)
    both = torch.cat([labels, torch.full_like(labels, model.null_class)])
    z = model.transform(model.inputs(both, noisy[:, :-1].repeat(2, 1, 1), 0))
    zc, zu = z.chunk(2)
    return x0.reshape(-1, c.token_dim), zc.reshape(-1, zc.shape[-1]), zu.reshape(-1, zu.shape[-1])


def distil_head(target: PatchAR, width: int, blocks: int, steps: int, images: int, batch: int = 2048) -> PatchAR:
    """A head of `width` x `blocks` on the target's z (held in a 0-layer `PatchAR` so `HeadSampler` runs it)."""
    from tqdm.auto import tqdm

    c = target.config
    torch.manual_seed(0)
    shell = PatchAR(PatchARConfig(layers=0, hidden=c.hidden, heads=c.heads, head_width=width, head_blocks=blocks,
                                  steps=c.steps, stop=c.stop))
    train, labels = load_digits_dataset("mnist", "train")
    parts = [conditions(target, train[i:i + 64, 0] * 2 - 1, labels[i:i + 64], i) for i in range(0, images, 64)]
    x0, zc, zu = (torch.cat(t) for t in zip(*parts))
    ac = schedule_scheduler().alphas_cumprod
    grid, weights = grid_weights(c)
    opt, sched = _optimizer(shell, 2e-3, steps)
    g = torch.Generator().manual_seed(1)
    for _ in tqdm(range(steps), desc=f"head w{width} x{blocks}", unit="step"):
        idx = torch.randint(0, len(x0), (batch,), generator=g)
        tok, c_, u_ = x0[idx], zc[idx], zu[idx]
        loss = 0.0
        for on_grid in (False, True):
            t = (grid[torch.multinomial(weights, batch, replacement=True, generator=g)] if on_grid
                 else torch.randint(c.stop, TRAIN_STEPS, (batch,), generator=g))
            a = ac[t][:, None]
            xt = a.sqrt() * tok + (1 - a).sqrt() * torch.randn(tok.shape, generator=g)
            with torch.no_grad():
                ec, eu = target.head(xt, t, c_), target.head(xt, t, u_)
            sc, su = shell.head(xt, t, c_), shell.head(xt, t, u_)
            if on_grid:  # the guided prediction, where the acceptance ratio reads it
                loss = loss + 4 * F.mse_loss(torch.lerp(su, sc, CFG_SCALE), torch.lerp(eu, ec, CFG_SCALE))
            else:
                loss = loss + F.mse_loss(sc, ec) + F.mse_loss(su, eu)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(shell.parameters(), 1.0)
        opt.step()
        sched.step()
    return shell.eval()


@torch.no_grad()
def acceptance(target: PatchAR, draft_z: PatchAR, draft_head: PatchAR, n: int = 100) -> float:
    """Teacher-forced α: draft trajectories from `draft_head` on `draft_z`'s conditions, judged by the target."""
    images, labels = load_digits_dataset("mnist", "test")
    x, y = images[:n, 0] * 2 - 1, labels[:n]
    traj = Trajectory.make(target.config.steps, target.config.stop)
    p, q = HeadSampler(target, traj, CFG_SCALE), HeadSampler(draft_head, traj, CFG_SCALE)
    _, zc, zu = conditions(target, x, y, 5)
    _, qc, qu = conditions(draft_z, x, y, 5)  # the same prefix noise
    states, mean_q = q.sample(q.conditions(qc, qu), q.noise(len(zc), torch.Generator().manual_seed(6)))
    mean_p, _ = p.means(p.conditions(zc, zu), states)
    log_ratio = trajectory_log_ratio(states[:, 1:], mean_p, mean_q, p.std, backend="torch")
    return float(log_ratio.clamp(max=0).exp().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--images", type=int, default=2048, help="training digits whose target conditions are cached")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair()
    t0 = time.perf_counter()
    head = distil_head(pair.target, args.width, args.blocks, args.steps, args.images)
    result = {"machine": machine_info(), "guidance_scale": CFG_SCALE, "test_digits": 100,
              "head": {"width": args.width, "blocks": args.blocks, "steps": args.steps, "images": args.images,
                       "seconds": round(time.perf_counter() - t0, 1)},
              "alpha_shipped_draft": round(acceptance(pair.target, pair.draft, pair.draft), 4),
              "alpha_head_on_target_z": round(acceptance(pair.target, pair.target, head), 4)}
    print(f"teacher-forced acceptance ({describe(result['machine'])}): shipped draft {result['alpha_shipped_draft']}, "
          f"a {args.width} x {args.blocks} head on the target's z {result['alpha_head_on_target_z']}")
    save_results(result, args.json)


if __name__ == "__main__":
    main()
