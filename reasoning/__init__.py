"""multispec.reasoning: not built yet; see the project's issues."""
