#!/usr/bin/env python3
"""Hand variants of a generated kernel's output pass, for timing only.

    bench/variants/edit_output_pass.py MODE IN.cu OUT.cu

IN.cu is a kernel prepared by `bench/cubin_time.sh prepare` whose output pass loads the
per-column inputs (a norm's weight and bias) in chunks, each just before the outputs that use
it (a cluster plan's output pass: `load weight` blocks, then the stores of those slots). The
variant answers whether those loads wait on L2 in turn; it computes the same values, so the
output checksums printed by bench/cubin_time.cu must match IN's:

  columns-ahead   each chunk's column loads issued one chunk earlier: chunk k + 1's loads go out
                  before chunk k's outputs, so a chunk's L2 latency overlaps the previous
                  chunk's arithmetic and stores (one more chunk of registers live)

Then compile OUT.cu with nvcc (-cubin) and add a line for it to the variants' list.txt, as
`bench/cubin_time.sh prepare` does for generated kernels.
"""
import sys

MARK = "  // output pass"


def top_level_items(lines):
    """Splits lines into top-level items: a block `  {  // ...` to its closing `  }`, or one line."""
    items, i = [], 0
    while i < len(lines):
        if lines[i].startswith("  {"):
            j = i
            while lines[j] != "  }":
                j += 1
            items.append(lines[i : j + 1])
            i = j + 1
        else:
            items.append([lines[i]])
            i += 1
    return items


def is_column_load(item):
    return item[0].startswith("  {  // load weight") or item[0].startswith("  {  // load bias")


def columns_ahead(src):
    lines = src.split("\n")
    if lines.count(MARK) != 1:
        sys.exit("edit_output_pass.py: expected one output pass")
    start = lines.index(MARK) + 1
    end = len(lines) - 1
    while lines[end] != "}":  # the kernel's closing brace
        end -= 1
    items = top_level_items(lines[start:end])
    # chunks[k]: a run of column loads; work[k]: what follows it up to the next run.
    chunks, work = [], []
    for item in items:
        if is_column_load(item):
            if not chunks or work[-1]:
                chunks.append([])
                work.append([])
            chunks[-1].append(item)
        elif chunks:
            work[-1].append(item)
        else:
            sys.exit("edit_output_pass.py: the output pass does not start with column loads")
    if len(chunks) < 2:
        sys.exit("edit_output_pass.py: fewer than two chunks of column loads: nothing to move")
    order = chunks[0]
    for k in range(len(chunks)):
        if k + 1 < len(chunks):
            order += chunks[k + 1]
        order += work[k]
    out = lines[:start] + [line for item in order for line in item] + lines[end:]
    return "\n".join(out), len(chunks)


def main():
    if len(sys.argv) != 4 or sys.argv[1] != "columns-ahead":
        sys.exit(__doc__)
    text, chunks = columns_ahead(open(sys.argv[2]).read())
    open(sys.argv[3], "w").write(text)
    print(f"{sys.argv[3]}: {chunks} chunks of column loads, each issued one chunk ahead")


if __name__ == "__main__":
    main()
