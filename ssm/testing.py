"""Tiny randomly initialised state-space models of the real `transformers` classes (Mamba-2, Mamba,
FalconMamba, the hybrids Bamba, GraniteMoeHybrid, Nemotron-H, Jamba, Falcon-H1, LFM2, Zamba2 and Qwen3-Next), for tests and
examples (no download needed)."""

from __future__ import annotations

import torch
from transformers import (BambaConfig, BambaForCausalLM, FalconH1Config, FalconH1ForCausalLM, FalconMambaConfig,
                          FalconMambaForCausalLM, GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, JambaConfig,
                          JambaForCausalLM, Lfm2Config, Lfm2ForCausalLM, Mamba2Config, Mamba2ForCausalLM,
                          MambaConfig, MambaForCausalLM, NemotronHConfig, NemotronHForCausalLM, Qwen3NextConfig,
                          Qwen3NextForCausalLM, Zamba2Config,
                          Zamba2ForCausalLM)

from multispec.plugin import VOCAB


def randomised(model: torch.nn.Module, head_scale: float, mixers: list) -> torch.nn.Module:
    """`model` in eval mode with its LM head scaled by `head_scale` (argmax ties become rare) and each Mamba-2
    mixer's decays drawn wider than the default init (so the state carries information across steps)."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        for mixer in mixers:
            mixer.A_log.uniform_(-2.0, 1.0)
            mixer.dt_bias.uniform_(-3.0, 0.5)
    return model.eval()


def make_mamba2(seed: int = 0, vocab: int = VOCAB, layers: int = 2, hidden: int = 64, head_scale: float = 8.0,
                state: int = 16, groups: int = 2) -> torch.nn.Module:
    """A random `Mamba2ForCausalLM` (2 groups, 8 heads of 16, conv width 4); runs its PyTorch path on CPU.
    Decays are drawn wider than the default init so that the state carries information across steps."""
    torch.manual_seed(seed)
    config = Mamba2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_heads=hidden * 2 // 16,
                          head_dim=16, state_size=state, n_groups=groups, conv_kernel=4, chunk_size=16,
                          tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Mamba2ForCausalLM(config)
    return randomised(model, head_scale, [layer.mixer for layer in model.backbone.layers])


def make_mamba(seed: int = 0, vocab: int = VOCAB, layers: int = 2, hidden: int = 64, head_scale: float = 8.0,
               state: int = 8, falcon: bool = False) -> torch.nn.Module:
    """A random `MambaForCausalLM` (Mamba-1, conv width 4; runs its PyTorch path on CPU), or with `falcon` a
    `FalconMambaForCausalLM` (the same with RMS norms on the time step, B and C)."""
    torch.manual_seed(seed)
    config_class, model_class = (FalconMambaConfig, FalconMambaForCausalLM) if falcon else (MambaConfig,
                                                                                             MambaForCausalLM)
    config = config_class(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, state_size=state,
                          expand=2, conv_kernel=4, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                          pad_token_id=0)
    model = model_class(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model.eval()


def make_falcon_mamba(seed: int = 0, **kwargs) -> torch.nn.Module:
    """A random `FalconMambaForCausalLM` (`make_mamba(falcon=True)`)."""
    return make_mamba(seed, falcon=True, **kwargs)


def make_bamba(seed: int = 0, vocab: int = VOCAB, layers: int = 4, hidden: int = 64, head_scale: float = 8.0,
               attention_layers: tuple[int, ...] = (1, 3)) -> torch.nn.Module:
    """A random hybrid `BambaForCausalLM`: Mamba-2 layers (2 groups, 8 heads of 16, conv width 4) with
    full-attention layers at `attention_layers` (4 heads, 2 KV heads, partial rotary); PyTorch path on CPU."""
    torch.manual_seed(seed)
    config = BambaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=list(attention_layers),
                         mamba_n_heads=hidden * 2 // 16, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
                         mamba_d_conv=4, mamba_chunk_size=16, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, max_position_embeddings=1024)
    model = BambaForCausalLM(config)
    # a Mamba-2 layer has `mamba` (its `block_type`, `layer_type` before transformers 5.13)
    return randomised(model, head_scale, [layer.mamba for layer in model.model.layers if hasattr(layer, "mamba")])


def make_granite_hybrid(seed: int = 0, vocab: int = VOCAB, layers: int = 4, hidden: int = 64, head_scale: float = 8.0,
                        attention_layers: tuple[int, ...] = (1, 3), experts: int = 4, rope: bool = False
                        ) -> torch.nn.Module:
    """A random `GraniteMoeHybridForCausalLM` (Granite 4.0-H's class): Mamba-2 layers as in `make_bamba`,
    attention at `attention_layers`, each layer's mixture of `experts` (top 2) plus a shared MLP, and
    Granite's embedding / residual / attention / logits multipliers set away from 1; no position embedding
    (NoPE, as Granite 4.0-H) unless `rope`."""
    torch.manual_seed(seed)
    kinds = ["attention" if i in attention_layers else "mamba" for i in range(layers)]
    config = GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, shared_intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, layer_types=kinds,
        num_local_experts=experts, num_experts_per_tok=2, mamba_n_heads=hidden * 2 // 16, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
        position_embedding_type="rope" if rope else None, embedding_multiplier=6.0, residual_multiplier=0.4,
        attention_multiplier=0.1, logits_scaling=2.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, max_position_embeddings=1024)
    model = GraniteMoeHybridForCausalLM(config)
    return randomised(model, head_scale, [layer.mamba for layer in model.model.layers if layer.mamba is not None])


def make_nemotron_h(seed: int = 0, vocab: int = VOCAB, hidden: int = 64, head_scale: float = 8.0,
                    pattern: str = "M*M-ME") -> torch.nn.Module:
    """A random `NemotronHForCausalLM`: blocks by `pattern` (M: Mamba-2 as in `make_bamba`, *: attention
    with 4 heads and 2 KV heads and no position embedding, -: MLP, E: mixture of 4 experts, top 2)."""
    torch.manual_seed(seed)
    config = NemotronHConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, hybrid_override_pattern=pattern,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=hidden * 2 // 16,
        mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=hidden, moe_shared_expert_intermediate_size=hidden,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=1024)
    model = NemotronHForCausalLM(config)
    return randomised(model, head_scale,
                       [layer.mixer for layer in model.model.layers if layer.block_type == "linear_attention"])


def make_jamba(seed: int = 0, vocab: int = VOCAB, layers: int = 4, hidden: int = 64, head_scale: float = 8.0,
               state: int = 8) -> torch.nn.Module:
    """A random `JambaForCausalLM`: Mamba-1 layers (with their time-step / B / C norms, conv width 4) and
    attention (NoPE, 4 heads, 2 KV heads) at every second layer, a mixture of 4 experts (top 2) at every
    second layer and an MLP elsewhere."""
    torch.manual_seed(seed)
    config = JambaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
                         expert_layer_period=2, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
                         mamba_d_state=state, mamba_d_conv=4, mamba_expand=2,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = JambaForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model.eval()


def make_falcon_h1(seed: int = 0, vocab: int = VOCAB, layers: int = 3, hidden: int = 64, head_scale: float = 8.0,
                   rms_norm: bool = True, norm_before_gate: bool = False) -> torch.nn.Module:
    """A random `FalconH1ForCausalLM`: every layer a Mamba-2 mixer (2 groups, 8 heads of 16, conv width 4,
    its gated norm unless `rms_norm` is False) beside attention (4 heads, 2 KV heads, RoPE), then an MLP;
    every muP multiplier of the config set away from 1 (a branch applied at the wrong place shows)."""
    torch.manual_seed(seed)
    config = FalconH1Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_d_ssm=2 * hidden,
        mamba_n_heads=hidden * 2 // 16, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_chunk_size=16, mamba_rms_norm=rms_norm, mamba_norm_before_gate=norm_before_gate,
        embedding_multiplier=3.0, lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=1.3,
        attention_out_multiplier=0.8, ssm_in_multiplier=1.2, ssm_out_multiplier=0.6,
        ssm_multipliers=[0.9, 1.1, 0.8, 1.2, 1.05], mlp_multipliers=[1.5, 0.7], tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=1024)
    model = FalconH1ForCausalLM(config)
    randomised(model, head_scale, [layer.mamba for layer in model.model.layers])
    if rms_norm:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mamba.norm.weight.uniform_(0.5, 1.5)
    return model


def make_lfm2(seed: int = 0, vocab: int = VOCAB, layers: int = 4, hidden: int = 64, head_scale: float = 8.0,
              attention_layers: tuple[int, ...] = (1, 3)) -> torch.nn.Module:
    """A random `Lfm2ForCausalLM`: gated short-conv layers (width 3, with bias) and attention at
    `attention_layers` (4 heads, 2 KV heads, per-head query/key norms, RoPE); norm weights set away from 1."""
    torch.manual_seed(seed)
    config = Lfm2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, full_attn_idxs=list(attention_layers),
                        conv_bias=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                        max_position_embeddings=1024)
    model = Lfm2ForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def make_zamba2(seed: int = 0, vocab: int = VOCAB, hidden: int = 64, head_scale: float = 8.0,
                kinds: tuple[str, ...] = ("mamba", "hybrid", "mamba", "hybrid", "hybrid"), rope: bool = True
                ) -> torch.nn.Module:
    """A random `Zamba2ForCausalLM`: a Mamba-2 block per layer (2 groups, 8 heads of 16, conv width 4) and,
    at each "hybrid" layer of `kinds`, a shared transformer block (4 heads of 32 over the concatenated
    hidden state and embeddings, RoPE unless `rope` is False) with per-layer adapters; two shared blocks
    alternate, so the third hybrid layer reuses the first block's weights with its own adapters."""
    torch.manual_seed(seed)
    config = Zamba2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=len(kinds), layers_block_type=list(kinds),
        num_attention_heads=4, num_key_value_heads=4, intermediate_size=2 * hidden, n_mamba_heads=hidden * 2 // 16,
        mamba_headdim=16, mamba_ngroups=2, mamba_d_state=16, mamba_d_conv=4, chunk_size=16, num_mem_blocks=2,
        use_shared_attention_adapter=True, adapter_rank=8, use_mem_rope=rope, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=1024)
    model = Zamba2ForCausalLM(config)
    mixers = [layer.mamba if hasattr(layer, "mamba") else layer.mamba_decoder.mamba for layer in model.model.layers]
    randomised(model, head_scale, mixers)
    with torch.no_grad():  # adapters start near zero; make them matter
        for name, p in model.named_parameters():
            if "adapter" in name:
                p.normal_(0.0, 0.05)
    return model


def make_qwen3_next(seed: int = 0, vocab: int = VOCAB, layers: int = 4, hidden: int = 64, head_scale: float = 8.0
                    ) -> torch.nn.Module:
    """A random `Qwen3NextForCausalLM`: Gated DeltaNet layers (2 key heads of 16 serving 4 value heads of 16,
    conv width 4) with gated full attention (4 heads of 16, 2 KV heads, partial RoPE) every second layer; a
    mixture of 4 experts (top 2) with a gated shared expert in every layer. Norm weights and decays drawn away
    from the init (the (1 + weight) norms start at 1, the decays near 1)."""
    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, full_attention_interval=2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden,
        shared_expert_intermediate_size=hidden, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, max_position_embeddings=1024)
    model = Qwen3NextForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            elif name.endswith("A_log"):
                p.uniform_(-3.0, 0.5)
            elif name.endswith("dt_bias"):
                p.uniform_(-3.0, 0.5)
    return model.eval()
