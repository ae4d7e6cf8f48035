"""multispec.vision: not built yet; see the project's issues."""
