#!/usr/bin/env python3
"""Hand variants of a generated norm kernel's program fast path, for timing only.

    bench/variants/edit_fast_path.py MODE IN.cu OUT.cu

IN.cu is a kernel prepared by `bench/cubin_time.sh prepare` (the generated source of a
register-cached plan whose last level takes the program fast path: `if (exact) {fast rest}
else {exact path}`). The variants answer where that structure costs time; they are not
correct for every input (the first two drop the exact path) and are timed, never shipped:

  no-test        `if (true)`: no exactness test and no exact path (an upper bound)
  empty-exact    the test kept, the exact path emptied
  stores-first   the fast rest unconditionally, then `if (!exact) {exact path}` rewriting it
  reload-exact   stores-first, the exact path loading the row again instead of keeping it
  hoist-columns  the fast rest's weight and bias loads moved before the test
  outline-exact  the exact path in a function of its own (__noinline__), arguments by value
  rerun-exact    the exact path a __noinline__ copy of the whole kernel body whose test is forced
                 to fail: it takes only the kernel's parameters and loads the row again, so no
                 cached value is live into it
  two-pass-test  (FIXED.cu POLICY.cu OUT.cu) the fixed-shape kernel's two-pass statistics (sum of
                 x, then of (x - mean)^2 from the cache), a range test on mean and the squared
                 deviations before its output pass, and POLICY.cu's rerun-exact path where it fails
  two-pass-inline  the program fast path's one-pass sums replaced by the two passes and the range
                 test of two-pass-test, the generated exact path kept inline
  reciprocal-count (COLS IN.cu OUT.cu) the fast path's divisions by the row's count and by cols made
                 multiplications by 1/COLS, held in a value the compiler cannot fold (a kernel
                 parameter's stand-in): what a reciprocal passed at launch would save
  two-pass-retry two-pass-inline whose exact path is the same two passes retried once with x
                 scaled by a power of two from the row's largest |x| (not the library's exact path:
                 its shape and size only, for a register-cached program of 16-bit x)

Then compile OUT.cu with nvcc (-cubin) and add a line for it to the variants' list.txt, as
`bench/cubin_time.sh prepare` does for generated kernels.
"""
import re
import sys

FAST = "// every program read passed its test"
EXACT = "// the fast path is not exact enough here"


def block_end(s, start):
    """Index just past the brace that closes the block whose body starts at `start`."""
    depth, p = 1, start
    while depth:
        depth += (s[p] == "{") - (s[p] == "}")
        p += 1
    return p


def split(s):
    """(if start, condition, fast body, exact body start, exact body end) of the fast path."""
    i = s.index(FAST)
    j = s.rindex("if (", 0, i)
    cond = s[j + 4:s.index(") {", j)]
    fast_end = s.rindex("} else {", 0, s.index(EXACT, i))
    e = fast_end + len("} else {")
    return j, cond, s[i:fast_end], e, block_end(s, e)


def column_loads(body):
    """The weight and bias load blocks of a fast rest, and the rest without them."""
    loads, rest, p = [], "", 0
    while (m := re.search(r"\{  // load (weight|bias)[^\n]*\n", body[p:])):
        a = p + m.start()
        q = block_end(body, a + 1)
        loads.append(body[a:q])
        rest += body[p:a]
        p = q
    return loads, rest + body[p:]


