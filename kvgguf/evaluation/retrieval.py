"""Long-range recall: facts hidden at several depths of long unrelated text, asked for at the end.

Average KL over WikiText hides what compression loses first: a token the model must find again
after it has aged out of the exact window. Each document is WikiText-2 (a different stretch per
document) with one short fact planted at each depth, every fact about a different subject and
with its own random 4-digit number. The document is decoded once; then each fact is asked for in
turn (question appended, a few tokens greedy, context rolled back to the document's end, as a chat
client regenerating does). A trial counts as found when the answer's first number is the planted
one. Run the same documents through llama.cpp's own f16 cache in the same run as the reference.

A context that moves (a context shift, a budget's drops) may lose a fact before it is asked for:
each trial says whether the fact's tokens were all still held when the document ended, so a moved
run's found facts compare with the unmoved run's on the facts both held.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

SUBJECTS = (
    "the harbour gate",
    "the copper safe",
    "the north tower",
    "the garden shed",
    "the red locker",
    "the east archive",
    "the old lighthouse",
    "the silver trunk",
    "the west bridge",
    "the glass cabinet",
    "the mill door",
    "the chapel bell",
    "the lower cellar",
    "the iron chest",
    "the train depot",
)
# (planted sentence, question and the start of the answer): several wordings, so a result does not
# hinge on one phrasing. The answer is primed so that a small model's next tokens are the number.
FORMS = (
    (" The code of {s} is {n}.", "\n\nQuestion: What is the code of {s}?\nAnswer: The code of {s} is"),
    (" Remember this: the number for {s} is {n}.", "\n\nWhich number was given for {s}? The number for {s} is"),
    (
        " Note that the combination to {s} is {n}.",
        "\n\nQ: What is the combination to {s}?\nA: The combination to {s} is",
    ),
)
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)  # where the facts sit, as fractions of the document
ANSWER_TOKENS = 7
QUESTION_ROOM = 64  # context kept free after the document for a question and its answer


@dataclass(frozen=True)
class Fact:
    subject: str
    number: str
    form: int

    @property
    def sentence(self) -> str:
        return FORMS[self.form][0].format(s=self.subject, n=self.number)

    @property
    def question(self) -> str:
        return FORMS[self.form][1].format(s=self.subject)


@dataclass(frozen=True)
class Document:
    tokens: list[int]  # BOS first
    facts: list[Fact]
    positions: list[int]  # token position of each fact's first token
    lengths: list[int]  # each fact's tokens


@dataclass(frozen=True)
class Trial:
    document: int
    depth: float
    position: int  # of the fact's first token
    distance: int  # tokens from the fact to the end of the document
    subject: str
    expected: str
    answer: str
    found: bool
    held: bool = True  # every token of the fact still in the context at the document's end


def documents(
    tokenize: Callable[[str], list[int]],
    bos: int,
    n_tokens: int,
    n_documents: int,
    text: str,
    depths: Sequence[float] = DEPTHS,
    seed: int = 0,
) -> list[Document]:
    """n_documents of n_tokens each (BOS included): filler from `text`, a fact at each depth.
    Deterministic for (text, tokenizer, seed)."""
    rng = random.Random(seed)
    out = []
    chars = 6 * n_tokens  # enough characters of filler for n_tokens (about 4.5 per token)
    for d in range(n_documents):
        start = text.find("\n", (d * chars * 7919) % max(len(text) - chars, 1)) + 1
        filler = tokenize(text[start : start + chars])
        subjects = rng.sample(SUBJECTS, len(depths))
        facts = [Fact(s, str(rng.randrange(1000, 10000)), rng.randrange(len(FORMS))) for s in subjects]
        planted = [tokenize(f.sentence) for f in facts]
        n_filler = n_tokens - 1 - sum(len(p) for p in planted)
        if len(filler) < n_filler:
            raise ValueError(f"the filler text gives {len(filler)} tokens, fewer than the {n_filler} needed")
        body: list[int] = []
        positions = []
        cuts = [round(depth * n_filler) for depth in depths]
        prev = 0
        for cut, fact_tokens in zip(cuts, planted):
            body += filler[prev:cut]
            positions.append(1 + len(body))
            body += fact_tokens
            prev = cut
        body += filler[prev:n_filler]
        out.append(Document([bos] + body, facts, positions, [len(p) for p in planted]))
    return out


def first_number(answer: str) -> Optional[str]:
    m = re.search(r"\d+", answer)
    return m.group(0) if m else None


def greedy_answer(llm, n_tokens: int) -> tuple[str, int]:
    """Up to n_tokens greedy tokens after what llm holds (stopping at end of text): the first
    line of their text, and how many were generated."""
    out: list[int] = []
    for _ in range(n_tokens):
        tok = llm.sample(temp=0.0)
        if tok == llm.token_eos():
            break
        out.append(tok)
        llm.eval([tok])
    return llm.detokenize(out).decode("utf-8", errors="replace").split("\n")[0].strip(), len(out)


def ask(
    llm,
    doc: Document,
    on_trial: Optional[Callable[[Trial], None]] = None,
    index: int = 0,
    depths: Sequence[float] = DEPTHS,
) -> list[Trial]:
    """Decodes doc into llm (from an empty context) and asks for each of its facts. A context
    that moves goes back to the document's end by its saved state (a question may shift it or
    drop a block, and then no count of tokens is the document's end); others by n_tokens."""
    llm.reset()
    llm.eval(doc.tokens)
    end = llm.n_tokens
    moves = getattr(llm, "moves", False)
    held = set(llm.history_index().tolist()) if moves else None
    state = llm.save_state() if moves else None
    trials = []
    for k, (depth, fact, pos, n) in enumerate(zip(depths, doc.facts, doc.positions, doc.lengths)):
        if k and state is not None:
            llm.load_state(state)
        llm.n_tokens = end  # drop the previous question and answer: its rows are rewritten
        llm.eval(llm.tokenize(fact.question.encode("utf-8"), add_bos=False))
        answer, _ = greedy_answer(llm, ANSWER_TOKENS)
        trial = Trial(
            index,
            depth,
            pos,
            len(doc.tokens) - pos,
            fact.subject,
            fact.number,
            answer,
            first_number(answer) == fact.number,
            held is None or held.issuperset(range(pos, pos + n)),
        )
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
    if state is not None:
        llm.load_state(state)
    llm.n_tokens = end
    return trials


def summary(trials: Sequence[Trial]) -> dict:
    """found / asked overall and per depth."""
    by_depth: dict = {}
    for t in trials:
        f, n = by_depth.get(t.depth, (0, 0))
        by_depth[t.depth] = (f + t.found, n + 1)
    return {
        "found": sum(t.found for t in trials),
        "asked": len(trials),
        "held": sum(t.held for t in trials),
        "found_held": sum(t.found and t.held for t in trials),
        "by_depth": {str(d): list(v) for d, v in sorted(by_depth.items())},
        "trials": [asdict(t) for t in trials],
    }
