"""multispec.ssm: not built yet; see the project's issues."""
