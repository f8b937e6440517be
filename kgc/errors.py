"""One exception type for bad input: the CLI prints its message and exits 2, no traceback."""

from __future__ import annotations


class KGCError(Exception):
    """User-facing error: the message names the file/line/key at fault and the fix."""


class UnknownName(KGCError):
    """A name that names nothing of its kind, with what it might have meant — for a caller that answers
    structurally (an HTTP 404 with suggestions) rather than by printing the message.

    ``kind``: what was looked up ("head", "relation", "entity"); ``name``: the string asked; ``suggestions``: near
    misses, best first, each a string that resolves when given back (may be empty); ``valid``: every valid name
    when they are few enough to list (relations), else None."""

    def __init__(self, message: str, *, kind: str, name: str, suggestions: "list[str] | tuple[str, ...]" = (),
                 valid: "list[str] | None" = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.suggestions = list(suggestions)
        self.valid = None if valid is None else list(valid)

    def __reduce__(self):  # keyword-only attributes survive pickling (worker processes, multiprocessing)
        return (_unknown_name, (str(self), self.kind, self.name, self.suggestions, self.valid))


def _unknown_name(message: str, kind: str, name: str, suggestions: list[str], valid: "list[str] | None"):
    return UnknownName(message, kind=kind, name=name, suggestions=suggestions, valid=valid)


class ResultsNotSaved(KGCError):
    """An evaluation that ran whose files could not be written (a read-only or full run folder): the message says
    why and the fix; ``evaluation`` holds the figures, so they are not lost (``kgc evaluate`` prints them first)."""

    def __init__(self, message: str, evaluation: object) -> None:
        super().__init__(message)
        self.evaluation = evaluation


class RunBusy(KGCError):
    """A run directory's lock is held by another writer (``kgc serve`` answers 409 Conflict)."""


class DiskFull(KGCError):
    """A write refused for space (a full disk, a quota, a file-size limit), or one that would not fit: the message
    names the folder, the bytes needed and the fix; whatever was there before is intact (``kgc serve``: 507)."""


class ServiceStopping(KGCError):
    """``kgc serve`` is stopping (SIGTERM) and did not begin this work: answered 503, nothing was changed."""


def validated(model, values, *, strict: bool = False, what: str | None = None):
    """``model`` (a pydantic model class) from the mapping ``values``, or one KGCError naming the first bad or
    unknown option (:func:`problem`): the one way kgc turns options given in Python, on a command line or over
    HTTP into the model that declares them (:class:`kgc.serve.Limits`, the evaluation's options, a query's).
    ``strict``: no coercion (``"2"`` is not an int); ``what``: how the message names the model."""
    from pydantic import ValidationError

    try:
        return model.model_validate(dict(values), strict=strict)
    except ValidationError as exc:
        raise KGCError(problem(model, exc, what=what)) from None


def problem(model, exc, *, what: str | None = None) -> str:
    """The first error of ``model``'s validation ``exc`` as one sentence naming the option: an unknown one with the
    options ``model`` (or ``what``) takes, a rule of the model's own in its own words, a value of the wrong type
    with the type it must be, any other with pydantic's reason and the value given."""
    e = exc.errors()[0]
    key = ".".join(str(x) for x in e.get("loc", ())) or "options"
    if e["type"] == "extra_forbidden":
        return f"unknown option {key!r}; {what or model.__name__} takes {', '.join(model.model_fields)}"
    if e["type"] == "value_error":  # a rule of the model's own: its sentence, whole
        return str(e["ctx"]["error"])
    field = model.model_fields.get(key)
    if field is not None and e["type"].endswith("_type"):  # "2" for an int, 1 for a bool (strict)
        kind = getattr(field.annotation, "__name__", str(field.annotation))
        return f"{key} must be {kind}, got {e.get('input')!r}"
    return f"{key}: {e['msg']} (got {e.get('input')!r})"
