"""multispec.image_ar: not built yet; see the project's issues."""