def outline(s, e, p):
    """The exact path [e, p) as a __noinline__ function of the values it reads."""
    g = s.index('extern "C" __global__')
    kern = s[g:]
    sig = kern[:kern.index(") {") + 3]
    params = [re.sub(r"/\*.*?\*/", "", x).strip() for x in sig[sig.index("(", sig.index("tile_")) + 1:-3].split(",")]
    names = [re.match(r".*?(\w+)$", x).group(1) for x in params]
    decls = {}
    for m in re.finditer(r"^\s+(?:const )?(float|bool|long long|int|double) (\w+)(?: = [^;]*)?;", kern, re.M):
        if m.group(2) not in ("tile_i", "tile_n"):  # block-scoped in every access
            decls.setdefault(m.group(2), m.group(1))
    body = s[e:p - 1]
    used = set(re.findall(r"\b[A-Za-z_]\w*\b", body))
    before = s[g:e]
    passed = [n for n in decls if n in used and re.search(r"\b" + n + r"\s*=", before)]
    inner = [n for n in decls if n in used and n not in passed]
    fparams, args = list(params), list(names)
    shared = re.search(r"__shared__ float (\w+)\[\d+\];", kern)
    if shared and shared.group(1) in used:
        fparams.append("float* " + shared.group(1))
        args.append(shared.group(1))
    fparams += [f"{decls[n]} {n}" for n in passed]
    args += passed
    fn = ("static __device__ __noinline__ void tile_exact_path(" + ", ".join(fparams) + ") {\n" +
          "".join(f"  {decls[n]} {n};\n" for n in inner) + body + "}\n\n")
    return s[:g] + fn + s[g:e] + "\n    tile_exact_path(" + ", ".join(args) + ");\n  }" + s[p:]


def kernel_parts(s):
    """(helpers before the kernel, signature up to its opening brace, body, parameter names)."""
    g = s.index('extern "C" __global__')
    b = s.index(") {", g) + 3
    sig = s[g:b]
    params = [re.sub(r"/\*.*?\*/", "", x).strip() for x in sig[sig.index("(", sig.index("tile_")) + 1:-3].split(",")]
    names = [re.match(r".*?(\w+)$", x).group(1) for x in params]
    return s[:g], sig, s[b:block_end(s, b) - 1], params, names


def rerun_function(s):
    """The kernel body as a __noinline__ function whose program fast path test always fails."""
    _, _, body, params, _ = kernel_parts(s)
    j, cond, _, _, _ = split(body)
    body = body[:j] + "if (false" + body[body.index(") {", j):]
    return "static __device__ __noinline__ void tile_exact_rerun(" + ", ".join(params) + ") {" + body + "}\n\n"


def rerun(s):
    head, sig, body, params, names = kernel_parts(s)
    j, cond, fast, e, p = split(body)
    call = "\n    tile_exact_rerun(" + ", ".join(names) + ");\n  }"
    return head + rerun_function(s) + sig + body[:e] + call + body[p:] + "}\n"


def two_pass(fixed, policy):
    head, sig, body, params, names = kernel_parts(fixed)
    means = re.findall(r"(s\d+) = \((acc\d+|total\d+) / s\d+\);", body)
    (mean, _), (_, dev) = means[0], means[1]
    test = (f"  if (!(({dev} < 0x1p+60f) && (fabsf({mean}) < 0x1p+30f) && "
            f"((0x1p-60f <= {dev}) || (0x1p-30f <= fabsf({mean}))))) {{\n"
            f"    tile_exact_rerun({', '.join(names)});\n    return;\n  }}\n  ")
    o = body.index("// output pass")
    return kernel_parts(policy)[0] + rerun_function(policy) + sig + body[:o] + test + body[o:] + "}\n"


