"""Compile every Triton kernel for a GPU target without a GPU, with the tiles the launchers use there.

    python -m slora_vtc_kernels.compile_check [--arch 90] [--dtypes fp16,bf16] [--fail-on-spill]

Catches what the interpreter cannot: GPU-only compile errors (tl.dot shapes, layouts, dtypes) and
register spills (read from the cubin with cuobjdump, shipped with Triton). Exit status 1 if a kernel
fails to compile (or spills, with --fail-on-spill).
"""

import os

os.environ.pop("TRITON_INTERPRET", None)  # before any kernel is defined: compile, don't interpret

import argparse  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from . import decode_attention, extend_attention, kv_scatter, lora, prefill_attention, rmsnorm, rotary  # noqa: E402

TL = {"fp16": tl.float16, "bf16": tl.bfloat16, "fp32": tl.float32}
HEAD_DIM = 128
SHARED_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448}  # bytes a block may opt in to


def variants(dtype: str, hopper: bool):
    """(label, kernel, pointer types, constexprs, launch options) for each compiled configuration."""
    ptr, dot = f"*{dtype}", TL[dtype]
    precision = "ieee" if dtype == "fp32" else "tf32"
    yield "rms_norm", rmsnorm._rms_norm_kernel, dict(X=ptr, W=ptr, Out=ptr), dict(BLOCK=4096), dict(num_warps=8)
    yield (
        "rotary",
        rotary._rotary_kernel,
        dict(X=ptr, Pos="*i64", InvFreq="*fp32", Out=ptr),
        dict(HALF=64, BLOCK_H=32, BLOCK_HALF=64),
        {},
    )
    yield (
        "kv_scatter",
        kv_scatter._kv_scatter_kernel,
        dict(K=ptr, V=ptr, KCache=ptr, VCache=ptr, Slots="*i64"),
        dict(BLOCK_H=32, BLOCK_D=HEAD_DIM),
        {},
    )
    for head_dim in (64, 128, 256):
        tiles = prefill_attention.gpu_tiles(head_dim, hopper, dtype == "fp32")
        launch = dict(num_warps=tiles.pop("num_warps"), num_stages=tiles.pop("num_stages"))
        yield (
            f"prefill d={head_dim}",
            prefill_attention._prefill_kernel,
            dict(Q=ptr, K=ptr, V=ptr, Out=ptr, CuSeqlens="*i64"),
            dict(GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_dim, DOT_DTYPE=dot, PRECISION=precision, **tiles),
            launch,
        )
        tiles = extend_attention.gpu_tiles(head_dim, hopper, dtype == "fp32")
        launch = dict(num_warps=tiles.pop("num_warps"), num_stages=tiles.pop("num_stages"))
        yield (
            f"extend d={head_dim}",
            extend_attention._extend_kernel,
            dict(Q=ptr, KCache=ptr, VCache=ptr, Out=ptr, CuSeqlens="*i64", SlotTable="*i64", CachedLens="*i64"),
            dict(
                GROUP=4,
                HEAD_DIM=head_dim,
                BLOCK_D=head_dim,
                SLOT_OFFSET=tl.int32,
                DOT_DTYPE=dot,
                PRECISION=precision,
                **tiles,
            ),
            launch,
        )
    for group in (1, 4, 8):
        tiles = decode_attention.gpu_tiles(HEAD_DIM, group, hopper)
        for split in (False, True):
            yield (
                f"decode G={group} split={split}",
                decode_attention._decode_split_kernel,
                dict(
                    Q=ptr,
                    KCache=ptr,
                    VCache=ptr,
                    SlotTable="*i64",
                    SeqLens="*i64",
                    Out=ptr,
                    PartOut="*fp32",
                    PartLse="*fp32",
                ),
                dict(
                    GROUP=group,
                    BLOCK_G=1 if group == 1 else max(16, group),
                    HEAD_DIM=HEAD_DIM,
                    BLOCK_D=HEAD_DIM,
                    BLOCK_N=tiles["block_n"],
                    SLOT_OFFSET=tl.int32,
                    SPLIT=split,
                    DOT_DTYPE=dot,
                    PRECISION=precision,
                    NUM_STAGES=tiles["num_stages"],
                ),
                dict(num_warps=tiles["num_warps"]),
            )
    yield (
        "decode merge",
        decode_attention._decode_merge_kernel,
        dict(PartOut="*fp32", PartLse="*fp32", Out=ptr),
        dict(HEAD_DIM=HEAD_DIM, BLOCK_D=HEAD_DIM, BLOCK_S=16),
        {},
    )
    pool = dict(Cache=ptr, LoraSlots="*i64", Starts="*i64", Ranks="*i64", Scales="*fp32")  # LoraRows
    for block_r in (16, 64):  # BLOCK_R: the batch's largest rank, rounded up to a power of two
        yield (
            f"lora shrink R={block_r}",
            lora._shrink_kernel,
            dict(X=ptr, Y="*fp32", AdapterIds="*i64", **pool),
            dict(BLOCK_R=block_r, BLOCK_K=lora.gpu_block(block_r)),
            {},
        )
        yield (
            f"lora expand R={block_r}",
            lora._expand_kernel,
            dict(Y="*fp32", Out=ptr, AdapterIds="*i64", **pool),
            dict(BLOCK_R=block_r, BLOCK_O=lora.gpu_block(block_r)),
            {},
        )
        segments = dict(CuSeqlens="*i64", SegmentAdapters="*i64", **pool)
        yield (
            f"lora shrink segments R={block_r}",
            lora._shrink_segments_kernel,
            dict(X=ptr, Y="*fp32", **segments),
            dict(
                BLOCK_T=lora.GPU_SEGMENT_BLOCK_T,
                BLOCK_R=block_r,
                BLOCK_K=lora.GPU_SEGMENT_BLOCK,
                DOT_DTYPE=dot,
                PRECISION=precision,
            ),
            {},
        )
        yield (
            f"lora expand segments R={block_r}",
            lora._expand_segments_kernel,
            dict(Y="*fp32", Out=ptr, **segments),
            dict(
                BLOCK_T=lora.GPU_SEGMENT_BLOCK_T, BLOCK_R=block_r, BLOCK_O=lora.GPU_SEGMENT_BLOCK, PRECISION=precision
            ),
            {},
        )


