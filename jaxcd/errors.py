"""Exceptions raised by jaxcd. Each names what is wrong and, where it can, where."""

from __future__ import annotations


class JaxcdError(Exception):
    """Base class of every error jaxcd raises on purpose."""


class RegexSyntaxError(JaxcdError, ValueError):
    """The regular expression does not parse (message carries the position)."""


class UnsupportedRegexError(JaxcdError, ValueError):
    """The regular expression uses a construct that is not regular (back-reference,
    look-around, ...) or a flag that jaxcd does not implement."""


class UnsupportedSchemaError(JaxcdError, ValueError):
    """The JSON Schema uses a keyword or value that the compiler does not support."""


class SchemaError(JaxcdError, ValueError):
    """The JSON Schema itself is malformed (not JSON, not an object, ...)."""


class EmptyLanguageError(JaxcdError, ValueError):
    """The constraint accepts no string at all (or no string spelled by whole tokens)."""


class BudgetTooSmallError(JaxcdError, ValueError):
    """No output of the constraint fits in the token budget.

    Attributes:
      budget: the budget that was asked for.
      min_budget: the smallest budget (tokens, EOS included) that works.
    """

    def __init__(self, budget: int, min_budget: int, what: str = "the constraint"):
        self.budget = budget
        self.min_budget = min_budget
        super().__init__(
            f"{what} cannot be met within a budget of {budget} tokens (EOS included); "
            f"the smallest budget that works is {min_budget}"
        )


class PrefixRejectedError(JaxcdError, ValueError):
    """A token prefix leaves the constraint's language (message names the position)."""


class AutomatonTooLargeError(JaxcdError, ValueError):
    """A compiler stage would exceed one of its size limits (:class:`jaxcd.CompileLimits`).

    Raised before the memory is allocated. Attributes (``None`` when raised with a bare
    message):
      limit: the name of the limit (a ``CompileLimits`` field, e.g. ``"max_dfa_states"``).
      value: its value.
      needed: the size that would be needed (a lower bound where the stage stopped early).
      stage: the compiler stage (``"determinise"``, ``"lift"``, ...).
      part: the constraint part responsible (a regex, a sub-pattern, a JSON pointer).
    """

    def __init__(self, message: str | None = None, *, limit: str | None = None,
                 value: int | None = None, needed: int | None = None, unit: str = "",
                 stage: str | None = None, part: str | None = None, at_least: bool = False):
        self.limit, self.value, self.needed, self.stage, self.part = limit, value, needed, stage, part
        if message is None:
            need = f"{'at least ' if at_least else ''}{needed:,}{' ' + unit if unit else ''}"
            what = part or "the constraint"
            message = (f"{stage}: {what} needs {need}, over the limit {limit}={value:,}; "
                       f"simplify it (e.g. smaller repetition bounds) or raise the limit "
                       f"with limits=jaxcd.CompileLimits({limit}=...)")
        super().__init__(message)


class VocabularyError(JaxcdError, ValueError):
    """A tokenizer or vocabulary could not be read or does not match."""


class ModelFileError(JaxcdError, ValueError):
    """A model file (GGUF) is missing, corrupt or unsupported."""
