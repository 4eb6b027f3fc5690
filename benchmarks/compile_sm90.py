"""Compile the grouped-MoE kernels for Hopper (sm_90) on a machine without a GPU, and say what Triton made of them:
the MMA kind (3 = wgmma, 2 = mma.sync), the tensor-core instructions, how many waits follow them and how many
MMAs each wait lets stay in flight, the asynchronous copies (pipelined loads), registers, spills, shared memory
and the SASS instructions of the longest loop (the K loop).

    python3 benchmarks/compile_sm90.py [--tokens 512]

Needs the `triton` wheel (its ptxas and cuobjdump are in it), no GPU and no driver. Each kernel is compiled as the
engine launches it at the Qwen3-30B-A3B shape: its configuration from the format's pick_config at --tokens, pointers
and strides specialised as 16-byte aligned (as the JIT does at launch; without that, no load is vectorised or
pipelined and every figure here would be wrong). Register counts come from this ptxas and can differ by some
from the CUDA toolkit's on the H200 (159 there, 165 here for the int4 gate_up kernel). This is how the FP8 kernel's
old tile was found to lower its E4M3 dots to fp16 mma.sync (below 64 rows on the MMA's M side).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe import (  # noqa: E402
    fp8,
    gluon_common,
    int4_kernels,
    int4_wgmma,
    nvfp4,
    nvfp4_wgmma,
    w4a8_kernels,
)
from quantbench.engine.triton_common import rows_bucket  # noqa: E402

E, H, INTER, TOP_K = 128, 2048, 768, 8
FEATURES = {  # the projections as the engine calls them
    "gate_up": dict(GATHER=True, SWIGLU=True, ROW_SCALE=False, SCATTER=False),
    "down": dict(GATHER=False, SWIGLU=False, ROW_SCALE=True, SCATTER=True),
}
SHAPES = {"gate_up": (2 * INTER, H), "down": (H, INTER)}  # (N, K)


def compile_sm90(fn, pointer_types: dict[str, str], constexprs: dict, num_warps: int, num_stages: int,
                 ints_by_16: tuple[str, ...] = (), maxnreg: int | None = None) -> dict:
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "PDL" in fn.arg_names:  # as launched on an sm_90 GPU: programmatic dependent launch (quantbench.engine.pdl)
        constexprs = {"PDL": True, **constexprs}
    if getattr(fn, "is_gluon", lambda: False)():  # Gluon kernels take num_warps as a constexpr of their own
        # lazy: Gluon exists only in recent Triton builds, and only its kernels need this source class
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
        constexprs = dict(constexprs, num_warps=num_warps)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = pointer_types.get(name, "i32")
        # the JIT specialises pointers and integers that are multiples of 16 (strides here; ints_by_16: the
        # other integer arguments that are at this shape)
        if name in pointer_types or name.startswith("stride") or name in ints_by_16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    waits = [int(w) for w in re.findall(r"warp_group_dot_wait.*pendings = (\d+)", ttgir)]
    out = dict(mma="+".join(sorted(set(re.findall(r"versionMajor = (\d)", ttgir)))) or "-",
               wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"), waits=len(waits),
               int8_mma=ptx.count(".s32.s8.s8"),
               in_flight=max(waits, default=0), async_copies=ttgir.count("async_copy_global_to_local"),
               shared_kb=k.metadata.shared / 1024)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        Path(cubin).write_bytes(k.asm["cubin"])
        usage = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    out.update(registers=int(regs.group(1)) if regs else None, spill_bytes=int(stack.group(1)) if stack else None,
               loop=loop_length(sass), loop_spills=loop_spills(sass), pdl=pdl_order(sass),
               sass_sha256=hashlib.sha256(sass.encode()).hexdigest())  # an option off must leave this unchanged
    return out


GLOBAL_ACCESS = re.compile(r"^(LDG|STG|LDGSTS|ATOMG|ATOM|RED|UTMALDG|UTMASTG|UBLKCP)\b")
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")  # /*0a30*/  @P0 LDG.E R2, [R4.64] ;


def sass_instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction in nvdisasm's listing, in order."""
    return [(int(addr, 16), text) for addr, text in SASS_LINE.findall(sass)]


