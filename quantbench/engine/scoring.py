"""Scoring decisions with a transformers causal LM: every local backend answers through this one engine.

One forward pass per request: each question becomes its own sequence (so reordering questions cannot change an
answer), the sequences are right-padded into one batch, and only the positions that are read go through lm_head.
Right padding keeps every real token's attention exactly as if the sequence were alone: causal attention never
looks forward, so no attention mask is needed and none is passed.

Options are scored from the logits of their single-token labels (`label_logit`: only the head's rows for those
labels are multiplied, not the whole vocabulary's); when the tokenizer cannot write every label as one token, or
the caller asks for it, from the summed log-likelihood of each option key as a continuation (`continuation`: the
whole head and its log-softmax), batched in the same forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from quantbench.engine.base import EngineBase, EngineReport
from quantbench.engine.base import Prepared as PreparedBase
from quantbench.engine.cudagraph import GraphedDecoder
from quantbench.engine.fused import install as install_fused_ops
from quantbench.engine.moe.engine import reset_paths
from quantbench.errors import ContextLengthError
from quantbench.protocol import DEFAULT_MAX_OPTIONS, DecisionRequest, QuestionAnswer
from quantbench.protocol.prompt import (
    CHOICE_LABELS,
    label_prefix,
    option_labels,
    render_prompt,
    render_state,
    uses_chat_template,
)


@dataclass
class _Reader:
    """Where one question's answer is read from the batch."""

    question: str
    options: list[str]
    method: str
    truncated: bool
    rows: list[int]  # batch rows: one for label_logit, one per option for continuation
    label_ids: list[int] | None = None
    spans: list[tuple[int, int]] = field(default_factory=list)  # continuation: (first, end) token positions


@dataclass(kw_only=True)  # as its base: fields by name
class Prepared(PreparedBase):
    rows: list[list[int]]  # always seen here: the run's tokenizer_hash is made from them
    request: DecisionRequest
    readers: list[_Reader]
    media: list[Any] | None = None  # per row, the model's media inputs for it (quantbench.models.families.qwen3_omni.engine); None: text

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self.rows)


