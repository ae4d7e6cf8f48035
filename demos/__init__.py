"""Gradio demos: `python demos/app.py` (one tab per modality). The tab logic is importable for tests."""
