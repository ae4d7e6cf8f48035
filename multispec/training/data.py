"""Training text for a drafter, read from the formats users have: plain text, JSONL of `{"text": ...}`,
ShareGPT-style conversations (`{"conversations": [{"from": "human", "value": ...}, ...]}`) and chat messages
(`{"messages": [{"role": "user", "content": ...}, ...]}`), rendered through the target's chat template.

    docs = read_documents("data.jsonl", tokenizer)     # list[Document]: token ids, and the turns to regenerate
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..chat import turn_format

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")
RECORD_SUFFIXES = (".jsonl", ".json")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
         "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


@dataclass
class Document:
    """One training text as token ids; a conversation also keeps its messages, so that the target can write
    the assistant turns itself (self-distillation)."""

    ids: list[int]
    messages: list[dict] | None = None
    source: str = ""


@dataclass
class TextData:
    """Documents split by a fixed rule into training and held-out ones (the held-out ones prompt the accepted
    length measured after training)."""

    train: list[Document]
    heldout: list[Document] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(d.ids) for d in self.train)


def files_of(path: str | Path) -> list[Path]:
    """`path` itself, or every text or record file under a folder (sorted); a clear error for anything else."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + RECORD_SUFFIXES)
        if not found:
            raise ValueError(f"--data: {path} holds no {', '.join(TEXT_SUFFIXES + RECORD_SUFFIXES)} files")
        return found
    raise FileNotFoundError(f"--data: {path} does not exist")


def records(path: Path) -> Iterable[tuple[str, dict]]:
    """(where, record) of a JSONL file (one object a line) or a JSON file (a list of objects)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"--data: {path} must hold a JSON list of records")
        yield from ((f"{path}[{i}]", r) for i, r in enumerate(data))
        return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield f"{path}:{n}", json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"--data: {path}:{n} is not JSON ({err.msg})") from None


def messages_of(record: dict, where: str) -> list[dict] | None:
    """A record's conversation as `[{"role", "content"}]` (ShareGPT's `from`/`value` mapped), or None for a
    plain `text` record; a record with neither names itself."""
    if "text" in record:
        return None
    turns = record.get("messages", record.get("conversations"))
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"--data: {where}: expected a 'text', 'messages' or 'conversations' field")
    out = []
    for turn in turns:
        role = ROLES.get(str(turn.get("role", turn.get("from", ""))).lower())
        content = turn.get("content", turn.get("value"))
        if role is None or not isinstance(content, str):
            raise ValueError(f"--data: {where}: a turn needs a role (user / assistant / system, or ShareGPT's "
                             f"human / gpt) and a text, got {turn!r:.80}")
        out.append({"role": role, "content": content})
    return out


def render(messages: list[dict], tokenizer, add_generation_prompt: bool = False) -> str:
    """A conversation as the target reads it: its chat template when the tokenizer has one, else the turn format
    `multispec.chat` gives it (Gemma's turn markers when its vocabulary has them, else plain role prefixes), the
    one `multispec eval chat` and `Conversation` write, so a head trains on the text it will draft."""
    fmt = turn_format(tokenizer)
    if fmt is None:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return fmt.render(_system_folded(messages), add_generation_prompt)


def _system_folded(messages: list[dict]) -> list[dict]:
    """System messages put before the next user turn's text (Gemma's own template does the same): the turn formats
    write user and assistant turns only."""
    out, pending = [], []
    for m in messages:
        if m["role"] == "system":
            pending.append(m["content"])
        elif m["role"] == "user" and pending:
            out.append({"role": "user", "content": "\n\n".join([*pending, m["content"]])})
            pending = []
        else:
            out.append(m)
    return out


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` (a `transformers` tokenizer, or any callable returning {"input_ids": ...})."""
    ids = tokenizer(text)["input_ids"]
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def read_documents(path: str | Path, tokenizer) -> list[Document]:
    """Every document under `path`, tokenized (see the module docstring)."""
    docs = []
    files = list(files_of(path))
    for file in tqdm(files, desc="reading --data", unit="file", leave=False, disable=len(files) < 20):
        if file.suffix in RECORD_SUFFIXES:
            for where, record in records(file):
                messages = messages_of(record, where)
                text = record["text"] if messages is None else render(messages, tokenizer)
                if not isinstance(text, str):
                    raise ValueError(f"--data: {where}: 'text' must be a string")
                docs.append(Document(encode(tokenizer, text), messages, where))
        else:
            docs.append(Document(encode(tokenizer, file.read_text(encoding="utf-8")), None, str(file)))
    docs = [d for d in docs if len(d.ids) >= 2]
    if not docs:
        raise ValueError(f"--data: {path} holds no text")
    return docs


def split(docs: list[Document], heldout: float = 0.05, min_heldout: int = 1) -> TextData:
    """Every twentieth document (by `heldout`) held out, the rest for training; a single document is split
    at 1 - `heldout` of its tokens."""
    if len(docs) == 1:
        ids = docs[0].ids
        cut = max(2, int(len(ids) * (1 - heldout)))
        return TextData([Document(ids[:cut], None, docs[0].source)], [Document(ids[cut:], None, docs[0].source)])
    every = max(2, round(1 / heldout)) if heldout > 0 else len(docs) + 1
    held = [d for i, d in enumerate(docs) if i % every == every - 1]
    if len(held) < min_heldout and heldout > 0:
        held = docs[-min_heldout:]
    train = [d for d in docs if all(d is not h for h in held)]
    return TextData(train, held)


def chunks(docs: list[Document], seq_len: int) -> list[list[int]]:
    """Training sequences of `seq_len` tokens: the documents concatenated and cut (a short tail dropped)."""
    stream = [t for d in docs for t in d.ids]
    return [stream[i: i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


__all__ = ["Document", "TextData", "chunks", "encode", "files_of", "messages_of", "read_documents", "render",
           "split"]
