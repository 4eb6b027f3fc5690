"""Every option of a run that can be judged without the model, judged in the parent in well under a second,
before any child starts or anything is stored: a bad option is one line naming the flag and the fix (exit 2),
never a failed run 20 seconds later.

What runner.preflight checks (the model directory, the suite) is its own; this is the rest: --device against the
GPUs NVML sees, --gpu against this machine, --dtype, --method, the counts and limits, --shape and --layers, the
backend's availability here and anything the backend itself checks (`check(spec, machine)`, optional: the http
backend's --endpoint). And, once the model's directory is known (check_state_lengths), a suite record whose state
is far over the model's context, found with its tokenizer.json over a bounded prefix.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError
from quantbench.limits import STATE_PREFIX_CHARS_PER_TOKEN, STATE_PREFIX_MARGIN_TOKENS
from quantbench.paths import cache_dir
from quantbench.run.machine import Machine, check_gpu
from quantbench.run.settings import GENERIC, refusal
from quantbench.run.spec import RunSpec, is_remote

DEVICE = re.compile(r"^(cpu|cuda)(:(\d+))?$")


def visible_gpus(machine: Machine) -> int:
    """GPUs a child process can use: CUDA_VISIBLE_DEVICES' list where set, else those NVML counts."""
    if not machine.has_gpu:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # NVML answered detect() a moment ago; if it will not count, assume the one it saw
        return 1


def check_device(device: str | None, gpu: str, machine: Machine) -> None:
    """--device: cpu, cuda or cuda:N, where such a device exists here and agrees with --gpu."""
    if device is None:
        return
    m = DEVICE.match(device.strip().lower())
    if not m:
        raise ConfigError(f"--device {device!r}: use cpu, cuda or cuda:N (or leave it out: a GPU when there is one)")
    if m.group(1) == "cuda":
        n = visible_gpus(machine)
        if n == 0:
            raise ConfigError(f"--device {device}: this machine has no GPU that NVML can see (CPU: {machine.cpu_model})"
                              "; leave --device out, or give --device cpu")
        index = int(m.group(3) or 0)
        if index >= n:
            raise ConfigError(f"--device {device}: this machine has {n} GPU{'s' * (n != 1)} visible (cuda:0"
                              + (f" … cuda:{n - 1}" if n > 1 else "") + "); give one of them")
        if gpu.strip().lower() == "cpu":
            raise ConfigError(f"--device {device} with --gpu cpu: the run would be labelled CPU but run on the GPU; "
                              "drop one of them")
    elif gpu.strip().lower() not in ("auto", "cpu"):
        raise ConfigError(f"--device cpu with --gpu {gpu}: the run would be labelled {gpu} but run on the CPU; use "
                          "--gpu cpu (or leave --device out)")


def check_spec(spec: RunSpec, machine: Machine, backend: Any) -> None:
    """Refuse, naming the flag, every setting of `spec` that would fail the run (see the module docstring).
    `backend` is the backend's instance (quantbench.run.backend.get_backend)."""
    check_gpu(spec.gpu, machine)  # a GpuMismatchError names --gpu and what is here
    check_device(spec.device, spec.gpu, machine)
    for name in GENERIC:  # --dtype, --method, the counts and bounds: as quantbench.run.settings declares them
        if why := refusal(name, getattr(spec, name)):
            raise ConfigError(why)
    if spec.layers is not None and not spec.shape:
        raise ConfigError("--layers sets the layer count of a synthetic --shape model; give --shape too (a checkpoint "
                          "has the layers it has)")
    if spec.shape:
        from quantbench.models.families import synthetic_shapes  # every family's, read without torch

        shapes = synthetic_shapes()
        if spec.shape not in shapes:
            raise ConfigError(f"--shape {spec.shape!r}: use one of {', '.join(sorted(shapes))}")
    availability = backend.availability(machine)
    if not availability.available:
        raise ConfigError(f"--backend {spec.backend}: not available here: {availability.detail}")
    own = getattr(backend, "check", None)
    if callable(own):
        own(spec, machine)



