"""A small VQ-VAE image tokenizer (encoder, codebook, decoder) for 28x28 grey images.

Two stride-2 convolutions turn an image into a 7x7 grid of `embed_dim`-dimensional latents; each latent
is replaced by its nearest codebook entry under cosine distance (the codebook and the latents are
L2-normalised, as LlamaGen's tokenizer does, which keeps the codes in use spread over the sphere); the
decoder maps the 49 code vectors back to pixels. Training: reconstruction + codebook + commitment loss
with the straight-through estimator, and codes that fell out of use re-seeded from the batch's latents.

`save_pretrained(folder)` / `VQVAE.from_pretrained(folder)` (a config.json and safetensors, through
`huggingface_hub`'s mixin) load it like any hub model, from a local folder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from multispec.plugin import train_steps

from .data import shifted


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block = nn.Sequential(nn.SiLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU(),
                                   nn.Conv2d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class VQVAE(nn.Module, PyTorchModelHubMixin):
    """Images [N, 1, 28, 28] in [0, 1] <-> codes [N, 7, 7] in [0, codebook_size)."""

    def __init__(self, codebook_size: int = 512, embed_dim: int = 8, channels: int = 64, beta: float = 0.25):
        super().__init__()
        self.codebook_size, self.embed_dim, self.beta = codebook_size, embed_dim, beta
        c = channels
        self.encoder = nn.Sequential(
            nn.Conv2d(1, c // 2, 4, stride=2, padding=1), nn.SiLU(),  # 28 -> 14
            nn.Conv2d(c // 2, c, 4, stride=2, padding=1),  # 14 -> 7
            _Residual(c), _Residual(c), nn.SiLU(), nn.Conv2d(c, embed_dim, 1))
        self.codebook = nn.Embedding(codebook_size, embed_dim)
        nn.init.normal_(self.codebook.weight)
        self.decoder = nn.Sequential(
            nn.Conv2d(embed_dim, c, 3, padding=1), _Residual(c), _Residual(c), nn.SiLU(),
            nn.ConvTranspose2d(c, c // 2, 4, stride=2, padding=1), nn.SiLU(),  # 7 -> 14
            nn.ConvTranspose2d(c // 2, 1, 4, stride=2, padding=1))  # 14 -> 28

    @property
    def grid_size(self) -> int:
        return 7

    def codebook_latents(self) -> torch.Tensor:
        """[V, embed_dim] the normalised code vectors the quantiser compares latents with (what LANTERN's
        latent neighbourhoods are measured on)."""
        return F.normalize(self.codebook.weight, dim=-1)

    def _latents(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.encoder(images * 2 - 1), dim=1)  # [N, D, 7, 7]

    def _nearest(self, z: torch.Tensor) -> torch.Tensor:
        flat = z.permute(0, 2, 3, 1).reshape(-1, self.embed_dim)
        return (flat @ self.codebook_latents().T).argmax(dim=-1).view(z.shape[0], z.shape[2], z.shape[3])

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Codes [N, 7, 7] (int64) of images [N, 1, 28, 28] in [0, 1]."""
        if images.dim() != 4 or images.shape[1:] != (1, 28, 28):
            raise ValueError(f"images: expected [N, 1, 28, 28], got {tuple(images.shape)}")
        return self._nearest(self._latents(images))

    def _decode_latents(self, q: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.decoder(q))

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Images [N, 1, 28, 28] in [0, 1] from codes [N, 7, 7] or [N, 49] (raster order)."""
        codes = codes.reshape(codes.shape[0], self.grid_size, self.grid_size).long()
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"codes: ids must lie in [0, {self.codebook_size}), got {int(codes.min())}..{int(codes.max())}")
        q = self.codebook_latents()[codes].permute(0, 3, 1, 2)
        return self._decode_latents(q)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: (reconstruction, loss, codes)."""
        z = self._latents(images)
        codes = self._nearest(z)
        q = self.codebook_latents()[codes].permute(0, 3, 1, 2)
        codebook_loss = F.mse_loss(q, z.detach()) + self.beta * F.mse_loss(z, q.detach())
        recon = self._decode_latents(z + (q - z).detach())  # straight-through
        loss = F.binary_cross_entropy(recon.clamp(1e-6, 1 - 1e-6), images) + codebook_loss
        return recon, loss, codes


def train_vqvae(images: torch.Tensor, *, steps: int = 1500, batch_size: int = 128, lr: float = 2e-3,
                seed: int = 0, codebook_size: int = 512, embed_dim: int = 8, channels: int = 64,
                max_shift: int = 2, progress: bool = True) -> tuple[VQVAE, dict]:
    """Train a `VQVAE` on `images` [N, 1, 28, 28]; returns it (eval mode) and a report (final loss, codes in
    use, reconstruction MSE)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = VQVAE(codebook_size, embed_dim, channels)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    usage = torch.zeros(codebook_size)
    last: dict[str, torch.Tensor] = {}  # the step's batch and codes, for the re-seeding after it

    def step_loss(_: int) -> torch.Tensor:
        last["batch"] = shifted(images[torch.randint(0, len(images), (batch_size,), generator=g)], max_shift, g)
        _, loss, last["codes"] = model(last["batch"])
        return loss

    def reseed(done: int, _: list[float]) -> None:
        usage.add_(torch.bincount(last["codes"].flatten(), minlength=codebook_size))
        if done % 100 == 0 and done - 1 < steps * 0.8:  # re-seed dead codes from this batch's latents
            dead = (usage == 0).nonzero().flatten()
            if len(dead):
                with torch.no_grad():
                    z = model._latents(last["batch"]).permute(0, 2, 3, 1).reshape(-1, embed_dim)
                    pick = torch.randint(0, len(z), (len(dead),), generator=g)
                    model.codebook.weight[dead] = z[pick] + 0.01 * torch.randn(len(dead), embed_dim, generator=g)
            usage.zero_()

    losses = train_steps(model, None, steps, (opt, sched), "vq-vae", after_step=reseed, loss=step_loss,
                         clip=None, progress=progress)
    model.eval()
    with torch.no_grad():
        codes = model.encode(images[:1000])
        mse = F.mse_loss(model.decode(codes), images[:1000]).item()
    in_use = int(torch.unique(model.encode(images)).numel())
    return model, {"loss": losses[-1], "codes_in_use": in_use, "reconstruction_mse": mse, "steps": steps}
