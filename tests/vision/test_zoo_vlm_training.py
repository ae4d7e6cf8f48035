"""The zoo VLM's training: scene labels, the vision tower's pretraining, a VLM run cut off mid-way resuming to
the same weights, and the whole `vqa-llava` recipe in its quick form."""

from dataclasses import replace

import pytest
import torch

from multispec.vision import zoo_vlm
from multispec.vision.tower import ATTRIBUTES, pretrain_tower, scene_labels
from multispec.vision.vqa_synth import MAX_SLOTS, Scene, SceneItem, generate_vqa
from multispec.vision.zoo_vlm import VLMRecipe, VQAProcessor, load_vlm, train_vlm

TINY = VLMRecipe(layers=1, hidden=64, steps=6, batch_size=2, warmup=1)


def test_every_sample_carries_its_scene():
    bar, line, shapes, table = generate_vqa(4, seed=5)
    assert [s.scene.kind for s in (bar, line, shapes, table)] == ["bar", "line", "shapes", "table"]
    assert all(len(s.scene.slots) == MAX_SLOTS for s in (bar, line, shapes, table))
    # the description lists what the scene holds
    listed = ", ".join(f"{i.colour} {i.value}" for i in bar.scene.slots if i is not None)
    assert listed in bar.answer, (listed, bar.answer)
    assert all(i.value in range(10) for i in table.scene.slots if i is not None)


def test_scene_labels():
    scene = Scene("shapes", (SceneItem("red", None, "circle"), None, None, SceneItem("blue", None, "triangle"),
                             None, None))
    labels = scene_labels([scene, Scene("table", (SceneItem(value=0),) + (None,) * 5)])
    assert labels["kind"].tolist() == [2, 3]
    assert labels["colour"][0].tolist() == [1, 0, 0, 3, 0, 0]  # red is colour 1, blue 3; 0 = none
    assert labels["shape"][0].tolist() == [1, 0, 0, 3, 0, 0]
    assert labels["value"][1].tolist() == [1, 0, 0, 0, 0, 0]  # digit 0 is class 1 (0 = no value)
    assert set(labels) == set(ATTRIBUTES) | {"kind"}


def test_tower_pretraining_learns_the_kind():
    from transformers import SiglipVisionModel

    torch.manual_seed(0)
    tower = SiglipVisionModel(zoo_vlm.vlm_config(1, 64).vision_config)
    before = {k: v.clone() for k, v in tower.state_dict().items()}
    report = pretrain_tower(tower, VQAProcessor().pixels, steps=60, batch_size=16, lr=3e-3)
    assert report["held_out_accuracy"]["kind"] > 0.9, report  # chance: 0.25
    assert any(not torch.equal(before[k], v) for k, v in tower.state_dict().items())


def test_a_cut_off_vlm_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    train_vlm(tmp_path / "whole", TINY, checkpoint_every=2)
    original = zoo_vlm.training_stream

    def cut_stream(recipe, processor):
        batch = original(recipe, processor)

        def cut(step):
            if step == 4:  # after the checkpoint at step 4
                raise KeyboardInterrupt
            return batch(step)
        return cut

    monkeypatch.setattr(zoo_vlm, "training_stream", cut_stream)
    with pytest.raises(KeyboardInterrupt):
        train_vlm(tmp_path / "cut", TINY, checkpoint_every=2)
    assert (tmp_path / "cut" / "resume.pt").exists()
    monkeypatch.setattr(zoo_vlm, "training_stream", original)
    report = train_vlm(tmp_path / "cut", TINY, checkpoint_every=2)
    assert not (tmp_path / "cut" / "resume.pt").exists() and report["recipe"]["steps"] == 6
    a, b = load_vlm(tmp_path / "whole"), load_vlm(tmp_path / "cut")
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert train_vlm(tmp_path / "cut", TINY) == report  # finished: read back, not retrained
    with pytest.raises(ValueError, match="another recipe"):
        monkeypatch.setattr(zoo_vlm, "training_stream", cut_stream)
        with pytest.raises(KeyboardInterrupt):
            train_vlm(tmp_path / "other", TINY, checkpoint_every=2)
        train_vlm(tmp_path / "other", replace(TINY, lr=0.5), checkpoint_every=2)


def test_int8_storage_loads_as_the_llava_class(tmp_path):
    from transformers import LlavaForConditionalGeneration

    report = train_vlm(tmp_path / "vlm", TINY, int8=True)
    model = load_vlm(tmp_path / "vlm")
    assert isinstance(model, LlavaForConditionalGeneration) and report["storage"] == "int8"
    assert not (tmp_path / "vlm" / "model.safetensors").exists()


def test_the_quick_pair_trains_loads_and_is_not_retrained(tmp_path):
    from multispec.vision.zoo_pair import DRAFTERS, load_assistant, load_drafters, load_pair, train_pair

    report = train_pair(tmp_path, quick=True)
    assert {"tower", "target", "assistant", *DRAFTERS} <= set(report)
    assert report["target"]["pretrained_tower"] and report["target"]["storage"] == "int8"
    pair = load_pair(tmp_path)
    assert set(load_drafters(pair.target, tmp_path)) == set(DRAFTERS)
    assert load_assistant(tmp_path).config.text_config.num_hidden_layers == 1
    assert not (tmp_path / "tower.pt").exists()  # scratch files go once the pair is done
    assert not list(tmp_path.rglob("checkpoint.pt"))
    assert train_pair(tmp_path, quick=True) == report
