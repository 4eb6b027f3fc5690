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

    def __init__(self, field: str, tokens: int, limit: int):
        self.tokens, self.limit = tokens, limit
        super().__init__(
            field,
            f"the prompt is {tokens} tokens, over the model's limit of {limit}",
            "shorten the state, or allow truncation (--truncate / truncate=True), which is recorded on each answer",
        )


class LoadError(QuantbenchError):
    """A checkpoint cannot be loaded completely and exactly (missing / unexpected tensors, unknown format)."""


class UnsupportedError(QuantbenchError):
    """This backend or option cannot run on this machine (for example a CUDA-only path on a CPU host)."""


class GpuMismatchError(QuantbenchError):
    """`--gpu` asked for hardware that is not what this machine has."""


class ConfigError(QuantbenchError):
    """A command-line option, suite or sweep file is invalid."""
