"""Tiny randomly initialised `transformers` models of real classes, for tests, benchmarks and examples
(no download needed)."""

from __future__ import annotations

import copy

import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

VOCAB = 128
KINDS = ("llama", "qwen2", "gemma3")


def make_target(kind: str = "llama", seed: int = 0, vocab: int = VOCAB, layers: int = 3, hidden: int = 64,
                head_scale: float = 8.0, attn: str = "sdpa") -> torch.nn.Module:
    """A random causal LM; the LM head is scaled up so argmax ties (and flaky comparisons) are rare."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "gemma3":
        # two sliding layers with a tiny window, so the sliding-window masks are exercised
        types = ["sliding_attention", "sliding_attention", "full_attention"][:layers]
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=16, sliding_window=6, layer_types=types))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    model.config._attn_implementation = attn
    return model.eval()


def make_mamba2(seed: int = 0, vocab: int = VOCAB, layers: int = 2, hidden: int = 64, head_scale: float = 8.0,
                state: int = 16, groups: int = 2) -> torch.nn.Module:
    """A random `Mamba2ForCausalLM` (2 groups, 8 heads of 16, conv width 4); runs its PyTorch path on CPU.
    Decays are drawn wider than the default init so that the state carries information across steps."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(seed)
    config = Mamba2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_heads=hidden * 2 // 16,
                          head_dim=16, state_size=state, n_groups=groups, conv_kernel=4, chunk_size=16,
                          tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Mamba2ForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        for layer in model.backbone.layers:
            layer.mixer.A_log.uniform_(-2.0, 1.0)
            layer.mixer.dt_bias.uniform_(-3.0, 0.5)
    return model.eval()


def make_mamba(seed: int = 0, vocab: int = VOCAB, layers: int = 2, hidden: int = 64, head_scale: float = 8.0,
               state: int = 8) -> torch.nn.Module:
    """A random `MambaForCausalLM` (Mamba-1, conv width 4); runs its PyTorch path on CPU."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    config = MambaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, state_size=state,
                         expand=2, conv_kernel=4, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    model = MambaForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model.eval()


def make_bamba(seed: int = 0, vocab: int = VOCAB, layers: int = 4, hidden: int = 64, head_scale: float = 8.0,
               attention_layers: tuple[int, ...] = (1, 3)) -> torch.nn.Module:
    """A random hybrid `BambaForCausalLM`: Mamba-2 layers (2 groups, 8 heads of 16, conv width 4) with
    full-attention layers at `attention_layers` (4 heads, 2 KV heads, partial rotary); PyTorch path on CPU."""
    from transformers import BambaConfig, BambaForCausalLM

    torch.manual_seed(seed)
    config = BambaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=list(attention_layers),
                         mamba_n_heads=hidden * 2 // 16, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
                         mamba_d_conv=4, mamba_chunk_size=16, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, max_position_embeddings=1024)
    model = BambaForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                layer.mamba.A_log.uniform_(-2.0, 1.0)
                layer.mamba.dt_bias.uniform_(-3.0, 0.5)
    return model.eval()


def make_layer_skip_draft(target: torch.nn.Module, layers: int = 1) -> torch.nn.Module:
    """A draft sharing the target's embeddings, first `layers` blocks and head (so it often agrees)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:layers]
    draft = type(target)(config)
    draft.load_state_dict(target.state_dict(), strict=False)
    draft.config._attn_implementation = target.config._attn_implementation
    return draft.eval()


def ragged_prompts(batch: int, seed: int = 0, vocab: int = VOCAB, lengths=(7, 3, 5, 9, 4)):
    """Left-padded prompts of different lengths (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    lens = [lengths[i % len(lengths)] for i in range(batch)]
    width = max(lens)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for r, n in enumerate(lens):
        ids[r, width - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask


def first_two_token_dists(model: torch.nn.Module, prompt: torch.Tensor, sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact distributions (float64) of the first sampled token after `prompt` [L] and, marginally, of the
    second, under the `SamplingConfig` transform: the reference for chi-square tests of samplers."""
    with torch.no_grad():
        p1 = sampling.probs(model(prompt[None]).logits[0, -1])
        support = p1.nonzero().flatten()
        seqs = torch.cat([prompt.expand(len(support), -1), support[:, None]], 1)
        p2_given = sampling.probs(model(seqs).logits[:, -1])
        p2 = (p1[support, None] * p2_given).sum(0)
    return p1.double(), p2.double()


def chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit of integer `samples` to `probs`; bins expecting fewer than 5 counts are
    pooled into one (dropped, with the rest rescaled, if the pool itself expects fewer than 5)."""
    from scipy.stats import chisquare

    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() / probs.double().sum() * samples.numel()  # float32 probs need not sum to 1
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
        exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)
