#!/usr/bin/env python3
"""Counterbalanced, fresh-JIT benchmark rounds of Tile variants with a torch eager baseline.

Every (case, variant) output is checked in full against a float64 oracle before any of its
timings is recorded. Four timing families are measured and stored apart (bench/SCHEMA.md):
warm batched host-wall throughput, individually synchronized host-wall latency, per-kernel
GPU time from CUPTI activity records (through torch.profiler) and CUDA-event stream time.

    python bench/repeat.py --case softmax:37x1537:f32 --variant policy=policy \
        --variant packed='{"programs_per_group":2}' --out results/run1
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SCHEMA = "tile-repeat/1"
FAMILIES = ["throughput", "latency", "gpu_time", "stream_time"]
OPS = ["softmax", "log_softmax", "rms_norm", "layer_norm"]
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}
# Oracle tolerances per output dtype: |y - ref| <= rtol*|ref| + atol*max|ref in row| + floor.
TOLERANCE = {"f32": (2e-5, 1e-6, 0.0), "f16": (1.5e-3, 1e-4, 6e-8), "bf16": (8e-3, 1e-4, 1e-38)}


def log(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------- arguments

def parse_case(text: str) -> dict:
    try:
        op, shape, dtype = text.split(":")
        rows, cols = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        raise SystemExit(f"repeat.py: --case expects OP:ROWSxCOLS:DTYPE, got '{text}'")
    if op not in OPS:
        raise SystemExit(f"repeat.py: --case operator must be one of {OPS}, got '{op}'")
    if dtype not in TOLERANCE:
        raise SystemExit(f"repeat.py: --case dtype must be one of {list(TOLERANCE)}, got '{dtype}'")
    if rows < 1 or cols < 1:
        raise SystemExit(f"repeat.py: --case needs rows and cols >= 1, got {rows}x{cols}")
    return {"id": f"{op}-{rows}x{cols}-{dtype}", "op": op, "rows": rows, "cols": cols, "dtype": dtype}


def parse_variant(text: str) -> dict:
    name, sep, plan = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"repeat.py: --variant expects NAME=policy or NAME=<plan JSON>, got '{text}'")
    if name == "torch_eager":
        raise SystemExit("repeat.py: the variant name 'torch_eager' is reserved for the baseline")
    if plan == "policy":
        return {"name": name, "kind": "native", "plan": "policy"}
    try:
        fields = json.loads(plan)
    except json.JSONDecodeError as e:
        raise SystemExit(f"repeat.py: --variant {name}: plan is not JSON ({e}): {plan}")
    if not isinstance(fields, dict):
        raise SystemExit(f"repeat.py: --variant {name}: plan must be a JSON object, got {plan}")
    return {"name": name, "kind": "native", "plan": fields}


def abba_orders(names: list[str], rounds: int) -> list[list[str]]:
    orders = [list(names)]
    for _ in range(1, rounds):
        orders.append(list(reversed(orders[-1])))
    return orders


# ----------------------------------------------------------------------------- provenance

def run_text(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_state() -> dict | None:
    q = run_text(["nvidia-smi", "--query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,"
                  "clocks_throttle_reasons.active", "--format=csv,noheader,nounits"])
    if not q:
        return None
    name, uuid, driver, sm, mem, throttle = [v.strip() for v in q.splitlines()[0].split(",")]
    apps = run_text(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"]) or ""
    procs = []
    for line in apps.splitlines():
        pid, _, pname = line.partition(",")
        if pid.strip().isdigit() and int(pid) != os.getpid():
            procs.append({"pid": int(pid), "name": pname.strip()})
    reasons = [] if throttle in ("0x0000000000000000", "[N/A]") else [throttle]
    return {"name": name, "uuid": uuid, "driver": driver, "clocks": {"sm_mhz": int(sm), "mem_mhz": int(mem)},
            "throttle": reasons, "processes": procs}


def library_path() -> str | None:
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            if line.endswith("libtile.so"):
                return line.split()[-1]
    except OSError:
        pass
    return None


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_state(repo: Path) -> dict:
    # A copy without .git (as on a machine the tree was copied to) reads TILE_GIT_COMMIT.
    commit = run_text(["git", "-C", str(repo), "rev-parse", "HEAD"]) or os.environ.get("TILE_GIT_COMMIT", "unknown")
    status = run_text(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(status) if status is not None else True}


# ----------------------------------------------------------------------------- statistics

def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def family_stats(samples: list[float], launches: int) -> dict:
    return {"launches_per_sample": launches, "samples": samples, "median": median(samples),
            "min": min(samples), "max": max(samples), "mean": sum(samples) / len(samples)}


# ----------------------------------------------------------------------------- arrays

class Workload:
    """Inputs, outputs and callables of one case on one backend."""

    def __init__(self, case: dict, backend: str, seed: int, torch_mod):
        self.case, self.backend, self.torch = case, backend, torch_mod
        rows, cols, dtype = case["rows"], case["cols"], case["dtype"]
        rng = np.random.default_rng(seed)
        x64 = rng.standard_normal((rows, cols))
        x64[x64 == 0] = 0.5
        w64 = rng.normal(1.0, 0.5, cols)
        b64 = rng.normal(0.0, 0.5, cols)
        self.np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": None}[dtype]
        if backend == "cuda":
            t = torch_mod
            tdt = {"f32": t.float32, "f16": t.float16, "bf16": t.bfloat16}[dtype]
            self.x = t.from_numpy(x64).to("cuda", tdt)
            self.w = t.from_numpy(w64).to("cuda", tdt)
            self.b = t.from_numpy(b64).to("cuda", tdt)
            self.out = t.empty_like(self.x)
            self.sync = t.cuda.synchronize
        else:
            if self.np_dtype is None:
                raise SystemExit("repeat.py: bf16 cases need the CUDA backend (numpy has no bf16)")
            self.x, self.w, self.b = (a.astype(self.np_dtype) for a in (x64, w64, b64))
            self.out = np.empty_like(self.x)
            self.sync = lambda: None
        self.has_weight = case["op"] in ("rms_norm", "layer_norm")
        self.has_bias = case["op"] == "layer_norm"

    def host(self, a) -> np.ndarray:
        if self.backend == "cuda":
            return a.detach().float().cpu().numpy().astype(np.float64)
        return a.astype(np.float64)

    def poison_out(self) -> None:
        if self.backend == "cuda":
            self.out.fill_(float("nan"))
        else:
            self.out.fill(np.nan)

    def output_bytes(self, out) -> bytes:
        if self.backend == "cuda":
            return out.contiguous().view(self.torch.uint8).cpu().numpy().tobytes()
        return np.ascontiguousarray(out).tobytes()

    def native_call(self, tile_mod, plan):
        op, kw = self.case["op"], {"out": self.out, "plan": plan}
        if op in ("softmax", "log_softmax"):
            fn = getattr(tile_mod, op)
            return lambda: fn(self.x, **kw)
        if op == "rms_norm":
            return lambda: tile_mod.rms_norm(self.x, weight=self.w, eps=EPS[op], **kw)
        return lambda: tile_mod.layer_norm(self.x, weight=self.w, bias=self.b, eps=EPS[op], **kw)

    def torch_call(self):
        """Torch eager: softmax family with out=, norms allocating their outputs."""
        t, op, cols = self.torch, self.case["op"], self.case["cols"]
        F = t.nn.functional
        if op in ("softmax", "log_softmax"):
            fn = getattr(t, op)
            try:
                fn(self.x, -1, out=self.out)
                return lambda: fn(self.x, -1, out=self.out)
            except TypeError:  # builds without the public out= overload
                inner = getattr(t, "_" + op)
                return lambda: inner(self.x, -1, False, out=self.out)
        if op == "rms_norm":
            return lambda: F.rms_norm(self.x, (cols,), self.w, EPS[op])
        return lambda: F.layer_norm(self.x, (cols,), self.w, self.b, EPS[op])

def oracle(case: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float64 reference from the inputs as stored (PyTorch semantics)."""
    op, cols = case["op"], case["cols"]
    if op in ("softmax", "log_softmax"):
        m = x.max(axis=1, keepdims=True)
        s = np.exp(x - m).sum(axis=1, keepdims=True)
        return np.exp(x - m) / s if op == "softmax" else x - m - np.log(s)
    if op == "rms_norm":
        return x / np.sqrt((x * x).sum(axis=1, keepdims=True) / cols + EPS[op]) * w
    mean = x.sum(axis=1, keepdims=True) / cols
    var = ((x - mean) ** 2).sum(axis=1, keepdims=True) / cols
    return (x - mean) / np.sqrt(var + EPS[op]) * w + b


