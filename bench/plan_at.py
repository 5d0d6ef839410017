#!/usr/bin/env python3
"""The whole mapping plan the policy resolves for one forward call, as JSON on one line.

    bench/plan_at.py OP ROWSxCOLS DTYPE [PLAN_JSON]

Used by bench/cubin_time.sh where a kernel is checked on fewer rows than it is timed at: the
plan depends on the row count (one wave of groups asks for one resident group), so it is
resolved at the timed shape and then fixed whole for the check. Needs the built module on
PYTHONPATH and numpy; bf16 is planned as float16 (the policy looks at element bytes, not at the
format). No buffer is touched: the operands are allocated, never filled.
"""
import json
import sys

import numpy as np
import tile


def main() -> int:
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    op, shape, dtype = sys.argv[1:4]
    request = json.loads(sys.argv[4]) if len(sys.argv) == 5 and sys.argv[4] else None
    rows, cols = (int(v) for v in shape.split("x"))
    np_dtype = {"f32": np.float32, "bf16": np.float16}.get(dtype)
    if np_dtype is None:
        print(f"plan_at.py: dtype: expected f32 or bf16, got {dtype}", file=sys.stderr)
        return 2
    x = np.empty((rows, cols), np_dtype)
    operands = {"x": x}
    if op in ("rms_norm", "layer_norm"):
        operands["weight"] = np.empty(cols, np_dtype)
    if op == "layer_norm":
        operands["bias"] = np.empty(cols, np_dtype)
    plan = tile.builtin(op).plan(**operands, plan=request) if request else tile.builtin(op).plan(**operands)
    print(json.dumps(plan, separators=(",", ":"), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
