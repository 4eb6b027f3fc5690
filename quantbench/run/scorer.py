"""Answering through a checkpoint's own scorer (quantbench.models.scorer): the one place where a loaded variant
whose checkpoint names a scorer gets an engine that asks the scorer instead of reading label logits. The run child
and the server both call `with_checkpoint_scorer` on what a backend loaded, so every backend answers through the
scorer the same way, with the same timing and the same stored rows; each answer's method is `checkpoint_scorer`.

What the scorer object must do (the README's "A checkpoint's own scorer" is the contract for checkpoint authors):

    scorer = Class(model=..., tokenizer=..., processor=..., checkpoint=Path, device=torch.device, weights={...})
    scorer.score(request) -> {question: {option: probability}}   # request: the SystemOne JSON, as a dict
    scorer.prepare(request) -> anything                           # optional: untimed work (tokenizing); score()
                                                                  #   then gets its result instead of the request
    scorer.tokens(prepared) -> int                                # optional: tokens fed to the model
    scorer.modalities = ("image", ...)                            # optional: media types it reads (default none)

Every answer is checked: every question, exactly its options, finite and non-negative, summing to 1 within
SUM_TOLERANCE; anything else is a ScorerError naming the scorer and the question.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quantbench.engine.base import EngineBase, EngineReport, Prepared
from quantbench.errors import ConfigError
from quantbench.limits import Limits
from quantbench.models import scorer as checkpoint_scorer
from quantbench.models.scorer import ScorerError, ScorerFiles
from quantbench.protocol import DecisionRequest, QuestionAnswer
from quantbench.protocol.media import inline_media_paths
from quantbench.run.backend import LoadedVariant
from quantbench.run.spec import RunSpec

METHOD = "checkpoint_scorer"
SUM_TOLERANCE = 1e-3  # a softmax in float32 sums to 1 within ~1e-6; a head computed in bf16 needs its float32 cast


@dataclass(kw_only=True)
class ScorerPrepared(Prepared):
    request: DecisionRequest
    payload: Any  # what score() is given: the request's JSON, or what the scorer's prepare() made of it


def check_answers(found: ScorerFiles, request: DecisionRequest, out: Any) -> dict[str, QuestionAnswer]:
    """The scorer's output as answers, in the request's question and option order; ScorerError if it is not one
    probability per option of every question, finite, >= 0, summing to 1."""

    def bad(problem: str, question: str | None = None) -> ScorerError:
        about = f" for question {question!r}" if question is not None else ""
        return ScorerError(f"the checkpoint's scorer {found.class_ref} ({found.module_file}) answered{about} "
                           f"{problem}; it must return {{question: {{option: probability}}}} for every question, "
                           "each option's probability finite and >= 0, summing to 1")

    if not isinstance(out, Mapping):
        raise bad(f"a {type(out).__name__}, not a mapping")
    if stray := sorted(set(map(str, out)) - set(request.questions)):
        raise bad(f"questions the request does not ask ({', '.join(stray)})")
    answers: dict[str, QuestionAnswer] = {}
    for name, question in request.questions.items():
        got = out.get(name)
        if not isinstance(got, Mapping):
            raise bad("nothing" if got is None else f"a {type(got).__name__}, not {{option: probability}}", name)
        options = question.options
        if set(got) != set(options):
            raise bad(f"options {sorted(map(str, got))}, not the question's {options}", name)
        probs: dict[str, float] = {}
        for option in options:
            try:
                value = float(got[option])
            except (TypeError, ValueError):
                raise bad(f"{got[option]!r} for option {option!r}, not a number", name) from None
            if not math.isfinite(value) or value < 0:
                raise bad(f"{value} for option {option!r}", name)
            probs[option] = value
        total = math.fsum(probs.values())
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise bad(f"probabilities that sum to {total:.6g}, not 1 (tolerance {SUM_TOLERANCE:g})", name)
        top = max(options, key=lambda o: probs[o])  # the first of equals, in the request's order
        answers[name] = QuestionAnswer(top=top, probabilities=probs, method=METHOD)
    return answers


class CheckpointScorerEngine(EngineBase):
    """A DecisionEngine that asks the checkpoint's scorer. `inner` is the engine the backend built over the same
    model (its device, its report of what ran); the scorer calls the model itself."""

    def __init__(self, scorer: Any, found: ScorerFiles, inner: Any, *, limits: Limits, media_base: Path | None):
        self.scorer, self.found, self.inner = scorer, found, inner
        self.limits, self.media_base = limits, media_base
        self.modalities = frozenset(getattr(scorer, "modalities", ()))
        self.device = getattr(inner, "device", "cpu")
        self._prepare = getattr(scorer, "prepare", None)
        self._tokens = getattr(scorer, "tokens", None)

    def prepare(self, request: DecisionRequest) -> ScorerPrepared:
        # a suite's `path` parts arrive as data URIs: the scorer reads no local file (as a server would not)
        body = inline_media_paths(request, self.limits, base=self.media_base).model_dump(mode="json", exclude_none=True)
        return ScorerPrepared(request=request, payload=self._prepare(body) if self._prepare else body)

    def forward(self, prepared: ScorerPrepared) -> dict[str, QuestionAnswer]:
        import torch  # lazy: the parent imports this module's package without torch

        with torch.inference_mode():
            out = self.scorer.score(prepared.payload)
        return check_answers(self.found, prepared.request, out)

    def forward_many(self, batch: list[ScorerPrepared]) -> list[dict[str, QuestionAnswer]]:
        """The scorer takes one request at a time: a batch is answered request by request."""
        return [self.forward(p) for p in batch]

    def tokens(self, prepared: ScorerPrepared) -> int:
        return int(self._tokens(prepared.payload)) if self._tokens else 0

    def synchronize(self) -> None:
        self.inner.synchronize()

    def report(self) -> EngineReport:
        return self.inner.report()


def with_checkpoint_scorer(loaded: LoadedVariant, spec: RunSpec) -> LoadedVariant:
    """`loaded` answering through its checkpoint's scorer when the checkpoint names one, else `loaded` itself.
    The parent has refused a scorer without --trust-remote-code already; it is refused here again, so no caller
    can run the checkpoint's code without the flag. The run records the scorer (class, sha256 of each file) in
    `extra.scorer` and says so in its kernel path."""
    if loaded.model is None or not spec.model or spec.shape:
        return loaded  # a remote server, or random weights built from a seed: no checkpoint to name a scorer
    if not (Path(spec.model) / "config.json").is_file():
        return loaded  # a backend's own model format (no config.json) has no key to name a scorer with
    found = checkpoint_scorer.describe(spec.model)
    if found is None:
        return loaded
    checkpoint_scorer.require_trust(found, spec.trust_remote_code)
    if spec.method != "auto":
        raise ConfigError(f"--method {spec.method}: {found.root} answers through its own scorer ({found.class_ref}); "
                          "drop --method")
    engine = loaded.engine
    # the tokenizer / processor the backend loaded with the model (a text engine has no processor)
    scorer = checkpoint_scorer.load(found, model=loaded.model, tokenizer=getattr(engine, "tokenizer", None),
                                    processor=getattr(engine, "processor", None),
                                    device=getattr(engine, "device", "cpu"))
    base = Path(spec.suite).resolve().parent if spec.suite else None
    wrapped = CheckpointScorerEngine(scorer, found, engine, limits=Limits(max_options=spec.max_options),
                                     media_base=base)
    info = replace(loaded.info, kernel_path=f"{loaded.info.kernel_path} +checkpoint-scorer",
                   extra={**loaded.info.extra, "scorer": found.record()})
    return LoadedVariant(engine=wrapped, info=info, model=loaded.model)
