"""multispec.reasoning: step-level speculation for reasoning models.

- `SpecReason`: the small model writes each step, the base model scores it 0-9 when prompted (`PromptScorer`,
  the paper's; `LogLikelihoodScorer` for bases that cannot follow a prompt) and rewrites the steps it rejects;
- `SpeculativeThinking`: the small model writes, the large model takes over at reflective words;
- `SpeculativeVerdict`: draft experts answer, cross-perplexity consensus keeps the top k, a verdict model
  reads their reasoning and answers (text experts, and VLM experts through `multispec.vision`);
- judge verification is a core rule (`multispec.rules.Judge`); `label_divergences` makes its training data
  on problems with checkable answers.

Each model keeps its cache across steps (a `Writer`: a core `Session` when it drafts, a plain adapter loop
when it decodes alone), so no context is prefilled twice. The zoo pair `arith-reasoning` (byte-level
Llamas on synthetic step-by-step arithmetic) ships a base, a small model and its reflective variant, two more
experts, a styled drafter and judges.
"""

from multispec.plugin import register_entry

from .data import Problem, extract_answer, is_correct, make_problems, read_problems, write_problems
from .evaluate import METHODS, Models, Settings, evaluate
from .judge_data import label_divergences
from .scoring import LogLikelihoodScorer, PromptScorer, StepScorer
from .spec_thinking import SpeculativeThinking, SpeculativeThinkingConfig, Triggers
from .specreason import SpecReason, SpecReasonConfig
from .speculative_verdict import (LikelihoodVerdict, PromptVerdict, SpeculativeVerdict, TextExpert, VisionExpert,
                                  consensus_scores, top_k)
from .steps import PlainWriter, ReasoningOutput, SessionWriter, Step, Writer
from .zoo_pair import load_pair, zoo_entry

register_entry(zoo_entry())

__all__ = ["LikelihoodVerdict", "LogLikelihoodScorer", "METHODS", "Models", "PlainWriter", "Problem", "PromptScorer",
           "PromptVerdict", "ReasoningOutput", "SessionWriter", "Settings", "SpecReason", "SpecReasonConfig",
           "SpeculativeThinking", "SpeculativeThinkingConfig", "SpeculativeVerdict", "Step", "StepScorer", "TextExpert",
           "Triggers", "VisionExpert", "Writer", "consensus_scores", "evaluate", "extract_answer", "is_correct",
           "label_divergences", "load_pair", "make_problems", "read_problems", "top_k", "write_problems"]
