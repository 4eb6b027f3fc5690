"""The embedded default model: a tiny trained Qwen3-MoE (random-weight real shapes: quantbench.models.synthetic).

`default_model_dir()` returns a checkpoint any backend can load and quantize: a `Qwen3MoeForCausalLM` of the real
model's family (fused experts, top-k router, QK-norm) at hidden size 256, with its own byte-level BPE tokenizer,
trained on CPU on the suite generator's TRAIN split (300 steps: 96 s measured on 2 idle cores, 2.4-3.4 min while
other jobs shared them), so that on the held-out built-in suite its answers are peaked and mostly right: a
quantized variant then has real decisions to keep or lose.
The build is deterministic (seeded, deterministic algorithms, fixed thread count: a rebuild on the same kind of
machine gives a bit-identical model.safetensors), cached under `$QUANTBENCH_CACHE` (default ~/.cache/quantbench)
by a hash of its recipe, built in a temporary directory and renamed into place under a file lock.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from quantbench.models.build import moe_config, new_model
from quantbench.models.tokenizer import CONTEXT, MIX, TOKENIZER, build_tokenizer
from quantbench.paths import cache_dir

FIXTURE_VERSION = 1
FIXTURE_INFO_FILE = "quantbench_fixture.json"

# The recipe: every value here goes into the cache key, so changing one rebuilds the model.
MODEL = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "intermediate_size": 512,
    "norm_topk_prob": True,
    "max_position_embeddings": CONTEXT,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}
TRAIN = {
    # train records per family: more for the families a tiny model learns slowly (number order, item facts)
    "mix": MIX,  # quantbench.models.tokenizer: the tokenizer is trained on the same records
    "steps": 300,
    "batch_size": 32,
    "lr": 2e-3,
    "warmup": 20,
    "weight_decay": 0.01,
    "lm_weight": 0.2,  # next-token loss on the prompt, beside the answer-token loss
    "world_repeats": 40,  # LM-only passes over the closed world's facts (see _world_examples)
    "aux_weight": 0.01,  # router load balancing, so every expert is trained (and matters to quantization)
    "threads": 2,
}

@dataclass
class FixtureInfo:
    path: Path
    model_id: str
    recipe_hash: str
    seed: int
    steps: int
    final_loss: float
    accuracy: dict[str, float]  # per family, on the built-in (held-out) suite
    overall: float
    parameters: int
    size_bytes: int
    train_seconds: float | None = None  # None when read back from the cache
    extra: dict[str, Any] = field(default_factory=dict)


# -- identity and cache ---------------------------------------------------------------------------------------
def _recipe(seed: int = 0, steps: int | None = None) -> dict[str, Any]:
    from quantbench.protocol import suitegen

    train = dict(TRAIN, steps=TRAIN["steps"] if steps is None else steps)
    # the generator's source, so any change to its templates rebuilds the model (hashing its output takes seconds)
    source = hashlib.sha256(Path(suitegen.__file__).read_bytes()).hexdigest()
    return {"version": FIXTURE_VERSION, "generator": suitegen.GENERATOR_VERSION, "generator_source": source, "model": MODEL,
            "tokenizer": TOKENIZER, "train": train, "seed": seed, "dtype": "bfloat16"}


def recipe_hash(seed: int = 0, steps: int | None = None) -> str:
    return hashlib.sha256(json.dumps(_recipe(seed, steps), sort_keys=True).encode()).hexdigest()


def fixture_id(seed: int = 0, steps: int | None = None) -> str:
    """The model_id of the fixture built from this recipe (every variant made from it shares it)."""
    return f"quantbench-fixture-moe-{recipe_hash(seed, steps)[:8]}"




LOCK_REMIND_S = 60.0  # while waiting on another process's lock, say so again this often


def _lock_holder(path: Path, fh: Any) -> str:
    """Who holds the lock on `path`: what the holder wrote into it (pid, host, since when, what for); else, for an
    older quantbench that wrote nothing, the pid from /proc/locks."""
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if holder.get("pid"):
        return (f"pid {holder['pid']} on {holder.get('host', '?')}, {holder.get('doing', 'building')} since "
                f"{holder.get('since', '?')}")
    inode = os.fstat(fh.fileno()).st_ino
    try:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[5].split(":")[-1] == str(inode) and fields[4].isdigit():
                return f"pid {fields[4]} on this host"
    except OSError:
        pass
    return "another process"


@contextmanager
def _locked(path: Path, doing: str = "building") -> Iterator[None]:
    """An exclusive fcntl lock on `path` (so two processes never build the same model at once). While another
    process holds it, say who (pid, host, since when) and keep saying so every LOCK_REMIND_S seconds; the holder
    writes those facts into the lock file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        waited = 0.0
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited == 0.0 or time.monotonic() - waited >= LOCK_REMIND_S:
                    still = f" (waited {time.monotonic() - started:.0f} s)" if waited else ""
                    print(f"waiting for {path}: held by {_lock_holder(path, fh)}{still}", file=sys.stderr,
                          flush=True)
                    waited = time.monotonic()
                time.sleep(0.5)
        if waited:
            print(f"got {path} after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "doing": doing,
                             "since": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}))
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_into(target: Path, *, rebuild: bool, progress: bool, seed: int = 0, steps: int | None = None) -> FixtureInfo | None:
    """Build the fixture at `target` atomically: in a temp sibling, renamed into place. None if already there."""
    with _locked(target.parent / f".{target.name}.lock", f"building {target.name}"):
        if (target / FIXTURE_INFO_FILE).is_file() and not rebuild:
            return None
        if progress:
            from quantbench.term import load_note

            busy = load_note()
            print(f"building the embedded model {target.name} into {target} ({steps or TRAIN['steps']} training "
                  "steps; 1 min 44 s on 2 idle cores where it was measured, and an estimate for this machine from its "
                  "first steps follows; nothing is downloaded)" + (f"; {busy}" if busy else ""),
                  file=sys.stderr, flush=True)
        return build_in_place(target, lambda tmp: build_fixture(tmp, seed=seed, steps=steps, progress=progress))


