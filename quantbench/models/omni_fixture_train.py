"""Training the omni default model (quantbench.models.omni_fixture): examples made by the engine that will score
the model, and the training loop.

Every example is one question of a decision record prepared by `OmniEngine.prepare` itself (the prompt's token
ids with each media part's placeholder expanded, and the processor's pixel values, audio features and grids), so
the model learns exactly what it is later asked. The loop is the text fixture's (answer-token loss, a lighter
next-token loss on the prompt, router load balancing) over batches that mix text and media rows: each batch's
media inputs are joined as the engine joins them and go through the vision and audio towers, which train too.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Example:
    ids: list[int]  # the prompt's token ids (media placeholders expanded)
    answer: int | None  # the gold label's token id; None: a text read with next-token loss only
    media: dict[str, Any] | None  # the processor's tensors for this prompt; None: text


def record_examples(engine: Any, records: list[Any]) -> list[Example]:
    """One Example per question of each record, prepared by `engine` (an OmniEngine over the model in training)."""
    out = []
    for rec in records:
        prepared = engine.prepare(rec.request)
        for reader in prepared.readers:
            if reader.label_ids is None:
                raise RuntimeError(f"{rec.id}: question {reader.question!r} has no single-token labels to train")
            row = reader.rows[0]
            answer = reader.label_ids[reader.options.index(rec.gold[reader.question])]
            media = prepared.media[row] if prepared.media is not None else None
            out.append(Example(prepared.rows[row], answer, media))
    return out


def _batch(examples: list[Example], pad_id: int, lm_weight: float) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, per-position loss weights, answer rows, answer positions) of a right-padded batch."""
    seqs = [ex.ids if ex.answer is None else ex.ids + [ex.answer] for ex in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    weights = torch.zeros(len(seqs), width - 1)
    for i, (ex, s) in enumerate(zip(examples, seqs, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        weights[i, : len(s) - 1] = lm_weight if ex.answer is not None else 1.0
    rows = torch.tensor([i for i, ex in enumerate(examples) if ex.answer is not None])
    positions = torch.tensor([len(seqs[i]) - 2 for i in rows.tolist()])
    return ids, mask, weights, rows, positions


def train(model: Any, examples: list[Example], pad_id: int, train: dict[str, Any], *, seed: int, steps: int,
          progress: bool) -> float:
    """Train `model` (a Qwen3-Omni thinker, float32) in place on shuffled batches of `examples`; the last answer loss."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import load_balancing_loss_func

    from quantbench.engine.omni import _join
    from quantbench.models.fixture import _batches
    from quantbench.term import LineProgress

    text_cfg = model.config.text_config
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=train["lr"], betas=(0.9, 0.95))
    warmup = train["warmup"]

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    batches = _batches(examples, random.Random(seed), train["batch_size"])
    loss_value = float("nan")
    bar = LineProgress(TextColumn("training omni fixture"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=Console(stderr=True),
                       disable=not progress, transient=False)
    model.train()
    with bar:
        task = bar.add_task("train", total=steps, loss="-")
        for _ in range(steps):
            batch = next(batches)
            ids, mask, weights, rows, positions = _batch(batch, pad_id, train["lm_weight"])
            media = _join([ex.media for ex in batch if ex.media is not None], torch.device("cpu"), torch.float32)
            out = model.model(input_ids=ids, attention_mask=mask, use_cache=False, output_router_logits=True,
                              **media)
            logits = model.lm_head(out.last_hidden_state[:, :-1]).float()
            targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            token_loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none", ignore_index=-100,
            ).view_as(weights)
            answer_loss = token_loss[rows, positions].mean()
            weights[rows, positions] = 0.0  # the answer is counted once, above
            lm_loss = (token_loss * weights).sum() / (weights > 0).sum()
            aux = load_balancing_loss_func(out.router_logits, text_cfg.num_experts, text_cfg.num_experts_per_tok)
            loss = answer_loss + lm_loss + train["aux_weight"] * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_value = answer_loss.item()
            bar.update(task, advance=1, loss=f"{loss_value:.3f}")
    model.eval()
    return loss_value