class TransformersEngine(EngineBase):
    """Answers decision requests with a loaded causal LM (any backend that ends in a transformers model)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_options: int = DEFAULT_MAX_OPTIONS,
        max_tokens: int | None = None,
        truncate: bool = False,
        method: str = "auto",
        cuda_graph: str = "auto",
        fused_ops: str = "auto",
    ):
        if method not in ("auto", "continuation"):
            raise ValueError(f"method must be 'auto' or 'continuation', not {method!r}")
        self.model, self.tokenizer = model, tokenizer
        self.max_options, self.truncate, self.method = max_options, truncate, method
        # the text config: a multimodal model (Qwen3-Omni's thinker) keeps the context length there
        limit = getattr(model.config.get_text_config(), "max_position_embeddings", None) or 1 << 30
        self.max_tokens = min(limit, max_tokens) if max_tokens else limit
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._add_special = not uses_chat_template(tokenizer)
        self._label_cache: dict[tuple[str, ...], list[int] | None] = {}
        # the Rust tokenizer behind a fast one, called directly (_encode); checked against the wrapper 8 times
        self._rust = getattr(tokenizer, "_tokenizer", None)
        if not hasattr(self._rust, "encode_batch_fast"):
            self._rust = None
        self._rust_checks = 8
        # what quantbench.engine.fused.ops swapped in (None: transformers' own ops), before any graph is captured
        # scoped to the text decoder: a multimodal model's vision / audio towers run as transformers has them
        self.fused_ops = install_fused_ops(model.get_decoder(), fused_ops if self.device.type == "cuda" else "off")
        reset_paths(model)  # the install probes' forwards are not the run's: what a run ran is read after it
        self.decoder = GraphedDecoder(model.get_decoder(), pad_id=self.pad_id, max_width=self.max_tokens,
                                      mode=cuda_graph if self.device.type == "cuda" else "off",
                                      head=model.get_output_embeddings())

    @classmethod
    def for_spec(cls, model: Any, tokenizer: Any, spec: Any) -> TransformersEngine:
        """The engine a backend builds for a RunSpec (options, truncation, scoring method, CUDA graphs)."""
        return cls(model, tokenizer, max_options=spec.max_options, max_tokens=spec.max_tokens, truncate=spec.truncate,
                   method=spec.method, cuda_graph=spec.options.cuda_graph,
                   fused_ops=spec.options.fused_ops)

    @torch.inference_mode()
    def warm(self, batch: list[Prepared]) -> None:
        """Make ready what the forward of this batch will replay (its CUDA graph), outside any timing. Under
        inference mode, as forward_many: a graph captured with autograd on would record the unfused paths that
        quantbench.engine.fused.ops / fused_layer take then (found 2026-11-30: batch buckets were captured that way)."""
        rows = [r for p in batch for r in p.rows]
        self.decoder.ensure(len(rows), max(len(r) for r in rows), self.device)

    @property
    def graph_report(self) -> dict[str, Any] | None:
        """What the CUDA graphs did (None on the CPU, where there are none)."""
        return self.decoder.report.as_dict() if self.device.type == "cuda" else None

    def report(self) -> EngineReport:
        return EngineReport(fused_ops=self.fused_ops, graphs=self.graph_report)

    # -- tokenization (pre-processing, timed apart from the model) ------------------------------------------
    def _encode(self, text: str, special: bool) -> list[int]:
        """Token ids of `text`. A fast (Rust) tokenizer is called directly, without offsets: transformers'
        wrapper around the same `encode_batch` cost 1.1 of 3.9 ms for a 512-token prompt, and the offsets another
        0.4 (2026-12-03, this VM under load; a server tokenizes every request). The first calls are checked against
        the wrapper (until 8 prompt-length texts agreed), and any difference (a tokenizer class that changes the text
        in Python) ends the direct path."""
        if self._rust is not None:
            ids = self._rust.encode_batch_fast([text], add_special_tokens=special)[0].ids
            if self._rust_checks <= 0:
                return ids
            if ids == self.tokenizer(text, add_special_tokens=special)["input_ids"]:
                self._rust_checks -= len(text) >= 200  # until 8 prompts (not only option labels) agreed
                return ids
            self._rust = None
        return self.tokenizer(text, add_special_tokens=special)["input_ids"]

    def _single_token_labels(self, labels: list[str]) -> list[int] | None:
        key = tuple(labels)
        if key not in self._label_cache:
            prefix = label_prefix(self.tokenizer)
            ids = [self._encode(prefix + label, False) for label in labels]
            ok = all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(ids)
            self._label_cache[key] = [i[0] for i in ids] if ok else None
        return self._label_cache[key]

    def _prompt_ids(self, request: DecisionRequest, name: str, extra: int) -> tuple[list[int], bool]:
        """Token ids of one question's prompt, cutting the state when allowed and needed to fit `extra` more."""
        ids = self._encode(render_prompt(self.tokenizer, request, name), self._add_special)
        if len(ids) + extra <= self.max_tokens:
            return ids, False
        if not self.truncate:
            raise ContextLengthError(f"questions.{name}", len(ids) + extra, self.max_tokens)
        state_ids = self._encode(render_state(request.state), False)
        for _ in range(4):  # re-tokenizing the cut text can shift a few tokens: shrink until it fits
            over = len(ids) + extra - self.max_tokens
            if over <= 0:
                return ids, True
            keep = len(state_ids) - over - 4
            if keep <= 0:
                break
            state_ids = state_ids[:keep]
            cut = self.tokenizer.decode(state_ids)
            ids = self._encode(render_prompt(self.tokenizer, request, name, state_text=cut), self._add_special)
        raise ContextLengthError(f"questions.{name}", len(ids) + extra, self.max_tokens, truncated=True)

    def _prompt(self, request: DecisionRequest, name: str, extra: int) -> tuple[list[int], bool, Any]:
        """(token ids, cut, the model's media inputs for them or None) of one question's prompt: the hook an
        engine for a model that reads media overrides (quantbench.models.families.qwen3_omni.engine)."""
        ids, cut = self._prompt_ids(request, name, extra)
        return ids, cut, None

    def prepare(self, request: DecisionRequest) -> Prepared:
        rows: list[list[int]] = []
        readers: list[_Reader] = []
        media: list[Any] = []
        for name, question in request.questions.items():
            options = question.options
            labels = option_labels(question)
            use_labels = self.method != "continuation" and len(labels) <= len(CHOICE_LABELS)
            label_ids = self._single_token_labels(labels) if use_labels else None
            if label_ids is not None:
                ids, cut, inputs = self._prompt(request, name, 0)
                readers.append(_Reader(name, options, "label_logit", cut, [len(rows)], label_ids=label_ids))
                rows.append(ids)
                media.append(inputs)
                continue
            conts = [self._encode(" " + key, False) for key in options]
            ids, cut, inputs = self._prompt(request, name, max(len(c) for c in conts))
            reader = _Reader(name, options, "continuation", cut, [])
            for cont in conts:
                reader.rows.append(len(rows))
                reader.spans.append((len(ids), len(ids) + len(cont)))
                rows.append(ids + cont)
                media.append(inputs)  # each option's row carries the prompt's media
            readers.append(reader)
        has_media = any(m is not None for m in media)
        return Prepared(request=request, rows=rows, readers=readers, media=media if has_media else None)

    # -- the forward pass (what the latency figures time) ---------------------------------------------------
    @torch.inference_mode()
    def forward_many(self, batch: list[Prepared]) -> list[dict[str, QuestionAnswer]]:
        """Answer several prepared requests in one forward pass (the server batches concurrent requests)."""
        rows = [r for p in batch for r in p.rows]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        ids = ids.to(self.device, non_blocking=True)

        # Which (row, position) hidden states are read: the last prompt token for labels, and for continuations
        # every position that predicts an option token.
        picks_row: list[int] = []
        picks_pos: list[int] = []
        offset = 0
        plan: list[list[tuple[_Reader, int]]] = []
        for p in batch:
            entries = []
            for rd in p.readers:
                entries.append((rd, len(picks_row)))
                if rd.method == "label_logit":
                    picks_row.append(offset + rd.rows[0])
                    picks_pos.append(len(p.rows[rd.rows[0]]) - 1)
                else:
                    for row, (first, end) in zip(rd.rows, rd.spans, strict=True):
                        for pos in range(first - 1, end - 1):
                            picks_row.append(offset + row)
                            picks_pos.append(pos)
            plan.append(entries)
            offset += len(p.rows)

        hidden = self._hidden(batch, ids)
        picks = torch.tensor([picks_row, picks_pos]).to(self.device, non_blocking=True)  # one copy, not two
        sel = hidden[picks[0], picks[1]]
        label_ids = self._label_columns(batch)
        if label_ids is not None:
            logits_host, column = self._label_logits(sel, label_ids)
        else:
            logits = self.model.get_output_embeddings()(sel).float()
            logprobs = torch.log_softmax(logits, dim=-1).cpu()
            # One copy to the host: a .cpu() per question releases the GIL each time, and under a server's event
            # loop every re-acquire can wait a whole switch interval (5 ms).
            logits_host = logits.cpu()
            column = None

        out: list[dict[str, QuestionAnswer]] = []
        for p, entries in zip(batch, plan, strict=True):
            answers: dict[str, QuestionAnswer] = {}
            for rd, start in entries:
                if rd.method == "label_logit":
                    cols = rd.label_ids if column is None else [column[i] for i in rd.label_ids]
                    scores = logits_host[start][torch.tensor(cols)]
                else:
                    scores, k = [], start
                    for row, (first, end) in zip(rd.rows, rd.spans, strict=True):
                        target = p.rows[row][first:end]
                        scores.append(sum(float(logprobs[k + j, t]) for j, t in enumerate(target)))
                        k += end - first
                    scores = torch.tensor(scores, dtype=torch.float64)
                probs = torch.softmax(scores.double(), dim=0)
                prob = {o: float(v) for o, v in zip(rd.options, probs, strict=True)}
                top = max(rd.options, key=lambda o: prob[o])
                answers[rd.question] = QuestionAnswer(top=top, probabilities=prob, method=rd.method, truncated=rd.truncated)
            out.append(answers)
        return out

    def _hidden(self, batch: list[Prepared], ids: Tensor) -> Tensor:
        """The last hidden states of the right-padded batch `ids` [rows, width]: the text decoder, replayed from
        a CUDA graph where it can be (quantbench.engine.cudagraph). The head is applied by the caller, only at
        the positions read."""
        return self.decoder(ids)

    def _label_columns(self, batch: list[Prepared]) -> list[int] | None:
        """The vocabulary rows every answer of the batch reads, when all are label logits and the head is a plain
        Linear; else None (continuations need the whole vocabulary's log-softmax)."""
        head = self.model.get_output_embeddings()
        if type(head) is not nn.Linear or "forward" in vars(head):
            return None  # a quantized or wrapped head computes in its own way: run it whole
        if any(rd.method != "label_logit" for p in batch for rd in p.readers):
            return None
        return sorted({i for p in batch for rd in p.readers for i in rd.label_ids})

    def _label_logits(self, sel: Tensor, label_ids: list[int]) -> tuple[Tensor, dict[int, int]]:
        """lm_head's logits at the label tokens only: the head's rows for them, one small GEMM. At the 30B shape
        the whole head is 622 MB of weights read for a handful of logits; on the H200 this tail of a decision
        took 254 µs instead of 668 (with the full log-softmax and its copy to the host), and the label logits
        came out identical (docs/BENCHMARKS.md). Options are scored from these logits alone."""
        head = self.model.get_output_embeddings()
        rows = torch.tensor(label_ids).to(self.device, non_blocking=True)
        bias = None if head.bias is None else head.bias.index_select(0, rows)
        logits = F.linear(sel, head.weight.index_select(0, rows), bias).float().cpu()
        return logits, {tok: j for j, tok in enumerate(label_ids)}

    def forward(self, prepared: Prepared) -> dict[str, QuestionAnswer]:
        return self.forward_many([prepared])[0]

    def tokens(self, prepared: Prepared) -> int:
        return prepared.tokens

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