def cached_program(s):
    """(x names per stripe, live flags, warps a program, mean, m2, test, block start, block end)."""
    a = s.index("// load the row slices once into cached registers")
    z = s.index("// reductions over the row", a)
    xs, lives = [], re.findall(r"(live\d+) = \(col\d+ < store_cols2\);", s[a:z])
    for blk in re.split(r"// load x, \d+ elements", s[a:z])[1:]:
        xs.append(re.findall(r"(x\d+) = tile_\w+_to_f32\(", blk.split("} else {")[0]))
    warps = max(1, int(re.search(r"worker_in_program = tile_tid % (\d+);", s).group(1)) // 32)
    b = s.index("// program fast path: plain sums", z)
    m = re.search(r"\n  if \((e\d+)\) \{\n    // every program read passed", s[b:])
    e = b + m.start()
    after = s[e:]
    mean = re.search(r"= \(" + xs[0][0] + r" - (e\d+)\);", after).group(1)
    m2 = re.search(r"s\d+ = \((e\d+) / s\d+\);", after).group(1)
    return xs, lives, warps, mean, m2, m.group(1), b, e


def two_pass_block(s, retry):
    xs, lives, warps, mean, m2, test, b, e = cached_program(s)
    def tree(t):
        while len(t) > 1:
            t = [f"({t[i]} + {t[i + 1]})" if i + 1 < len(t) else t[i] for i in range(0, len(t), 2)]
        return t[0]
    def merge(v, base, op="+"):
        f = (lambda p, q: f"({p} + {q})") if op == "+" else (lambda p, q: f"fmaxf({p}, {q})")
        out = [f"    for (int o = 16; o; o >>= 1) {v} = " + f(v, f"__shfl_xor_sync(0xffffffffu, {v}, o, 32)") + ";"]
        if warps > 1:
            out += [f"    if (lane == 0) tile_shared[{base} + warp_in_program] = {v};", "    __syncthreads();",
                    f"    {{ float tp_t[{warps}]; for (int w = 0; w < {warps}; ++w) tp_t[w] = tile_shared[{base} + w];",
                    f"      for (int st = {warps // 2}; st; st >>= 1) for (int w = 0; w < st; ++w) tp_t[w] = "
                    + f("tp_t[w]", "tp_t[w + st]") + ";", f"      {v} = tp_t[0]; }}"]
        return out
    sc = (lambda v: f"fmaf({v}, tp_a, -tp_k)") if retry else (lambda v: v)
    dv = lambda v: f"fmaf({v}, tp_a, -tp_mean)"
    L = ["// two-pass statistics from the cache (a timing variant)",
         "{ float tp_n = (float)store_cols2; float tp_a = 1.0f, tp_k = 0.0f, tp_mean, tp_d; bool tp_ok;"]
    if retry:
        L.append("  for (int tp_att = 0; ; ++tp_att) {")
    L.append("    float tp_s = 0.0f;")
    for x, live in zip(xs, lives):
        L.append(f"    tp_s += ({live} ? " + tree([sc(v) for v in x]) + " : 0.0f);")
    L += merge("tp_s", 0)
    L.append("    tp_mean = " + ("tp_k + " if retry else "") + "tp_s / fmaxf(tp_n, 1.0f); tp_d = 0.0f;")
    for x, live in zip(xs, lives):
        if retry:
            L.append("    { float " + ", ".join(f"d{i} = {dv(v)}" for i, v in enumerate(x)) + ";")
            L.append(f"      tp_d += ({live} ? " + tree([f"d{i} * d{i}" for i in range(len(x))]) + " : 0.0f); }")
        else:
            L.append(f"    tp_d += ({live} ? " + tree([f"(({v} - tp_mean) * ({v} - tp_mean))" for v in x]) + " : 0.0f);")
    L += merge("tp_d", 16)
    range_test = ("(tp_n == 0.0f) || ((tp_d < 0x1p+60f) && (fabsf(tp_mean) < 0x1p+30f) && "
                  "((0x1p-60f <= tp_d) || (0x1p-30f <= fabsf(tp_mean)))")
    if retry:
        L.append(f"    tp_ok = {range_test} && (tp_s * tp_s <= 0x1p+20f * tp_n * tp_d));")
        L += ["    if (tp_ok || tp_att == 1) break;", "    float tp_m = 0.0f;"]
        for x, live in zip(xs, lives):
            L.append(f"    tp_m = fmaxf(tp_m, ({live} ? " + "fmaxf(" * (len(x) - 1) + f"fabsf({x[0]})" +
                     "".join(f", fabsf({v}))" for v in x[1:]) + " : 0.0f));")
        L += merge("tp_m", 32, "max")
        L += ["    tp_a = ldexpf(1.0f, -min(max(ilogbf(tp_m), -103), 125));",
              "    tp_k = (tp_mean == tp_mean && fabsf(tp_mean) < 3e38f) ? tp_mean * tp_a : 0.0f;", "  }",
              f"  {mean} = tp_mean; {m2} = tp_d; {test} = true; (void)tp_ok;", "}"]
    else:
        L += [f"  {mean} = tp_mean; {m2} = tp_d; {test} = {range_test});", "  (void)tp_a; (void)tp_k; (void)tp_ok;", "}"]
    out = s[:b] + "\n  ".join(L) + s[e:]
    if retry:  # the retry stands for the exact path
        j, cond, fast, e2, p2 = split(out)
        out = out[:e2] + "\n  }" + out[p2:]
    return out


def reciprocal_count(s, cols):
    import struct
    bits = struct.unpack("<I", struct.pack("<f", 1.0 / cols))[0]
    j, cond, fast, e, p = split(s)
    g = s.index('extern "C" __global__')
    b = s.index(") {", g) + 3
    counts = re.findall(r"(k\d+) = \(\(float\)store_cols2\);", s[b:e])
    divisors = [m for k in counts for m in re.findall(r"(e\d+) = tile_max\(" + k + r", 0x1p\+0f\);", s[b:e])]
    divisors += re.findall(r"(s\d+) = \(\(float\)cols\);", s[b:e])
    region = s[b:e]
    for d in divisors:
        region = re.sub(r" / " + d + r"\)", " * tile_inv_n)", region)
    head = (f"\n  const float tile_inv_n = __int_as_float(0x{bits:08x} ^ (int)(rows >> 62));  // 1/{cols}, opaque")
    return s[:b] + head + region + s[e:]


def edit(mode, s):
    j, cond, fast, e, p = split(s)
    if mode == "no-test":
        return s[:j] + "if (true" + s[s.index(") {", j):]
    if mode == "empty-exact":
        return s[:e] + "\n  }" + s[p:]
    if mode in ("stores-first", "reload-exact"):
        reload = ""
        if mode == "reload-exact":
            a = s.index("// load the row slices once into cached registers")
            reload = s[a:s.index("// reductions over the row", a)]
        return s[:j] + fast + "\n  if (!(" + cond + ")) {\n  " + reload + s[e:p - 1] + "}" + s[p:]
    if mode == "hoist-columns":
        loads, rest = column_loads(fast)
        return s[:j] + "\n".join(loads) + "\n  " + s[j:s.index(FAST)] + rest + s[s.index(FAST) + len(fast):]
    if mode == "outline-exact":
        return outline(s, e, p)
    if mode == "rerun-exact":
        return rerun(s)
    if mode in ("two-pass-inline", "two-pass-retry"):
        return two_pass_block(s, mode == "two-pass-retry")
    sys.exit(f"edit_fast_path.py: MODE: expected no-test, empty-exact, stores-first, reload-exact, "
             f"hoist-columns, outline-exact, rerun-exact, two-pass-test, two-pass-inline or two-pass-retry, "
             f"got {mode}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "reciprocal-count":
        _, cols, src, dst = sys.argv[1:]
        open(dst, "w").write(reciprocal_count(open(src).read(), int(cols)))
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "two-pass-test":
        _, fixed, policy, dst = sys.argv[1:]
        open(dst, "w").write(two_pass(open(fixed).read(), open(policy).read()))
        sys.exit(0)
    if len(sys.argv) != 4:
        sys.exit("usage: edit_fast_path.py MODE IN.cu OUT.cu (two-pass-test FIXED.cu POLICY.cu OUT.cu)")
    mode, src, dst = sys.argv[1:]
    text = open(src).read()
    if FAST not in text:
        sys.exit(f"edit_fast_path.py: {src}: no program fast path (a re-read plan, or a program without one)")
    open(dst, "w").write(edit(mode, text))
