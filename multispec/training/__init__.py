"""Training drafters for a user's own target (`multispec train draft`): data in the usual formats
(`data`), self-distillation (`regenerate`), the target's features (`features`), the drafter kinds (`kinds`),
the resumable, data-parallel loop (`loop`) and the command's run (`draft`)."""

from .draft import DraftRun, train_draft
from .kinds import KINDS, DraftKind, KindOptions, register_kind
from .loop import LoopConfig, TrainLoop

__all__ = ["DraftKind", "DraftRun", "KINDS", "KindOptions", "LoopConfig", "TrainLoop", "register_kind", "train_draft"]
