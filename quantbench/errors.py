"""The errors quantbench raises on purpose. Each names the field or tensor at fault and the fix."""


class QuantbenchError(Exception):
    """Base class: an expected failure with a message meant for a person."""


class RequestError(QuantbenchError, ValueError):
    """A decision request (or suite record) is invalid. `field` is a dotted path such as `questions.action.criteria`."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}" + (f" ({fix})" if fix else ""))


class ContextLengthError(RequestError):
    """The rendered prompt is longer than the model's context and truncation was not asked for."""

    def __init__(self, field: str, tokens: int, limit: int, *, truncated: bool = False):
        self.tokens, self.limit = tokens, limit
        if truncated:  # truncation was allowed and cut the state: what is left over is the question's own
            problem = (f"the prompt is {tokens} tokens with its state cut by truncation, over the model's limit of "
                       f"{limit}: the question and its options alone do not fit")
            fix = "shorten the question's text or its options, or send fewer options"
        else:
            problem = f"the prompt is {tokens} tokens, over the model's limit of {limit}"
            fix = "shorten the state, or allow truncation (--truncate / truncate=True), which is recorded on each answer"
        super().__init__(field, problem, fix)


class LoadError(QuantbenchError):
    """A checkpoint cannot be loaded completely and exactly (missing / unexpected tensors, unknown format)."""


class UnsupportedError(QuantbenchError):
    """This backend or option cannot run on this machine (for example a CUDA-only path on a CPU host)."""


class GpuMismatchError(QuantbenchError):
    """`--gpu` asked for hardware that is not what this machine has."""


class ConfigError(QuantbenchError):
    """A command-line option, suite or sweep file is invalid."""


# What allocators say when memory runs out without raising a MemoryError: torch's CPU allocator raises a plain
# RuntimeError ("DefaultCPUAllocator: can't allocate memory"), CUDA a torch.OutOfMemoryError ("CUDA out of memory").
_OOM_WORDS = ("can't allocate memory", "cannot allocate memory", "out of memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc`, or an exception it was raised from, says memory ran out (MemoryError, torch's
    OutOfMemoryError, an allocator's RuntimeError). Only evidence counts: other failures are not called oom."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
            return True
        if isinstance(e, RuntimeError) and any(w in str(e).lower() for w in _OOM_WORDS):
            return True
        e = e.__cause__ or e.__context__
    return False


def classify(exc: BaseException) -> str:
    """The failure label of an exception: `oom` only when memory ran out (the error says so), `load_error` for a
    checkpoint that cannot be loaded, `config_error` for a setting or suite record, `unsupported` for what this
    machine cannot run, `crashed` for anything else."""
    if is_out_of_memory(exc):
        return "oom"
    if isinstance(exc, LoadError):
        return "load_error"
    if isinstance(exc, ConfigError | RequestError):
        return "config_error"
    if isinstance(exc, UnsupportedError):
        return "unsupported"
    return "crashed"