def build_in_place(target: Path, build: Any) -> Any:
    """`build(tmp)` into a temp sibling of `target`, then renamed into place (replacing an older build): a reader
    never sees half a model. The caller holds the target's lock. Returns build's info, its `path` set to target."""
    for left in target.parent.glob(f".{target.name}.tmp-*"):  # a killed builder's: the lock we hold was its
        shutil.rmtree(left, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
    try:
        info = build(tmp)
        replace_with(target, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info.path = target
    return info


def replace_with(target: Path, built: Path) -> None:
    """Move the finished folder `built` to `target`, replacing what is there (an older build, an empty folder)."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        target.rename(old)
        shutil.rmtree(old)
    built.rename(target)


def default_model_dir(progress: bool = True) -> Path:
    """The trained default model's checkpoint directory, built (300 training steps, 1 min 44 s on 2 idle cores) if not cached."""
    target = cache_dir() / "models" / f"fixture-{recipe_hash()[:8]}"
    if not (target / FIXTURE_INFO_FILE).is_file():
        _build_into(target, rebuild=False, progress=progress)
    return target


def find_or_build(rebuild: bool = False, out: Path | None = None) -> FixtureInfo:
    """The default model at `out` (default: the cache), built there (with progress) unless it is already, or
    `rebuild`; its info, with `path` where it is (`quantbench fixture` shows it)."""
    if out is None:
        target = cache_dir() / "models" / f"fixture-{recipe_hash()[:8]}"
    else:
        target = Path(out).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
    return _build_into(target, rebuild=rebuild, progress=True) or read_info(target)


def read_info(path: Path) -> FixtureInfo:
    data = json.loads((Path(path) / FIXTURE_INFO_FILE).read_text())
    return FixtureInfo(path=Path(path), **{k: v for k, v in data.items() if k in FixtureInfo.__dataclass_fields__ and k != "path"})


# -- training -------------------------------------------------------------------------------------------------
Example = tuple[list[int], int | None]  # (prompt ids, answer token id) or (world text ids, None): LM loss only


def _world_examples(tokenizer, seed: int) -> list[Example]:
    """The closed world's true facts as plain text, read with full LM loss: the model must know them to answer
    the facts family (which asks about them in other words)."""
    from quantbench.protocol.suitegen import world_facts

    facts = world_facts()
    rng = random.Random(f"world:{seed}")
    out = []
    for _ in range(TRAIN["world_repeats"]):
        rng.shuffle(facts)
        for start in range(0, len(facts), 12):
            out.append((tokenizer(" ".join(facts[start : start + 12]), add_special_tokens=True)["input_ids"], None))
    return out


def _examples(tokenizer, records: list[Any]) -> list[Example]:
    """(prompt ids, answer token id) per question, exactly as the scoring engine will read them."""
    from quantbench.protocol.prompt import answer_text, render_prompt

    out: list[Example] = []
    for rec in records:
        for name, question in rec.request.questions.items():
            ids = tokenizer(render_prompt(tokenizer, rec.request, name), add_special_tokens=True)["input_ids"]
            (answer,) = tokenizer(answer_text(tokenizer, question, rec.gold[name]), add_special_tokens=False)["input_ids"]
            out.append((ids, answer))
    return out


@contextmanager
def _deterministic(threads: int) -> Iterator[None]:
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


def _batches(examples: list[Example], rng: random.Random, size: int) -> Iterator[list[Example]]:
    """Endless shuffled batches, epoch after epoch. Not bucketed by length: lengths differ by family, and
    single-family batches train much worse than the padding they save."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order) - size + 1, size):
            yield [examples[i] for i in order[start : start + size]]


def _train(model, examples: list[Example], pad_id: int, *, seed: int, steps: int, progress: bool) -> float:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from quantbench.term import LineProgress, Pace

    cfg = model.config
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": TRAIN["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=TRAIN["lr"], betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < TRAIN["warmup"]:
            return (step + 1) / TRAIN["warmup"]
        return 0.5 * (1 + math.cos(math.pi * (step - TRAIN["warmup"]) / max(1, steps - TRAIN["warmup"])))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    batches = _batches(examples, random.Random(seed), TRAIN["batch_size"])
    loss_value = float("nan")
    bar = LineProgress(TextColumn("training fixture"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=Console(stderr=True),
                       disable=not progress, transient=False)
    pace = Pace("training the embedded model", steps) if progress else None
    model.train()
    with bar:
        task = bar.add_task("train", total=steps, loss="-")
        for step in range(steps):
            batch = next(batches)
            seqs = [ids if ans is None else ids + [ans] for ids, ans in batch]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
            weights = torch.zeros(len(seqs), width - 1)  # per predicted token: LM weight; 0 on padding
            for i, ((_, ans), s) in enumerate(zip(batch, seqs, strict=True)):
                ids[i, : len(s)] = torch.tensor(s)
                weights[i, : len(s) - 1] = TRAIN["lm_weight"] if ans is not None else 1.0
            out = model.model(input_ids=ids, use_cache=False, output_router_logits=True)
            logits = model.lm_head(out.last_hidden_state[:, :-1]).float()
            token_loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none"
            ).view_as(weights)
            rows = torch.tensor([i for i, (_, ans) in enumerate(batch) if ans is not None])
            answer_pos = torch.tensor([len(seqs[i]) - 2 for i in rows.tolist()])
            answer_loss = token_loss[rows, answer_pos].mean()
            weights[rows, answer_pos] = 0.0  # the answer is counted once, above
            lm_loss = (token_loss * weights).sum() / (weights > 0).sum()
            aux = load_balancing_loss_func(out.router_logits, cfg.num_experts, cfg.num_experts_per_tok)
            loss = answer_loss + lm_loss + TRAIN["aux_weight"] * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_value = answer_loss.item()
            bar.update(task, advance=1, loss=f"{loss_value:.3f}")
            if pace is not None:
                pace.update(step + 1)
    model.eval()
    return loss_value


def evaluate(model_dir: Path, suite=None) -> dict[str, float]:
    """Per-family share of questions whose top answer is the gold one (the built-in suite by default)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, use_safetensors=True).eval()
    return evaluate_model(model, AutoTokenizer.from_pretrained(model_dir), suite)


def evaluate_model(model, tokenizer, suite=None, batch: int = 32) -> dict[str, float]:
    from quantbench.engine.scoring import TransformersEngine
    from quantbench.protocol.suite import load_suite

    suite = suite or load_suite(None)
    accuracy = accuracy_by_family(TransformersEngine(model, tokenizer), suite.records, batch)
    return {b: accuracy[b] for b in sorted(accuracy)}


def accuracy_by_family(engine: Any, records: list[Any], batch: int = 32) -> dict[str, float]:
    """The share of gold answers an engine gets right per benchmark family, over the records with gold answers,
    `batch` records a forward pass; families in the order they first appear."""
    records = [r for r in records if r.gold]
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        answers = engine.forward_many([engine.prepare(r.request) for r in chunk])
        for rec, ans in zip(chunk, answers, strict=True):
            for q, gold in rec.gold.items():
                total[rec.benchmark] = total.get(rec.benchmark, 0) + 1
                right[rec.benchmark] = right.get(rec.benchmark, 0) + (ans[q].top == gold)
    return {b: right[b] / total[b] for b in total}


def build_fixture(out_dir: Path, *, seed: int = 0, steps: int | None = None, progress: bool = False) -> FixtureInfo:
    """Train the fixture from scratch into `out_dir` (deterministic for a given seed and steps)."""
    from quantbench.protocol.suitegen import generate

    out_dir = Path(out_dir)
    steps = TRAIN["steps"] if steps is None else steps
    with _deterministic(TRAIN["threads"]):
        torch.manual_seed(seed)
        tokenizer = build_tokenizer()
        config = moe_config(MODEL, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
        model = new_model(config, "cpu", torch.float32, seed)
        model.set_experts_implementation("eager")  # on CPU its backward is 4x faster than grouped_mm
        examples = _examples(tokenizer, generate("train", 0, seed=seed, families=TRAIN["mix"]))
        examples += _world_examples(tokenizer, seed)
        start = time.perf_counter()
        final_loss = _train(model, examples, tokenizer.pad_token_id, seed=seed, steps=steps, progress=progress)
        seconds = time.perf_counter() - start
        model = model.to(torch.bfloat16)
        model.config.quantbench_model_id = fixture_id(seed, steps)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        if progress:
            print("evaluating the embedded model on the built-in suite", file=sys.stderr, flush=True)
        accuracy = evaluate(out_dir)
    parameters = sum(p.numel() for p in model.parameters())
    info = FixtureInfo(
        path=out_dir, model_id=fixture_id(seed, steps), recipe_hash=recipe_hash(seed, steps), seed=seed, steps=steps,
        final_loss=round(final_loss, 6), accuracy={k: round(v, 6) for k, v in accuracy.items()},
        overall=round(sum(accuracy.values()) / len(accuracy), 6), parameters=parameters,
        size_bytes=(out_dir / "model.safetensors").stat().st_size, train_seconds=seconds,
    )
    # Only deterministic facts go into the directory, so two builds of one recipe hash alike.
    record = {k: v for k, v in asdict(info).items() if k not in ("path", "train_seconds", "extra")}
    (out_dir / FIXTURE_INFO_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return info
