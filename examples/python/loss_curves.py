"""The moving average that llama_train.py checks the loss curves with and plot_llama.py draws:
one definition, so the plot shows what the check compared. No torch needed."""


def moving_average(values, window):
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