def check_output(case: dict, got: np.ndarray, ref: np.ndarray) -> dict:
    rtol, atol, floor = TOLERANCE[case["dtype"]]
    row_max = np.abs(np.where(np.isfinite(ref), ref, 0)).max(axis=1, keepdims=True)
    err = np.abs(got - ref)
    tol = rtol * np.abs(ref) + atol * row_max + floor
    bad = ~(err <= tol) | (np.isnan(ref) != np.isnan(got))
    finite = np.isfinite(ref) & np.isfinite(got)
    rel = np.where(finite & (ref != 0), err / np.where(ref == 0, 1, np.abs(ref)), 0)
    return {"passed": not bool(bad.any()), "checked": int(ref.size), "mismatches": int(bad.sum()),
            "max_abs_error": float(np.where(finite, err, 0).max()), "max_rel_error": float(rel.max())}


# ----------------------------------------------------------------------------- timing

def calibrate(fn, sync, warmup_ms: float, target_ms: float) -> int:
    """Warm up for warmup_ms, then size a batch to about target_ms."""
    start = time.perf_counter()
    calls = 0
    while (time.perf_counter() - start) * 1e3 < warmup_ms or calls < 3:
        fn()
        calls += 1
        if calls % 16 == 0:
            sync()
    # Double a probe batch until it lasts a fifth of the target, then scale to the target.
    n = 8
    while True:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        if elapsed_ms >= target_ms / 5 or n >= 1 << 20:
            return max(1, int(target_ms * n / max(elapsed_ms, 1e-6)))
        n *= 2


