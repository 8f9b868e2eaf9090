"""The steps of scripts/gpu_check.sh that are easier in Python, and its report.

    gpu_check_helper.py environment --record F [--dry-run]   versions; a GPU is required unless --dry-run
    gpu_check_helper.py install --shim DIR --record F [--mode auto|pip|path]
    gpu_check_helper.py tests --junit F --record F [--dry-run] -- PYTEST_ARGS...
    gpu_check_helper.py kernel-bench --out F [--dry-run] [--peak-gbps 4800] -- BENCH_ARGS...
    gpu_check_helper.py report --work DIR --dest DIR --steps a,b,... [--dry-run] [--final]

Only the standard library is imported at the top: this runs before the project is installed, on a
machine that has its own python3 and no network. Exit status of `environment`: 3 when there is no
GPU (nvidia-smi or torch.cuda missing), 1 for other problems, 0 otherwise.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEAK_GBPS = 4800.0  # H200 HBM3e
BANDWIDTH_TARGET = 0.60  # decode attention: at least this fraction of the peak
RESULT_FILES = (
    "summary.json",
    "summary.txt",
    "logs.txt",
    "kernel_bench.json",
    "model_bench.json",
    "profile.json",
    "run_vtc.jsonl",
    "run_fcfs.jsonl",
)  # everything the check leaves in its result folder (at most 8)
REQUIRED = ("torch", "triton", "numpy", "pandas", "pytest", "safetensors")
REPORTED = (*REQUIRED, "transformers", "matplotlib", "hypothesis", "peft", "tqdm", "setuptools", "pip")
NO_GPU = 3


def write_json(path: str | Path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def read_json(path: str | Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- environment


def cmd_environment(args) -> int:
    info: dict = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "machine": platform.machine(),
        "dry_run": args.dry_run,
        "packages": {},
    }
    for name in REPORTED:
        try:
            info["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info["packages"][name] = None
    missing = [name for name in REQUIRED if info["packages"][name] is None]
    no_gpu = []
    smi = shutil.which("nvidia-smi")
    if smi is None:
        no_gpu.append("nvidia-smi is not on PATH")
    else:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.returncode:
                no_gpu.append(
                    f"nvidia-smi failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[:300]}"
                )
            else:
                info["nvidia_smi"] = done.stdout.strip()
        except subprocess.TimeoutExpired:
            no_gpu.append("nvidia-smi did not answer within 30 s")
    try:
        import torch

        info["torch_cuda_build"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if info["cuda_available"]:
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        else:
            no_gpu.append(
                f"torch.cuda.is_available() is False (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
            )
    except Exception as error:  # a broken torch is reported like a missing one
        no_gpu.append(f"torch does not import: {type(error).__name__}: {error}")
    info["no_gpu"] = no_gpu
    info["missing"] = missing
    write_json(args.record, info)
    print(json.dumps(info, indent=1))
    if missing:
        print(f"gpu_check: missing packages: {', '.join(missing)}", file=sys.stderr)
    if no_gpu and args.dry_run:
        print("dry run: on the CPU; nvidia-smi and CUDA are not needed (" + "; ".join(no_gpu) + ")")
    elif no_gpu:
        print("gpu_check: no GPU: " + "; ".join(no_gpu), file=sys.stderr)
        return NO_GPU
    return 1 if missing else 0


# ---------------------------------------------------------------- install

TQDM_SHIM = '''"""A stand-in for tqdm written by scripts/gpu_check.sh where tqdm is not installed: no progress bars."""


class tqdm:
    def __init__(self, iterable=None, *args, total=None, **kwargs):
        self.iterable, self.total, self.n = iterable, total, 0

    def __iter__(self):
        for item in self.iterable if self.iterable is not None else ():
            self.n += 1
            yield item

    def __len__(self):
        return len(self.iterable) if self.iterable is not None else (self.total or 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.n += n

    def close(self):
        pass

    def refresh(self, *args, **kwargs):
        pass

    def set_description(self, *args, **kwargs):
        pass

    def set_postfix(self, *args, **kwargs):
        pass

    @staticmethod
    def write(text, *args, **kwargs):
        print(text)


def trange(*args, **kwargs):
    return tqdm(range(*args), **kwargs)
'''

VERIFY = """
import json, slora_vtc, slora_vtc_kernels, slora_vtc.cli, slora_vtc.profile
print(json.dumps({"slora_vtc": slora_vtc.__file__, "slora_vtc_kernels": slora_vtc_kernels.__file__}))
"""


def _python_env(pythonpath: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _imports_this_checkout(pythonpath: str) -> tuple[bool, str]:
    """Whether slora_vtc and slora_vtc_kernels import, from another folder, out of this repository."""
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [sys.executable, "-c", VERIFY],
            cwd=cwd,
            env=_python_env(pythonpath),
            capture_output=True,
            text=True,
            timeout=120,
        )
    if done.returncode:
        return False, (done.stderr.strip().splitlines() or ["?"])[-1]
    paths = json.loads(done.stdout.strip().splitlines()[-1])
    want = {"slora_vtc": REPO / "slora_vtc", "slora_vtc_kernels": REPO / "kernels"}
    wrong = [f"{name} from {path}" for name, path in paths.items() if Path(path).resolve().parent != want[name]]
    return (False, "imports another copy: " + ", ".join(wrong)) if wrong else (True, json.dumps(paths))


def _has_module(name: str, pythonpath: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", f"import {name}"], env=_python_env(pythonpath), capture_output=True, timeout=60
    )
    return done.returncode == 0


def cmd_install(args) -> int:
    shim = Path(args.shim)
    shim.mkdir(parents=True, exist_ok=True)
    record = {"mode": args.mode, "method": None, "shims": [], "pythonpath": str(shim)}
    if not _has_module("tqdm", str(shim)):  # the package imports tqdm at the top of its run/profile modules
        (shim / "tqdm").mkdir(exist_ok=True)
        (shim / "tqdm" / "__init__.py").write_text(TQDM_SHIM)
        (shim / "tqdm" / "auto.py").write_text("from tqdm import tqdm, trange  # noqa: F401\n")
        record["shims"].append("tqdm (not installed: a stand-in without progress bars)")
        print(f"tqdm is missing: a stand-in in {shim}/tqdm", flush=True)
    if args.mode in ("auto", "pip"):
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-e",
            str(REPO),
        ]
        print("$ " + " ".join(command), flush=True)
        try:
            done = subprocess.run(command, cwd=REPO, timeout=args.pip_timeout)
            ok, detail = (
                _imports_this_checkout(str(shim)) if done.returncode == 0 else (False, f"pip exit {done.returncode}")
            )
        except subprocess.TimeoutExpired:
            ok, detail = False, f"pip ran past {args.pip_timeout} s"
        if ok:
            record["method"] = "pip install -e (offline)"
        else:
            print(f"pip could not install the project offline ({detail})", flush=True)
            if args.mode == "pip":
                write_json(args.record, record)
                return 1
    if record["method"] is None:  # a path setup: this checkout's packages, by their installed names
        for name, target in (("slora_vtc", REPO / "slora_vtc"), ("slora_vtc_kernels", REPO / "kernels")):
            link = shim / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target, target_is_directory=True)
        record["method"] = f"PYTHONPATH={shim} (slora_vtc -> slora_vtc/, slora_vtc_kernels -> kernels/)"
    ok, detail = _imports_this_checkout(str(shim))
    record["verified"], record["detail"] = ok, detail
    Path(args.record).with_name("pythonpath").write_text(str(shim))
    write_json(args.record, record)
    print(json.dumps(record, indent=1))
    return 0 if ok else 1


# ---------------------------------------------------------------- tests


def junit_counts(path: str | Path, dry_run: bool = False) -> dict:
    """Test outcomes; CUDA ones counted apart (none in a dry run: the model test then runs on the CPU)."""
    counts = dict(tests=0, passed=0, failed=0, skipped=0, cuda_passed=0, cuda_skipped=0, failures=[])
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cuda = not dry_run and ("cuda" in case.get("name", "") or "test_real_triton" in name)
        counts["tests"] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            counts["cuda_skipped"] += cuda
        else:
            counts["passed"] += 1
            counts["cuda_passed"] += cuda
    return counts


def test_counts(counts: dict) -> str:
    where = (
        "the CUDA variants skipped: a dry run, in the Triton interpreter"
        if counts.get("dry_run")
        else f"on CUDA: {counts['cuda_passed']} passed, {counts['cuda_skipped']} skipped"
    )
    return f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped ({where})"


def cmd_tests(args) -> int:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        f"--junitxml={args.junit}",
        *args.pytest_args,
    ]
    print("$ " + " ".join(command), flush=True)
    rc = subprocess.run(command, cwd=REPO).returncode
    counts = junit_counts(args.junit, args.dry_run)
    counts["dry_run"] = args.dry_run
    write_json(args.record, counts)
    print(f"tests: {test_counts(counts)}")
    if rc:
        return rc
    if not args.dry_run and counts["cuda_passed"] == 0:
        print("gpu_check: no test ran on CUDA", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- kernel benchmark


def decode_headline(report: dict, peak_gbps: float) -> dict | None:
    """The best decode attention case (default tiles) as a fraction of the peak, against the target."""
    cases = [c for c in report.get("decode", []) if isinstance(c, dict) and "gbps" in c]
    if not cases:
        return None
    best = max(cases, key=lambda c: c["gbps"])
    fraction = best["gbps"] / peak_gbps
    return {
        "case": best["case"],
        "gbps": best["gbps"],
        "peak_gbps": peak_gbps,
        "fraction_of_peak": round(fraction, 3),
        "target": f">= {BANDWIDTH_TARGET:.2f}",
        "target_met": fraction >= BANDWIDTH_TARGET,
        "by_case": {c["case"]: round(c["gbps"] / peak_gbps, 3) for c in cases},
    }


def tiny_kernel_bench(out: str, peak_gbps: float) -> dict:
    """The benchmark's own functions at tiny sizes, on the CPU in the Triton interpreter (timings mean nothing)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    from slora_vtc_kernels import bench, ops
    from slora_vtc_kernels import reference as ref

    def cpu_time_ms(fn, warmup: int, iters: int) -> float:
        for _ in range(warmup):
            fn()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1000 / iters

    bench.DEVICE, bench.HEAD_DIM, bench.PREFILL_HEADS, bench.time_ms = "cpu", 32, 2, cpu_time_ms
    args = argparse.Namespace(warmup=1, iters=2, peak_gbps=peak_gbps)
    triton_ops, gen = ops("triton"), torch.Generator().manual_seed(0)
    report = dict(
        device="cpu (Triton interpreter)",
        dry_run=True,
        torch=torch.__version__,
        triton=triton.__version__,
        peak_gbps=peak_gbps,
        decode=[],
        decode_sweep=[],
        prefill=[],
    )
    for case in (("tiny_b2_ctx16", 2, 16, 4, 4), ("tiny_gqa_b2_ctx16", 2, 16, 4, 2)):
        result, _ = bench.bench_decode(triton_ops, ref, case, args, gen, sweep=False)
        report["decode"].append(result)
    report["prefill"].append(bench.bench_prefill(triton_ops, ("tiny_prefill_2x8", [8, 8]), args, gen))
    write_json(out, report)
    return report


