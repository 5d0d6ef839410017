"""Plots the results of llama_train.py (and optionally llama_decode.py): the loss curves of the
eager and Tile runs with their moving averages, their relative difference against the
tolerance, and a table of tokens/s, peak memory and decode latency. Needs matplotlib (the
docs environment, .venv, has it); reads only the JSON files, so it runs on any machine.

    python examples/python/plot_llama.py llama_train.json [--decode llama_decode.json] --out llama.png
"""
import argparse
import json
import sys

from loss_curves import moving_average  # beside this script


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("train", help="the JSON llama_train.py --out wrote")
    p.add_argument("--decode", help="the JSON llama_decode.py --out wrote")
    p.add_argument("--out", required=True, help="the image to write (.png or .svg)")
    args = p.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_llama: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    with open(args.train) as f:
        train = json.load(f)
    decode = None
    if args.decode:
        with open(args.decode) as f:
            decode = json.load(f)
    runs = train["runs"]
    window = train["args"]["window"]
    env = train["environment"]
    fig, (ax_loss, ax_diff, ax_table) = plt.subplots(1, 3, figsize=(16, 4.8),
                                                     gridspec_kw={"width_ratios": [1.2, 1, 0.9]})
    for name, style in (("eager", "C0"), ("tile", "C3")):
        if name not in runs:
            continue
        loss = runs[name]["loss"]
        ax_loss.plot(loss, color=style, alpha=0.25, linewidth=0.8)
        ax_loss.plot(moving_average(loss, window), color=style, label=f"{name} ({window}-step mean)")
    ax_loss.axhline(train["entropy_floor"], color="gray", linestyle=":", label="the data's entropy floor")
    ax_loss.set(xlabel="step", ylabel="loss (nats)", yscale="log",
                title=f"{env.get('gpu', env['device'])}, {env['world_size']} process(es), {train['args']['dtype']}")
    ax_loss.legend()
    cmp = train["checks"].get("loss_curves")
    if cmp:
        e, t = moving_average(runs["eager"]["loss"], window), moving_average(runs["tile"]["loss"], window)
        rel = [abs(a - b) / abs(a) for a, b in zip(e, t)]
        ax_diff.plot(range(window - 1, len(rel)), rel[window - 1:], color="C2")
        ax_diff.axhline(cmp["curve_tolerance"], color="C3", linestyle="--", label="tolerance")
        ax_diff.set(xlabel="step", ylabel="relative difference", yscale="log",
                    title=f"|mean_tile - mean_eager| / mean_eager ({window} steps)")
        ax_diff.legend()
    rows = []
    for name in ("eager", "tile"):
        if name in runs:
            mem = runs[name]["peak_memory_bytes"]
            rows.append([name, f"{runs[name]['tokens_per_s']:,.0f}", f"{mem / 2**30:.2f}" if mem else "-"])
    table = ax_table.table(cellText=rows, colLabels=["run", "tokens/s", "peak GiB"], loc="upper center")
    table.scale(1, 1.6)
    if decode:
        drows = [[name, f"{run['ms_per_token']:.3f}"] for name, run in decode["runs"].items() if "ms_per_token" in run]
        dtable = ax_table.table(cellText=drows, colLabels=["decode", "ms/token"], loc="lower center")
        dtable.scale(1, 1.6)
    ax_table.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
