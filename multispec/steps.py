"""The steps a speculative session runs (`EngineConfig.step`), in a module of their own: the command line offers
them in `multispec generate --help` without loading torch."""

STEPS = ("eager", "static", "compiled")

__all__ = ["STEPS"]