def cmd_kernel_bench(args) -> int:
    if args.dry_run:
        report = tiny_kernel_bench(args.out, args.peak_gbps)
    else:
        os.environ["TRITON_INTERPRET"] = "0"
        command = [
            sys.executable,
            "-m",
            "slora_vtc_kernels.bench",
            "--peak-gbps",
            str(args.peak_gbps),
            "--out",
            args.out,
            *args.bench_args,
        ]
        print("$ " + " ".join(command), flush=True)
        rc = subprocess.run(command, cwd=REPO).returncode
        if rc:
            return rc
        report = read_json(args.out) or {}
    headline = decode_headline(report, args.peak_gbps)
    if headline is None:
        print(
            f"gpu_check: the kernel benchmark measured no decode attention case: {report.get('skipped', 'no result')}",
            file=sys.stderr,
        )
        return 1
    errors = {c["case"]: c.get("max_abs_err") for c in report["decode"] + report.get("prefill", [])}
    print(
        f"decode attention: {headline['gbps']} GB/s = {headline['fraction_of_peak']:.2f} of {args.peak_gbps:.0f} GB/s "
        f"({headline['case']}); target {headline['target']}: {'met' if headline['target_met'] else 'NOT met'}"
    )
    print(f"max abs error against the torch reference: {errors}")
    return 0


