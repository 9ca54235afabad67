"""A vocabulary of one token per printable ASCII byte (EOS is token 0), and acceptance of
a text by a tensorized automaton over it: the byte-level reference many JSON Schema
tests walk (token ``c - 31`` is the byte ``c``)."""

from __future__ import annotations

from jaxcd import Vocabulary

VOCAB = Vocabulary.from_token_bytes([b"<eos>"] + [bytes([c]) for c in range(32, 127)],
                                    eos_id=0)


def accepts(fa, text: str) -> bool:
    """Whether ``fa`` (over :data:`VOCAB`) accepts ``text`` followed by EOS."""
    q = int(fa.initial_state)
    for c in text.encode():
        q = fa.next_state(q, c - 31)
        if q == int(fa.dead_state):
            return False
    return fa.next_state(q, 0) == int(fa.final_state)