def time_throughput(fn, sync, k: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / k


def time_latency(fn, sync, k: int) -> float:
    total = 0.0
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        sync()
        total += time.perf_counter() - t0
    return total * 1e6 / k


def time_stream(torch_mod, fn, k: int) -> float:
    start, stop = torch_mod.cuda.Event(enable_timing=True), torch_mod.cuda.Event(enable_timing=True)
    torch_mod.cuda.synchronize()
    start.record()
    for _ in range(k):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / k


def time_gpu_kernels(torch_mod, fn, k: int, samples: int) -> list[float]:
    """Per-launch sums of CUPTI-recorded kernel durations, one profiler session for all samples.

    The kernels of each sample's k launches are consecutive in start time, so the sorted kernel
    list splits into `samples` equal chunks.
    """
    from torch.profiler import ProfilerActivity, profile
    torch_mod.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(samples):
            for _ in range(k):
                fn()
            torch_mod.cuda.synchronize()
    kernels = sorted((ev.time_range.start, ev.time_range.elapsed_us()) for ev in prof.events()
                     if str(getattr(ev, "device_type", "")).endswith("CUDA"))
    if not kernels or len(kernels) % (samples * k):
        raise RuntimeError(f"{len(kernels)} kernel records for {samples} x {k} launches")
    per = len(kernels) // samples
    return [sum(d for _, d in kernels[i * per:(i + 1) * per]) / k for i in range(samples)]


# ----------------------------------------------------------------------------- main

def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", default=[], help="OP:ROWSxCOLS:DTYPE (repeatable)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=policy or NAME=<plan JSON>")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--warmup-ms", type=float, default=200.0)
    ap.add_argument("--target-ms", type=float, default=30.0)
    ap.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--no-torch", action="store_true", help="leave out the torch eager baseline")
    ap.add_argument("--allow-busy-gpu", action="store_true", help="run (marked) while other processes use the GPU")
    ap.add_argument("--expect-sources", type=Path, action="append", default=[],
                    help="folder of frozen sources; every kernel must reproduce one of them (repeatable)")
    ap.add_argument("--save-outputs", action="store_true", help="also save raw outputs (never commit them)")
    ap.add_argument("--out", type=Path, required=True, help="folder for run.json and sources/")
    args = ap.parse_args(argv)
    if not args.case or not args.variant:
        ap.error("give at least one --case and one --variant")
    if args.rounds < 1 or args.samples < 1:
        ap.error("--rounds and --samples must be >= 1")

    cases = [parse_case(c) for c in args.case]
    variants = [parse_variant(v) for v in args.variant]
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        ap.error(f"variant names must be unique, got {names}")

    # Fresh JIT: no disk cache at all, and every in-memory cache cleared at each round start.
    os.environ["TILE_DISABLE_DISK_CACHE"] = "1"
    import tile  # noqa: E402  (after the environment is set)

    try:
        import torch
    except ImportError:
        torch = None
    backend = args.backend
    if backend == "auto":
        backend = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if backend == "cuda" and (torch is None or not torch.cuda.is_available()):
        raise SystemExit("repeat.py: --backend cuda needs torch with a CUDA device")
    use_torch = backend == "cuda" and not args.no_torch
    if use_torch:
        variants.append({"name": "torch_eager", "kind": "torch_eager", "plan": None})
    orders = abba_orders([v["name"] for v in variants], args.rounds)

    gpu_before = gpu_state() if backend == "cuda" else None
    marked = None
    if gpu_before and gpu_before["processes"]:
        msg = f"other processes use the GPU: {gpu_before['processes']}"
        if not args.allow_busy_gpu:
            raise SystemExit(f"repeat.py: refusing to start: {msg} (--allow-busy-gpu runs anyway, marked)")
        marked = msg

    out_dir = args.out
    (out_dir / "sources").mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parent.parent
    created = dt.datetime.now(dt.timezone.utc).isoformat()
    load_before = list(os.getloadavg())
    by_name = {v["name"]: v for v in variants}
    artifacts: dict = {v["name"]: {c["id"]: [] for c in cases} for v in variants if v["kind"] == "native"}
    records = []
    total = args.rounds * len(cases) * len(variants)
    done = 0
    t_start = time.perf_counter()

    for rnd in range(args.rounds):
        tile.clear_kernel_caches()
        for case in cases:
            seed = int.from_bytes(hashlib.sha256(f"{case['id']}/{rnd}".encode()).digest()[:8], "little")
            work = Workload(case, backend, seed=seed, torch_mod=torch)  # fresh inputs each round
            ref = oracle(case, work.host(work.x), work.host(work.w), work.host(work.b))
            for position, name in enumerate(orders[rnd]):
                variant = by_name[name]
                done += 1
                eta = (time.perf_counter() - t_start) / done * (total - done)
                log(f"[{done}/{total}] round {rnd} {case['id']} {name} (eta {eta:.0f} s)")
                work.poison_out()
                if variant["kind"] == "native":
                    plan = None if variant["plan"] == "policy" else variant["plan"]
                    fn = work.native_call(tile, plan)
                    kwargs = {"weight": work.w if work.has_weight else None,
                              "bias": work.b if work.has_bias else None,
                              "eps": EPS.get(case["op"]), "out": work.out, "plan": plan}
                    rec = tile.run(case["op"], work.x, **kwargs)  # first call: lowers and compiles
                    work.sync()
                    if rec.get("cache_origin") not in ("compiled", None) and backend == "cuda":
                        raise SystemExit(f"repeat.py: round {rnd} {name}: kernel came from '{rec['cache_origin']}', "
                                         "not a fresh compile")
                    # Provenance: the CUDA backend ran the generated source, the CPU backend the IR.
                    what = "source" if backend == "cuda" else "ir"
                    text = getattr(tile, what)(case["op"], work.x, weight=kwargs["weight"], bias=kwargs["bias"],
                                               out=work.out, plan=plan)
                    src_sha = hashlib.sha256(text.encode()).hexdigest()
                    if src_sha != rec[what + "_sha256"]:
                        raise SystemExit(f"repeat.py: {name}: {what} hash differs from the launched one")
                    (out_dir / "sources" / f"{src_sha}.cu").write_text(text)
                    if args.expect_sources and not any((d / f"{src_sha}.cu").exists() for d in args.expect_sources):
                        raise SystemExit(f"repeat.py: {name} {case['id']}: source {src_sha} is not among the "
                                         f"frozen sources in {[str(d) for d in args.expect_sources]}")
                    artifacts[name][case["id"]].append({
                        "round": rnd, "plan": rec["plan"], "kernel_name": rec["kernel_name"],
                        "source_sha256": src_sha, "cubin_sha256": rec.get("cubin_sha256") or None,
                        "compile_options": rec.get("compile_options", []), "compile_ms": rec.get("compile_ms", 0.0),
                        "source_file": f"sources/{src_sha}.cu"})
                    got = work.out
                else:
                    fn = work.torch_call()
                    got = fn()
                    work.sync()
                    if got is None:
                        got = work.out
                check = check_output(case, work.host(got), ref)
                check["output_sha256"] = hashlib.sha256(work.output_bytes(got)).hexdigest()
                if args.save_outputs:
                    np.save(out_dir / f"output-{case['id']}-{name}-r{rnd}.npy", work.host(got))
                if not check["passed"]:
                    raise SystemExit(f"repeat.py: {name} {case['id']} round {rnd} FAILED the float64 oracle: "
                                     f"{check['mismatches']} mismatches, max abs error {check['max_abs_error']:.3g}")

                k = calibrate(fn, work.sync, args.warmup_ms, args.target_ms)
                fam = {}
                fam["throughput"] = family_stats([time_throughput(fn, work.sync, k) for _ in range(args.samples)], k)
                # Latency samples are sized to the target too, from the synchronized call time.
                k_lat = max(1, int(args.target_ms * 1e3 / max(time_latency(fn, work.sync, 20), 0.1)))
                fam["latency"] = family_stats([time_latency(fn, work.sync, k_lat) for _ in range(args.samples)], k_lat)
                if backend == "cuda":
                    k_gpu = max(1, min(k, 100))
                    try:
                        fam["gpu_time"] = family_stats(time_gpu_kernels(torch, fn, k_gpu, args.samples), k_gpu)
                    except Exception as e:  # profiler unavailable: say so, never substitute another family
                        fam["gpu_time"] = {"unavailable": f"torch.profiler: {e}"}
                    fam["stream_time"] = family_stats([time_stream(torch, fn, k) for _ in range(args.samples)], k)
                else:
                    fam["gpu_time"] = {"unavailable": "CPU backend"}
                    fam["stream_time"] = {"unavailable": "CPU backend"}
                records.append({"case": case["id"], "variant": name, "round": rnd, "position": position,
                                "oracle": check, "families": fam})

    summary = []
    for case in cases:
        for v in variants:
            for family in FAMILIES:
                meds = [r["families"][family]["median"] for r in records
                        if r["case"] == case["id"] and r["variant"] == v["name"]
                        and "median" in (r["families"].get(family) or {})]
                if meds:
                    summary.append({"case": case["id"], "variant": v["name"], "family": family,
                                    "median": median(meds), "round_min": min(meds), "round_max": max(meds)})

    lib = library_path()
    gpu_after = gpu_state() if backend == "cuda" else None
    built_with_cuda = tile.build_info().get("cuda", True)  # False: TILE_WITH_CUDA=OFF, no NVRTC
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "torch": torch.__version__ if torch is not None else None,
                "nvrtc": tile.nvrtc_version() if built_with_cuda else None,
                "cuda_driver": gpu_before["driver"] if gpu_before else None,
                "tile": tile.build_info().get("version", "unknown")}
    gpu = None
    if gpu_before:
        info = tile.device_info()
        gpu = {"name": gpu_before["name"], "uuid": gpu_before["uuid"], "sm_count": info.get("sm_count"),
               "driver": gpu_before["driver"], "clocks_before": gpu_before["clocks"],
               "clocks_after": gpu_after["clocks"] if gpu_after else None,
               "throttle_reasons_before": gpu_before["throttle"],
               "throttle_reasons_after": gpu_after["throttle"] if gpu_after else None,
               "other_processes_before": gpu_before["processes"],
               "other_processes_after": gpu_after["processes"] if gpu_after else None}
        if gpu_after and gpu_after["processes"] and not marked:
            marked = f"other processes used the GPU by the end: {gpu_after['processes']}"
    doc = {
        "schema": SCHEMA, "created": created, "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "provenance": {
            "backend": backend, "command": [sys.executable] + sys.argv,
            "host": {"hostname": platform.node(), "cpu_count": os.cpu_count(), "load_before": load_before,
                     "load_after": list(os.getloadavg())},
            "gpu": gpu, "versions": versions,
            "library": {"path": lib, "sha256": sha256_file(lib) if lib else None},
            "git": git_state(repo), "refused_or_marked": marked},
        "config": {"cases": cases, "variants": variants, "rounds": args.rounds, "samples": args.samples,
                   "warmup_ms": args.warmup_ms, "target_sample_ms": args.target_ms, "families": FAMILIES,
                   "order": orders},
        "artifacts": artifacts, "records": records, "summary": summary}
    path = out_dir / "run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)  # never leave a half-written run behind

    log(f"\nwrote {path} ({len(records)} records); medians in microseconds per launch:")
    log(f"{'case':<28} {'variant':<14} " + " ".join(f"{f:>12}" for f in FAMILIES))
    for case in cases:
        for v in variants:
            row = {s["family"]: s["median"] for s in summary if s["case"] == case["id"] and s["variant"] == v["name"]}
            log(f"{case['id']:<28} {v['name']:<14} " +
                " ".join(f"{row[f]:>12.2f}" if f in row else f"{'-':>12}" for f in FAMILIES))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
