"""A tiny random Qwen3-MoE and tokenizer for tests that need a model but not the trained fixture, and test-only
backends (loaded by import path, `tests.tiny:CrashBackend`) that fail in each way a real run can."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

from quantbench.engine.base import EngineReport
from quantbench.engine.scoring import TransformersEngine
from quantbench.errors import LoadError
from quantbench.run.backend import Availability, LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.run.spec import BackendOptions, opt

CORPUS = ["State: Question: Answer: A B C D E yes no left right forward wall player observation alpha beta"] * 50


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> Qwen3MoeForCausalLM:
    cfg = Qwen3MoeConfig(vocab_size=600, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         num_experts=8, num_experts_per_tok=2, max_position_embeddings=512)
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(cfg).to(dtype).eval()


def save_tiny(path: Path) -> Path:
    tiny_model(dtype=torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


class TinyBackend:
    name = "tiny"
    summary = "test: tiny random model"
    Options = BackendOptions

    def availability(self, machine):
        return Availability(True)

    def load(self, spec, machine):
        model = tiny_model()
        engine = TransformersEngine(model, tiny_tokenizer(), max_options=spec.max_options)
        info = VariantInfo(variant="tiny", weight_format="float32", kernel_path="transformers grouped_mm",
                           compute_dtype="float32", model_id="tiny-test", weights="synthetic")
        return LoadedVariant(engine=engine, info=info, model=model)


def answers_in_process(suite: str) -> dict[tuple[str, str], dict]:
    """What TinyBackend answers to every question of `suite`, computed here (no child, no store): the values a
    run of it must store, keyed by (record_id, question)."""
    from quantbench.protocol.suite import load_suite

    engine = TransformersEngine(tiny_model(), tiny_tokenizer())
    out = {}
    for record in load_suite(suite).records:
        for q, ans in engine.forward(engine.prepare(record.request)).items():
            out[(record.id, q)] = dict(
                benchmark=record.benchmark, options=list(ans.probabilities), probs=list(ans.probabilities.values()),
                top=ans.top, gold=(record.gold or {}).get(q), method=ans.method, truncated=ans.truncated)
    return out


class ReportingBackend(TinyBackend):
    """Its engine declares what a GPU engine reports (fused decoder ops, CUDA graph replays, some of them eager)
    and counts its warm() calls, so what the child does with the declared features is tested on the CPU."""

    def load(self, spec, machine):
        loaded = super().load(spec, machine)
        engine, warmed = loaded.engine, []
        engine.warm = lambda batch: warmed.append(len(batch))
        engine.report = lambda: EngineReport(fused_ops="rmsnorm+rope",
                                             graphs={"replays": 7, "eager_calls": 2, "warmed": len(warmed)})
        return loaded

class KeyedOptions(BackendOptions):
    api_key: str | None = opt(None, "test: a secret setting, as the http backend's", hashed=False, secret=True)


class KeyedTinyBackend(TinyBackend):
    """TinyBackend with a secret setting: the stored spec must mask it."""

    Options = KeyedOptions


class CrashBackend(TinyBackend):
    def load(self, spec, machine):
        os.abort()  # dies by SIGABRT with no result file, like a segfaulting kernel


class HangBackend(TinyBackend):
    def load(self, spec, machine):
        time.sleep(3600)


class RaiseBackend(TinyBackend):
    def load(self, spec, machine):
        loaded = super().load(spec, machine)

        def boom(prepared):
            raise RuntimeError("kernel exploded on purpose")

        loaded.engine.forward = boom
        return loaded


class LoadErrorBackend(TinyBackend):
    def load(self, spec, machine):
        raise LoadError("model.safetensors: missing key model.layers.0.mlp.experts.gate_up_proj")


class PidHangBackend(TinyBackend):
    """Writes its pid to $QUANTBENCH_TEST_PIDFILE (so a test can find and kill it), then hangs."""

    def load(self, spec, machine):
        Path(os.environ["QUANTBENCH_TEST_PIDFILE"]).write_text(str(os.getpid()))
        time.sleep(3600)


class LingeringBackend(TinyBackend):
    """Answers, writes its result, then takes its time to exit (an interpreter's teardown, a library's atexit
    hook): the window in which a stop signal or the timeout finds the run finished but its child still alive."""

    def load(self, spec, machine):
        import atexit  # only this backend's child

        atexit.register(time.sleep, 3600)
        return super().load(spec, machine)


class OutOfMemoryBackend(TinyBackend):
    """Runs out of memory for real: the address space is capped 256 MiB above what the process maps, then the
    load asks torch's allocator for 8 GiB (it raises, as it would on a host without the memory)."""

    def load(self, spec, machine):
        import resource

        mapped = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), resource.RLIM_INFINITY))
        torch.empty(8 << 30, dtype=torch.uint8)
        raise AssertionError("8 GiB were allocated under a 256 MiB cap")


class DiskFillingBackend(TinyBackend):
    """Fills the disk holding $QUANTBENCH_TEST_FILL while it loads (the disk fills up during a run), then answers."""

    def load(self, spec, machine):
        with open(os.environ["QUANTBENCH_TEST_FILL"], "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * (1 << 20))
                    fh.flush()
            except OSError:  # ENOSPC: the disk is full
                pass
        return super().load(spec, machine)
