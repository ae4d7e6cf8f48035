from multispec import DynamicTree, EngineConfig, StoppingConfig, speculative_generate
from multispec.testing import make_layer_skip_draft, make_target, ragged_prompts
from multispec.trace import StepRecorder, render_steps_html


def test_recorded_steps_rebuild_the_output_along_tree_paths():
    target = make_target("llama")
    ids, mask = ragged_prompts(3, seed=4)
    rec = StepRecorder()
    out = speculative_generate(target, make_layer_skip_draft(target), ids, attention_mask=mask, max_new_tokens=15,
                               tree=DynamicTree(depth=3, topk=2, total=6), engine=EngineConfig(on_step=rec),
                               stopping=StoppingConfig.never())
    assert len(rec.steps) == out.stats.target_forwards
    for row in range(3):
        steps = rec.row(row)
        emitted = [t for st in steps for t in st.emitted][: out.num_new_tokens[row]]
        assert emitted == out.sequences[row, ids.shape[1]:].tolist()
        for st in steps:
            # the accepted nodes form a chain from the root, and their tokens are the emitted prefix
            parent = -1
            for k in st.accepted:
                assert st.nodes[k].parent == parent
                parent = k
            assert [st.nodes[k].token for k in st.accepted] == st.emitted[:-1]
            assert len(st.emitted) == len(st.accepted) + 1
    assert any(len(st.accepted) > 0 for st in rec.row(0))  # the layer-skip pair does accept drafts


def test_html_marks_accepted_rejected_and_bonus():
    rec = StepRecorder()
    target = make_target("llama")
    ids, mask = ragged_prompts(1, seed=1)
    speculative_generate(target, make_layer_skip_draft(target), ids, attention_mask=mask, max_new_tokens=8, tree=3,
                         engine=EngineConfig(on_step=rec), stopping=StoppingConfig.never())
    html = render_steps_html(rec.row(0), decode=lambda t: f"<{t}>")
    steps = rec.row(0)
    assert html.count('class="step"') == len(steps)
    assert html.count('class="acc"') == sum(len(s.accepted) for s in steps)
    assert html.count('class="rej"') == sum(len(s.nodes) - len(s.accepted) for s in steps)
    assert "&lt;" in html and "<0>" not in html  # token text is escaped