# ---------------------------------------------------------------- report


def read_steps(work: Path) -> list[dict]:
    steps = []
    try:
        lines = (work / "steps.tsv").read_text().splitlines()
    except OSError:
        return steps
    for line in lines:
        name, status, rc, seconds, limit = (line.split("\t") + [""] * 5)[:5]
        steps.append(
            dict(
                name=name,
                status=status,
                passed=status == "passed",
                rc=int(rc) if rc.lstrip("-").isdigit() else None,
                seconds=int(seconds) if seconds.isdigit() else None,
                limit_s=int(limit) if limit.isdigit() else None,
            )
        )
    return steps


def run_summary(path: Path) -> dict | None:
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as error:
        return {"error": str(error)} if path.exists() else None
    if not lines:
        return {"error": "empty"}
    run = lines[0]
    responses = run["result"]["responses"]
    clients: dict[str, dict] = {}
    for r in responses:
        c = clients.setdefault(r["client"], dict(requests=0, finished=0, output_tokens=0, first_token_s=[]))
        c["requests"] += 1
        if r.get("status", "finished") == "finished":
            c["finished"] += 1
            c["output_tokens"] += r["output_len"]
            c["first_token_s"].append(r["first_token_latency"])
    for c in clients.values():
        times = c.pop("first_token_s")
        c["mean_first_token_s"] = round(sum(times) / len(times), 3) if times else None
    config = run.get("config", {})
    return {
        "scheduler": config.get("scheduler"),
        "backend": config.get("backend"),
        "model": config.get("model"),
        "suite": config.get("suite"),
        "duration": config.get("duration"),
        "total_time_s": round(run["result"]["total_time"], 2),
        "requests": len(responses),
        "finished": sum(c["finished"] for c in clients.values()),
        "clients": dict(sorted(clients.items())),
    }