def pdl_order(sass: str) -> str:
    """Where the kernel waits for the one before it (quantbench.engine.pdl): "first" when griddepcontrol.wait (SASS
    ACQBULK) comes before every global memory access and the next kernel's launch (PREEXIT) after it; "-" with no
    wait; otherwise what comes first (a kernel launched early must not touch memory before its wait)."""
    ops = [words[1] if words[0].startswith("@") else words[0]  # past a predicate (@P0)
           for words in (text.split() for _, text in sass_instructions(sass))]
    if "ACQBULK" not in ops:
        return "-"
    wait = ops.index("ACQBULK")
    before = [op for op in ops[:wait] if GLOBAL_ACCESS.match(op) or op == "PREEXIT"]
    return "first" if not before else f"after {before[0]}"


def loops(sass: str) -> list[list[str]]:
    """The instructions of each loop (a backward branch's span), in the order of their branches."""
    ins = sass_instructions(sass)
    spans = []
    for addr, text in ins:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            spans.append([t for a, t in ins if int(target.group(1), 16) <= a <= addr])
    return spans


def loop_length(sass: str) -> int:
    """SASS instructions in the kernel's longest loop: the K loop, whose length per block is what the unpacking
    costs (NVFP4's fell from 648 to 372 when its codes were repacked); 0: no loop left (unrolled)."""
    return max((len(body) for body in loops(sass)), default=0)


def loop_spills(sass: str) -> int:
    """Local-memory loads and stores (spills) inside any loop: a register cap (maxnreg) may leave a few around a
    loop, never one in it."""
    return sum(1 for body in loops(sass) for text in body if re.search(r"\b(LDL|STL)\b", text))


# the arithmetic options of each Gluon kernel, off unless a plan turns them on (as its launch passes them)
KERNEL_OPTIONS = {"int4": {"SCALED": 0}, "nvfp4": {"DRAIN": 0, "RING": 0}}


def gluon_constexprs(tiles: dict, fmt: str = "int4") -> dict:
    """A Gluon kernel's constexprs for a WGMMA_TILES entry of format `fmt`, as its launch passes them
    (int4_wgmma.launch): the tile plan's defaults filled in, host-side keys (SPLIT: how many launches) left out;
    with SPLIT the kernel compiled is the launch of the largest tiles (ONLY 2)."""
    out = {"SMALL_M": 0, "MID_M": 0, "ONLY": -1, **KERNEL_OPTIONS[fmt], **tiles}
    if out.pop("SPLIT", None) and out["SMALL_M"]:
        out["ONLY"] = 2
    return out


