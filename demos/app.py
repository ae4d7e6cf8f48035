"""multispec demos: `python demos/app.py [--port N] [--share]` (needs `pip install -e ".[demo]"`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from demos import continuous_tab, image_tab, reasoning_tab, ssm_tab, text_tab, vision_tab  # noqa: E402


def build(target: str | None = None, draft: str | None = None):
    """The app; `target` (a causal LM folder) and `draft` (as `multispec generate --draft` takes it) add the
    user's own checkpoint to the Text tab, as its default pair."""
    import gradio as gr

    if target is not None:
        text_tab.add_checkpoint(target, draft)

    # short tab titles: longer ones pushed the last tab into an overflow menu at 1,400 px
    with gr.Blocks(title="multispec") as app:
        gr.Markdown("# multispec: speculative generation beyond plain text")
        with gr.Tab("Text"):
            text_tab.build()
        with gr.Tab("State-space (STree)"):
            ssm_tab.build()
        with gr.Tab("Vision-language"):
            vision_tab.build()
        with gr.Tab("Image AR (LANTERN)"):
            image_tab.build()
        with gr.Tab("Image AR, continuous"):
            continuous_tab.build()
        with gr.Tab("Reasoning"):
            reasoning_tab.build()
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true")
    args = parser.parse_args()
    build().launch(server_port=args.port, share=args.share)


if __name__ == "__main__":
    main()