def check_cache() -> None:
    """$QUANTBENCH_CACHE (default ~/.cache/quantbench: the embedded model, its variants, the omni suite, runs a store
    could not take) must be a folder, or one that can be made: a path that is a file, or under one, failed the run
    as `crashed` (NotADirectoryError) and `demo` with a traceback; a read-only one without the model built, the
    same minutes later."""
    path = cache_dir()  # the folder the makers will use, as they read it
    fix = "point $QUANTBENCH_CACHE at a folder you can write, or unset it (~/.cache/quantbench)"
    held = path
    while not held.exists() and held != held.parent:  # the nearest part of it that exists
        held = held.parent
    if not held.is_dir():
        where = "is a file" if held == path else f"is under {held}, a file"
        raise ConfigError(f"$QUANTBENCH_CACHE {path}: {where}, not a folder; {fix}")
    if not (path / "models").is_dir() and not os.access(held, os.W_OK | os.X_OK):
        raise ConfigError(f"$QUANTBENCH_CACHE {path}: {held} is not writable, and the embedded model is built there; "
                          f"{fix}")


def context_limit(config: dict[str, Any], max_tokens: int | None) -> int | None:
    """The prompt token limit the child's engine will hold a prompt to (quantbench.engine.scoring: the text
    config's max_position_embeddings, or --max-tokens when smaller), read from config.json; None when unknown."""
    text = config
    for holder in (config.get("thinker_config"), config):  # a Qwen3-Omni checkpoint, the omni fixture
        if isinstance(holder, dict) and isinstance(holder.get("text_config"), dict):
            text = holder["text_config"]
            break
    limit = text.get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return max_tokens
    return min(limit, max_tokens) if max_tokens else limit


def check_state_lengths(suite: Any, spec: RunSpec, model: str | None) -> None:
    """Refuse, before the child loads anything, a suite record whose state is already over the model's token limit
    within its first STATE_PREFIX_CHARS_PER_TOKEN characters a token (ConfigError naming the file, line, record,
    `state` and the fix). `model` is the checkpoint directory the child will load (the resolved spec's).

    Cheap: a state shorter than that many characters (every state of a normal suite) is not tokenized at all, a
    longer one only that far, with the checkpoint's tokenizer.json (the tokenizers library, no transformers). Not
    checked: --truncate (a long state runs, cut to fit, as before), a synthetic --shape, a remote backend (its
    server bounds what it is sent), a checkpoint without tokenizer.json or a context length in config.json (the
    child's engine still refuses a prompt over the limit, naming the question)."""
    # lazy: the protocol's models, only when a suite is checked. The bound is the server's (bound_long_state): a
    # 10 MB state otherwise passed every check, and the child loaded the model (2.6 GB, 15 s) only to tokenize it
    from quantbench.protocol.prompt import render_state, state_prefix_tokens

    if spec.truncate or spec.shape or not model or is_remote(spec.backend):
        return
    root = Path(model)
    vocab = root / "tokenizer.json"
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):  # preflight named a broken --model already; an odd one is the child's to judge
        return
    limit = context_limit(config, spec.max_tokens) if isinstance(config, dict) else None
    if limit is None or not vocab.is_file():
        return
    chars = limit * STATE_PREFIX_CHARS_PER_TOKEN
    tokenizer = None
    for index, record in enumerate(suite.first(spec.limit)):
        text = render_state(record.request.state)
        if len(text) <= chars:
            continue
        if tokenizer is None:
            from tokenizers import Tokenizer

            try:
                tokenizer = Tokenizer.from_file(str(vocab))
            except Exception:  # a tokenizer.json this tokenizers cannot read: the child's transformers judges it
                return
        tokens = state_prefix_tokens(text, chars, lambda t, tok=tokenizer: len(tok.encode(t, add_special_tokens=False).ids))
        if tokens > limit + STATE_PREFIX_MARGIN_TOKENS:
            over = (f"--max-tokens {limit}" if spec.max_tokens == limit
                    else f"the model's context of {limit:,} tokens")
            raise ConfigError(
                f"{suite.where(index)}: state: record {record.id!r} has a state of {len(text):,} characters whose "
                f"first {chars:,} are already {tokens:,} tokens, over {over}; shorten the state, or pass --truncate "
                "to cut it to fit (each answer records that it was cut)"
            )
