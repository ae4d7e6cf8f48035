"""Does `speculators` load an EAGLE-3 head written here, unchanged, and compute what we compute?

Two environments, since `speculators` pins a `transformers` older than this project's floor for state-space
models (0.9.0: transformers <= 5.19):

    # 1. here: a tiny target, a head trained by the CLI in the speculators layout, our logits on fixed inputs
    python benchmarks/probes/speculators_check.py write /tmp/spec_check
    # 2. in a virtual environment with `pip install torch==2.14.1 speculators==0.9.0` (no multispec there)
    python benchmarks/probes/speculators_check.py check /tmp/spec_check

    # 3. the other way: speculators writes a head (theta 500000, llama3 scaling, norm_before_residual true) and
    #    its logits (speculators' environment); multispec reads it and compares (here)
    python benchmarks/probes/speculators_check.py foreign /tmp/spec_check
    python benchmarks/probes/speculators_check.py read /tmp/spec_check

`check` loads the head with `SpeculatorModel.from_pretrained(folder)` (the folder as written; only the attention
implementation is chosen at load, "sdpa": speculators' default flex attention fails on the CPU), runs its forward
on the same fused target layers and tokens, takes the first step's draft logits from its LM head and prints the
largest difference from ours, the fused layer ids it read, and its config's fields. Results:
docs/benchmarks/text.md ("EAGLE-3 heads in speculators' layout").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def write(folder: Path, steps: int) -> None:
    import torch

    # multispec is optional here: `check` and `foreign` run where speculators is installed, without it
    from multispec.drafters.eagle3 import Eagle3Config, Eagle3Head  # optional (see above)
    from multispec.testing import make_target, save_checkpoint  # optional (see above)

    folder.mkdir(parents=True, exist_ok=True)
    target = make_target("llama", seed=3, layers=6)
    save_checkpoint(folder / "target", target)
    data = folder / "data.txt"
    words = " ".join(f"w{3 + (i * 7919) % 120}" for i in range(6000))
    data.write_text(words)
    cmd = [sys.executable, "-m", "multispec", "train", "draft", "--target", str(folder / "target"), "--data", str(data),
           "--out", str(folder / "head"), "--kind", "eagle3", "--format", "speculators", "--steps", str(steps),
           "--seq-len", "64", "--batch-size", "4", "--draft-vocab", "96", "--aux-layers", "1,3,5",
           "--eval-prompts", "2", "--checkpoint-every", "0"]
    subprocess.run(cmd, check=True)
    # a second head, random, with what speculators trains and Llama 3 ships: the normed residual, theta 500000 and
    # llama3 scaling (written by `save`, as `train draft --format speculators` writes)
    trained = Eagle3Head.load(folder / "head", target=target)
    variant = Eagle3Config(**{**trained.eagle.__dict__, "extra": {}, "norm_before_residual": True,
                              "rope_theta": 500000.0, "rope_scaling": dict(
                                  rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=16)})
    torch.manual_seed(1)
    Eagle3Head(variant, trained.d2t).save(folder / "variant", layout="speculators", target=target,
                                          verifier=str(folder / "target"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (1, 24), generator=g)
    for name in ("head", "variant"):
        head = Eagle3Head.load(folder / name, target=target)
        with torch.no_grad():
            states = target(ids, output_hidden_states=True).hidden_states
            aux = torch.cat([states[i] for i in head.eagle.aux_layers], dim=-1)  # [1, S, 3H]
            # our convention: position t reads the embedding of token t + 1 and the fused feature of position t
            emb = target.get_input_embeddings()(ids[:, 1:])
            g_fused = head.fuse_target({i: states[i][:, :-1] for i in head.eagle.aux_layers})
            logits = head(torch.cat([emb, g_fused], -1)).logits
        torch.save({"aux": aux[:, :-1].contiguous(), "tokens": ids[:, 1:].contiguous(), "logits": logits},
                   folder / name / "reference.pt")
    print(json.dumps({"written": [str(folder / "head"), str(folder / "variant")]}))


def check(folder: Path) -> None:
    for name in ("head", "variant"):
        _check_one(folder / name)


def _check_one(head: Path) -> None:
    import torch
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    ref = torch.load(head / "reference.pt")
    config = Eagle3SpeculatorConfig.from_pretrained(str(head))
    config.transformer_layer_config._attn_implementation = "sdpa"  # the layer's, read when the model is built
    model = SpeculatorModel.from_pretrained(str(head), config=config).float().eval()  # fp16 on disk
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, _a, out: seen.append(out))
    n = ref["tokens"].shape[1]
    with torch.no_grad():
        model(hidden_states=ref["aux"].float(), input_ids=ref["tokens"], document_ids=torch.zeros(1, n, dtype=torch.long),
              ttt_steps=1)
    hook.remove()
    diff = (seen[0].float() - ref["logits"].float()).abs().max().item()
    print(json.dumps({"folder": str(head), "loaded_as": type(model).__name__, "max_abs_logit_difference": diff,
                      "argmax_equal": bool(torch.equal(seen[0].argmax(-1), ref["logits"].argmax(-1))),
                      "aux_layers": model.config.eagle_aux_hidden_state_layer_ids,
                      "norm_before_residual": model.config.norm_before_residual,
                      "draft_vocab_size": model.config.draft_vocab_size,
                      "target_vocab_size": model.config.transformer_layer_config.vocab_size,
                      "rope": getattr(model.config.transformer_layer_config, "rope_parameters", None),
                      "embeddings_finite": bool(torch.isfinite(model.embed_tokens.weight).all())}, indent=2))


def foreign(folder: Path) -> None:
    """speculators' own head for the target `write` saved: random weights, its embeddings the target's."""
    import torch
    from safetensors.torch import load_file
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, LlamaConfig

    verifier = AutoConfig.from_pretrained(folder / "target")
    layer = LlamaConfig(vocab_size=verifier.vocab_size, hidden_size=verifier.hidden_size, intermediate_size=96,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0, original_max_position_embeddings=16))
    layer._attn_implementation = "sdpa"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=96, norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=[1, 3, 5],
        speculators_config=SpeculatorsConfig(algorithm="eagle3", default_proposal_method="greedy",
                                             proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                                             verifier=VerifierConfig(name_or_path=None,
                                                                     architectures=["LlamaForCausalLM"])))
    torch.manual_seed(2)
    model = Eagle3DraftModel(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name not in ("embed_tokens.weight", "verifier_lm_head.weight"):
                p.copy_(0.1 * torch.randn_like(p))
        model.embed_tokens.weight.copy_(load_file(folder / "target" / "model.safetensors")["model.embed_tokens.weight"])
        ids = torch.randperm(verifier.vocab_size, generator=torch.Generator().manual_seed(3))[:96].sort().values
        model.d2t.copy_(ids - torch.arange(96))
        model.t2d.zero_()
        model.t2d[ids] = True
    model.save_pretrained(folder / "foreign")
    ref = torch.load(folder / "head" / "reference.pt")
    seen = []
    hook = model.lm_head.register_forward_hook(lambda _m, _a, out: seen.append(out))
    n = ref["tokens"].shape[1]
    with torch.no_grad():
        model.eval()(hidden_states=ref["aux"].float(), input_ids=ref["tokens"],
                     document_ids=torch.zeros(1, n, dtype=torch.long), ttt_steps=1)
    hook.remove()
    torch.save({**ref, "logits": seen[0]}, folder / "foreign" / "reference.pt")
    print(json.dumps({"written": str(folder / "foreign")}))


def read(folder: Path) -> None:
    """The head speculators wrote, read here: its config as we read it, our logits against speculators'."""
    import torch

    from multispec.drafters.eagle3 import Eagle3Head  # optional: not where speculators runs (see `write`)
    from multispec.testing import make_target  # optional: likewise

    target = make_target("llama", seed=3, layers=6)
    head = Eagle3Head.load(folder / "foreign", target=target)
    ref = torch.load(folder / "foreign" / "reference.pt")
    with torch.no_grad():
        g = torch.tensor_split(ref["aux"], 3, dim=-1)
        fused = head.fuse_target(dict(zip(head.eagle.aux_layers, g)))
        emb = target.get_input_embeddings()(ref["tokens"])
        logits = head(torch.cat([emb, fused], -1)).logits
    c = head.eagle
    print(json.dumps({"rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
                      "norm_before_residual": c.norm_before_residual, "aux_layers": list(c.aux_layers),
                      "draft_vocab_size": c.draft_vocab_size, "target_vocab_size": c.target_vocab_size,
                      "own_embeddings": head.embed_tokens is not None,
                      "max_abs_logit_difference": (logits - ref["logits"]).abs().max().item(),
                      "argmax_equal": bool(torch.equal(logits.argmax(-1), ref["logits"].argmax(-1)))}, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["write", "check", "foreign", "read"])
    p.add_argument("folder", type=Path)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    if args.mode == "write":
        write(args.folder, args.steps)
    else:
        {"check": check, "foreign": foreign, "read": read}[args.mode](args.folder)


if __name__ == "__main__":
    main()