def profile_summary(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        from slora_vtc.profile import load_profile

        points = load_profile(path)
    except Exception as error:  # recorded, not raised: the report always gets written
        return {"loads": False, "error": f"{type(error).__name__}: {error}"}
    return {
        "loads": True,
        "points": len(points),
        "grid": [
            [p.input_len, p.output_len, p.batch_size, round(1000 * p.prefill_s, 3), round(1000 * p.decode_s, 3)]
            for p in points
        ],
        "grid_columns": ["input", "output", "batch", "prefill_ms_per_request", "decode_ms_per_request"],
    }


def model_bench_summary(report: dict | None, peak_gbps: float) -> dict | None:
    if not report:
        return None
    attention = [
        {**a, "fraction_of_peak": round(a["gb_per_s"] / peak_gbps, 3)} for a in report.get("decode_attention", [])
    ]
    keep = (
        "backend",
        "model",
        "dtype",
        "gpu",
        "params",
        "load_and_warmup_s",
        "prompt",
        "decode_steps",
        "decode_tokens_per_s",
        "prefill_tokens_per_s",
    )
    return {**{k: report.get(k) for k in keep}, "decode_attention": attention}


def text_report(summary: dict) -> str:
    env, res = summary.get("environment") or {}, summary["results"]
    packages = env.get("packages", {})
    lines = [
        f"gpu_check {summary['started']}  git {summary['git']}  "
        + ("DRY RUN on the CPU: tiny sizes, the numbers mean nothing" if summary["dry_run"] else "GPU run"),
        f"python {env.get('python_version', '?')} ({env.get('python', '?')}): "
        + ", ".join(f"{k} {packages.get(k) or '-'}" for k in ("torch", "triton", "transformers")),
        f"gpu: {env.get('gpu') or env.get('nvidia_smi') or '; '.join(env.get('no_gpu', [])) or '?'}",
        f"install: {(summary.get('install') or {}).get('method') or '?'}"
        + "".join(f"; shim: {s}" for s in (summary.get("install") or {}).get("shims", [])),
        "",
        f"{'step':18s} {'status':30s} {'seconds':>7s} {'limit':>6s}",
    ]
    for s in summary["steps"]:
        lines.append(
            f"{s['name']:18s} {s['status']:30s} "
            f"{s['seconds'] if s['seconds'] is not None else '':>7} {s['limit_s'] or '':>6}"
        )
    lines += ["", "results"]
    if res.get("decode_attention"):
        h = res["decode_attention"]
        lines.append(
            f"  decode attention (kernel bench): {h['gbps']} GB/s = {h['fraction_of_peak']:.3f} of "
            f"{h['peak_gbps']:.0f} GB/s ({h['case']}); target {h['target']}: {'met' if h['target_met'] else 'NOT met'}"
        )
    mb = res.get("model_bench")
    if mb:
        lines.append(
            f"  {mb['model']} ({mb['backend']}, {mb['dtype']}) decode tokens/s by batch: "
            + ", ".join(f"{b}: {v:.0f}" for b, v in (mb.get("decode_tokens_per_s") or {}).items())
        )
        lines.append(
            f"  {mb['model']} prefill tokens/s by prompt length: "
            + ", ".join(f"{n}: {v:.0f}" for n, v in (mb.get("prefill_tokens_per_s") or {}).items())
        )
        lines.append(
            "  decode attention through the backend: "
            + ", ".join(
                f"batch {a['batch']}: {a['gb_per_s']:.0f} GB/s ({a['fraction_of_peak']:.2f})"
                for a in mb["decode_attention"]
            )
        )
    tests = res.get("kernel_tests")
    if tests:
        lines.append(f"  kernel tests: {test_counts(tests)}")
    prof = res.get("profile")
    if prof:
        lines.append(
            f"  profile: {prof['points']} points, loads with slora_vtc.profile.load_profile"
            if prof["loads"]
            else f"  profile: does not load: {prof['error']}"
        )
    for name in ("run_vtc", "run_fcfs"):
        run = res.get(name)
        if run and "error" not in run:
            lines.append(
                f"  {name}: {run['finished']}/{run['requests']} finished in {run['total_time_s']} s "
                f"({run['backend']}, {run['model']}); "
                + ", ".join(
                    f"{c}: {v['output_tokens']} tokens out, first token {v['mean_first_token_s']} s"
                    for c, v in run["clients"].items()
                )
            )
        elif run:
            lines.append(f"  {name}: unreadable ({run['error']})")
    lines += [
        "",
        f"total {summary['total_s']} s of a {summary['budget_s']} s budget; "
        f"{'all steps passed' if summary['all_passed'] else 'SOME STEPS FAILED'}"
        + ("" if summary["final"] else " (still running)"),
        f"files: {', '.join(summary['files'])}"
        + (
            f"  WARNING: {len(summary['files'])} files, only 8 come back from the GPU machine"
            if len(summary["files"]) > 8
            else ""
        ),
    ]
    return "\n".join(lines) + "\n"


def cmd_report(args) -> int:
    work, dest = Path(args.work), Path(args.dest)
    recorded = {s["name"]: s for s in read_steps(work)}
    steps = [
        recorded.get(
            name,
            dict(
                name=name,
                status=args.not_run if args.final else "pending",
                passed=False,
                rc=None,
                seconds=None,
                limit_s=None,
            ),
        )
        for name in args.steps.split(",")
    ]
    steps += [s for name, s in recorded.items() if name not in args.steps.split(",")]
    with (dest / "logs.txt").open("w") as logs:  # every step's output, in order
        for s in steps:
            log = work / "logs" / f"{s['name']}.log"
            if log.exists():
                logs.write(f"==== {s['name']}: {s['status']}\n")
                logs.write(log.read_text(errors="replace"))
                logs.write("\n")
    for s in steps:
        log = work / "logs" / f"{s['name']}.log"
        if not s["passed"] and log.exists():
            s["log_tail"] = log.read_text(errors="replace").splitlines()[-15:]
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    kernel_bench = read_json(dest / "kernel_bench.json")
    summary = {
        "dry_run": args.dry_run,
        "final": args.final,
        "started": args.started,
        "git": git.stdout.strip() or "?",
        "budget_s": args.budget,
        "total_s": int(time.time()) - int(args.start_epoch),
        "all_passed": all(s["passed"] or s["status"] == "skipped" for s in steps),
        "steps": steps,
        "environment": read_json(work / "environment.json"),
        "install": read_json(work / "install.json"),
        "results": {
            "decode_attention": decode_headline(kernel_bench, args.peak_gbps) if kernel_bench else None,
            "model_bench": model_bench_summary(read_json(dest / "model_bench.json"), args.peak_gbps),
            "kernel_tests": read_json(work / "kernel_tests.json"),
            "profile": profile_summary(dest / "profile.json"),
            "run_vtc": run_summary(dest / "run_vtc.jsonl"),
            "run_fcfs": run_summary(dest / "run_fcfs.jsonl"),
        },
    }
    summary["files"] = sorted({*(p.name for p in dest.iterdir() if p.is_file()), "summary.json", "summary.txt"})
    write_json(dest / "summary.json", summary)
    (dest / "summary.txt").write_text(text_report(summary))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("environment")
    env.add_argument("--record", required=True)
    env.add_argument("--dry-run", action="store_true")
    env.set_defaults(func=cmd_environment)
    inst = sub.add_parser("install")
    inst.add_argument("--shim", required=True, help="folder for the path setup and stand-ins (put on PYTHONPATH)")
    inst.add_argument("--record", required=True)
    inst.add_argument("--mode", default="auto", choices=["auto", "pip", "path"], help="auto: pip, else the path setup")
    inst.add_argument("--pip-timeout", type=int, default=60)
    inst.set_defaults(func=cmd_install)
    tests = sub.add_parser("tests")
    tests.add_argument("--junit", required=True)
    tests.add_argument("--record", required=True)
    tests.add_argument("--dry-run", action="store_true")
    tests.add_argument("pytest_args", nargs="*")
    tests.set_defaults(func=cmd_tests)
    kb = sub.add_parser("kernel-bench")
    kb.add_argument("--out", required=True)
    kb.add_argument("--dry-run", action="store_true")
    kb.add_argument("--peak-gbps", type=float, default=PEAK_GBPS)
    kb.add_argument("bench_args", nargs="*")
    kb.set_defaults(func=cmd_kernel_bench)
    rep = sub.add_parser("report")
    for flag in ("--work", "--dest", "--steps", "--started", "--start-epoch"):
        rep.add_argument(flag, required=True)
    rep.add_argument("--budget", type=int, required=True)
    rep.add_argument("--peak-gbps", type=float, default=PEAK_GBPS)
    rep.add_argument("--dry-run", action="store_true")
    rep.add_argument("--final", action="store_true")
    rep.add_argument("--not-run", default="not run", help="the status of steps that did not run (with --final)")
    rep.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