def signature(kernel, pointers: dict, constexprs: dict) -> dict:
    """Pointers as given, constexprs marked, other scalars: fp32 for the scale-like floats, i32 otherwise."""
    floats = {"eps", "qk_scale", "scale"}
    return {
        p.name: "constexpr" if p.name in constexprs else pointers.get(p.name, "fp32" if p.name in floats else "i32")
        for p in kernel.params
    }


ALIGNED_INTS = {"chunk", "width", "hidden", "in_dim", "out_dim"}


def alignment(kernel, pointers: dict) -> dict:
    """The 16-divisibility hints a real launch gives: every pointer, and strides and widths (multiples of 16
    on Llama shapes). Without them loads are not vectorised and nothing is pipelined."""
    aligned = [
        i
        for i, p in enumerate(kernel.params)
        if p.name in pointers or p.name.startswith("stride") or p.name in ALIGNED_INTS
    ]
    return {(i,): [["tt.divisibility", 16]] for i in aligned}


def compile_kernel(kernel, pointers: dict, constexprs: dict, launch: dict, arch: int):
    source = triton.compiler.ASTSource(
        fn=kernel,
        signature=signature(kernel, pointers, constexprs),
        constexprs={(kernel.arg_names.index(name),): value for name, value in constexprs.items()},
        attrs=alignment(kernel, pointers),
    )
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4, num_stages=3) | launch)


def resource_usage(cubin: bytes) -> dict:
    """Registers and spill (stack) bytes per thread, from cuobjdump; empty if it is unavailable."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=60).stdout
        except OSError:
            return {}
    match = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"regs": int(match.group(1)), "spill_bytes": int(match.group(2))} if match else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch", type=int, default=90, help="compute capability as an int: 80 (A100), 86 (A10G), 90 (H100/H200)"
    )
    parser.add_argument("--dtypes", default="fp16,bf16,fp32")
    parser.add_argument("--fail-on-spill", action="store_true")
    args = parser.parse_args(argv)
    failures = 0
    shared_limit = SHARED_LIMIT.get(args.arch, 101376)
    for dtype in args.dtypes.split(","):
        for label, kernel, pointers, constexprs, launch in variants(dtype, hopper=args.arch >= 90):
            name = f"{label} [{dtype}]"
            try:
                compiled = compile_kernel(kernel, pointers, constexprs, launch, args.arch)
            except Exception as error:  # report every kernel, then fail
                failures += 1
                print(
                    f"{name:40s} FAILED: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                    flush=True,
                )
                continue
            usage, shared = resource_usage(compiled.asm["cubin"]), compiled.metadata.shared
            too_big = shared > shared_limit
            failures += too_big or (usage.get("spill_bytes", 0) > 0 and args.fail_on_spill)
            print(
                f"{name:40s} {'TOO MUCH SHARED MEMORY' if too_big else 'ok'}  regs={usage.get('regs', '?')} "
                f"spill_bytes={usage.get('spill_bytes', '?')} shared={shared}",
                flush=True,
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
