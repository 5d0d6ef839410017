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
    sys.exit(f"edit_fast_path.py: MODE: expected no-test, empty-exact, stores-first, reload-exact, "
             f"hoist-columns or outline-exact, got {mode}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: edit_fast_path.py MODE IN.cu OUT.cu")
    mode, src, dst = sys.argv[1:]
    text = open(src).read()
    if FAST not in text:
        sys.exit(f"edit_fast_path.py: {src}: no program fast path (a re-read plan, or a program without one)")
    open(dst, "w").write(edit(mode, text))
