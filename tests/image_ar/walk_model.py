"""The continuous-token tests' model: a tiny diffusion-head AR model over 4 scalar tokens (a 4-point grid)
trained on a Gaussian random walk (x1 ~ N(0, 0.4²), x_{j+1} = x_j + N(0, 0.15²), clipped to [-1, 1]), and
perturbed copies of it as drafts. Shared by the eager loop's tests and the fixed-shape step's."""

import torch

from multispec.image_ar.continuous.patch_ar import PatchAR, PatchARConfig

N = 2000
CFG = dict(image_size=2, patch=1, hidden=16, heads=2, head_width=16, head_blocks=1, steps=4, stop=50, num_classes=2)


def walks(n, g):
    x1 = (0.4 * torch.randn(n, 1, generator=g)).clamp(-1, 1)
    return torch.cat([x1, x1 + (0.15 * torch.randn(n, 3, generator=g)).cumsum(1)], 1).clamp(-1, 1).view(n, 2, 2)


def walk_target():
    """The tiny model trained on the random walk (400 steps of 256)."""
    torch.manual_seed(0)
    model = PatchAR(PatchARConfig(layers=2, **CFG))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        x = walks(256, g)
        loss = model.loss(x, torch.randint(0, 2, (256,), generator=g), generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def perturbed(model, scale, seed=1):
    d = PatchAR(model.config)
    d.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g))
    return d.eval()