def kernels(tokens: int):
    """(format, projection, launch options, kernel, pointer types, constexprs, integer arguments that are
    multiples of 16) for each kernel the engine runs."""
    rows = tokens * TOP_K
    common = dict(rowidx_ptr="*i32", rowscale_ptr="*bf16", rowdest_ptr="*i32", offs_ptr="*i32")
    for proj, (n, k) in SHAPES.items():
        cfg = {"SWAP_AB": False, "EVICT": False, **int4_kernels.pick_config(rows, E, n, k, 128, proj == "gate_up")}
        yield ("int4", proj, cfg, int4_kernels._kernel(),
               dict(x_ptr="*bf16", qw_ptr="*i32", s_ptr="*fp16", z_ptr="*u8", y_ptr="*bf16", **common),
               dict(K=k, G=128, **FEATURES[proj], E=E, E_P2=E), ())
        # the Gluon kernel with the tile an sm_90 GPU gets (pick_config with such a device)
        tiles = int4_kernels.WGMMA_TILES[gluon_common.plan_bucket(rows_bucket(rows, E), k)]
        cfg = dict(gluon_constexprs(tiles), num_warps=4, num_stages=1)
        yield ("int4 wgmma", proj, cfg, int4_wgmma._kernel(),
               dict(x_ptr="*bf16", qw_ptr="*i32", s_ptr="*fp16", z_ptr="*u8", y_ptr="*bf16", **common),
               dict(K=k, **FEATURES[proj], E=E, E_P2=E), ("N_OUT", "HALF"))
        cfg = {"SWAP_AB": False, **fp8.pick_config(rows, E, n, k)}
        fp8_types = dict(w_ptr="*fp8e4nv", s_ptr="*fp32", in_ptr="*fp32", codes_ptr="*fp32", **common)
        yield ("fp8", proj, cfg, fp8.fp8_grouped_mm_kernel, dict(x_ptr="*bf16", y_ptr="*bf16", **fp8_types),
               dict(K=k, FP8_DOT=True, DOT_F32=False, **FEATURES[proj], E=E, E_P2=E, X_CODES=False,
                    OUT_CODES=False, ROUND_BF16=True), ())
        # E4M3 codes between the projections: gate_up reads the tokens' codes and writes h's, down reads them
        cfg = {"SWAP_AB": False, **fp8.pick_config(rows, E, n, k, codes=True)}
        yield ("fp8 codes", proj, cfg, fp8.fp8_grouped_mm_kernel,
               dict(x_ptr="*fp8e4nv", y_ptr="*fp8e4nv" if proj == "gate_up" else "*bf16", **fp8_types),
               dict(K=k, FP8_DOT=True, DOT_F32=False, **FEATURES[proj], E=E, E_P2=E, X_CODES=True,
                    OUT_CODES=proj == "gate_up", ROUND_BF16=True), ())
        cfg = {"SWAP_AB": False, **nvfp4.pick_config(rows, E, n, k)}
        yield ("nvfp4", proj, cfg, nvfp4.nvfp4_grouped_mm_kernel,
               dict(x_ptr="*bf16", p_ptr="*u8", bs_ptr="*fp8e4nv", gs_ptr="*fp32", y_ptr="*bf16", **common),
               dict(K=k, DOT_F32=False, **FEATURES[proj], E=E, E_P2=E), ())
        # the Gluon NVFP4 kernel with the tile an sm_90 GPU gets (its packed words read as int32)
        tiles = nvfp4.WGMMA_TILES[gluon_common.plan_bucket(rows_bucket(rows, E), k)]
        cfg = dict(gluon_constexprs(tiles, "nvfp4"), num_warps=4, num_stages=1)
        yield ("nvfp4 wgmma", proj, cfg, nvfp4_wgmma._kernel(),
               dict(x_ptr="*bf16", pw_ptr="*i32", bs_ptr="*fp8e4nv", gs_ptr="*fp32", y_ptr="*bf16", **common),
               dict(K=k, **FEATURES[proj], E=E, E_P2=E), ("N_OUT", "HALF"))
        # W4A8 (--int4-activations int8): int8 token codes, their scales and zero-point terms, the packed bytes
        tiles = w4a8_kernels.tiles_for(rows, E, k)
        cfg = {"SMALL_M": 0, "MID_M": 0, "PIPE": 0, **tiles, "num_warps": tiles.get("num_warps", 4), "num_stages": 1}
        yield ("int4 w4a8", proj, cfg, w4a8_kernels._kernel(),
               dict(xq_ptr="*i8", sx_ptr="*fp32", xs_ptr="*fp32", pw_ptr="*u8", s_ptr="*fp16", z_ptr="*u8",
                    y_ptr="*bf16", **common),
               dict(K=k, **FEATURES[proj], E=E, E_P2=E), ("N_OUT", "HALF"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512, help="tokens of the decision (top-8 of 128 experts)")
    args = ap.parse_args()
    print(f"{'kernel':20s} {'mma':>3s} {'wgmma':>5s} {'sync':>4s} {'waits':>5s} {'flight':>6s} {'async':>5s} "
          f"{'regs':>4s} {'spill':>5s} {'smem KB':>7s} {'loop':>4s} {'pdl wait':>8s}  configuration at {args.tokens} tokens")
    for fmt, proj, cfg, fn, types, consts, ints_by_16 in kernels(args.tokens):
        cfg = dict(cfg)
        warps, stages, maxnreg = cfg.pop("num_warps"), cfg.pop("num_stages"), cfg.pop("maxnreg", None)
        r = compile_sm90(fn, types, {**consts, **cfg}, warps, stages, ints_by_16, maxnreg)
        print(f"{fmt + ' ' + proj:20s} {r['mma']:>3s} {r['wgmma']:5d} {r['mma_sync']:4d} {r['waits']:5d} "
              f"{r['in_flight']:6d} {r['async_copies']:5d} {r['registers'] or 0:4d} {r['spill_bytes'] or 0:5d} "
              f"{r['shared_kb']:7.1f} {r['loop'] or '-':>4} {r['pdl']:>8s}  {cfg} warps {warps} stages {stages}", flush=True)


if __name__ == "__main__":
    main()
