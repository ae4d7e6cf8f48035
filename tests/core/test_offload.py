"""A target too big for one device, loaded with `device_map` (accelerate's dispatch): here some layers offloaded
to disk and the rest on the CPU, their weights moved in by hooks around each module's forward. The lean forward
reads weights itself, so a dispatched model runs through its own forward; trees verify losslessly."""

import torch
from transformers import AutoModelForCausalLM

from multispec import DynamicTree, ModelDrafter, speculative_generate
from multispec.targets.hf import HFCausalLM
from multispec.targets.lean import dispatched
from multispec.targets.resolve import as_target
from multispec.testing import make_perturbed_copy, make_target


def test_a_disk_offloaded_target_verifies_trees_losslessly(tmp_path):
    model = make_target("llama", seed=3)
    model.save_pretrained(tmp_path / "target")
    layers = model.config.num_hidden_layers
    device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk",
                  **{f"model.layers.{i}": "disk" if i % 2 == 0 else "cpu" for i in range(layers)}}
    offloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "target", device_map=device_map,
                                                     offload_folder=tmp_path / "offload").eval()
    assert dispatched(offloaded) and not dispatched(model)
    assert any(p.device.type == "meta" for p in offloaded.parameters())  # really on disk until used
    assert isinstance(as_target(offloaded), HFCausalLM)  # not the lean forward, which would read meta weights
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.02))
    ids = torch.randint(3, model.config.vocab_size, (2, 12))
    reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    out = speculative_generate(offloaded, draft, ids, max_new_tokens=24, tree=DynamicTree(3, 2, 6))
    assert torch.equal(out.sequences, reference)
    assert out.stats.mean_accepted_length > 1.5  # drafts accepted: the tree path ran, not plain decoding
