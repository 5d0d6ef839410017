"""Trains a small Llama-style model twice from one seed — transformers' own modules ("eager")
and the same model with Tile's RMSNorm and cross-entropy patched in ("tile") — and checks that
the loss curves agree. Also runs under torchrun (DDP or FSDP2), where it first compares the
gradients of the distributed run with a single-process run on the same global batch.

The model is built from a transformers LlamaConfig (nothing is downloaded) and trained in
bfloat16 (parameters, activations and AdamW state) on synthetic data from a fixed seed: a
noisy successor chain over the vocabulary (each token is followed by succ[token], a fixed
random permutation, with probability 0.9, else by a uniform random token), so the loss falls
from log(vocab) towards the chain's entropy, which the script reports as the floor.

    python examples/python/llama_train.py --out llama_train.json            # one GPU, ~60-90 s on an H200
    python examples/python/llama_train.py --tiny --device cpu               # CPU smoke run, < 1 min
    torchrun --nproc_per_node=2 examples/python/llama_train.py --out llama_ddp.json
    torchrun --nproc_per_node=2 examples/python/llama_train.py --fsdp --steps 50 --out llama_fsdp.json

Both runs record per step the loss and the step time (CUDA-synchronised), and per run the
tokens per second after --timing-warmup steps and the peak memory
(torch.cuda.max_memory_allocated). Exits 1 when the curves disagree beyond the tolerance (see
compare_curves), when the loss does not fall, or when the gradients of a distributed run
differ from the single-process run's beyond theirs (see check_gradients).
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import torch

import tile
import tile.nn
from loss_curves import moving_average  # beside this script

# The model sizes: "full" trains a few hundred steps in about a minute on one H200; "tiny" is
# the CPU smoke run of CTest.
CONFIGS = {
    "full": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
}
DEFAULTS = {"full": dict(steps=300, batch=8, seq=1024, window=20, timing_warmup=10),
            "tiny": dict(steps=30, batch=8, seq=64, window=5, timing_warmup=3)}
FOLLOW = 0.9   # probability that a token is followed by its successor


# ---- tolerances ----
# Two bf16 runs from the same weights and batches start equal up to rounding (Tile's RMSNorm
# reduces in another order than torch's, so a normalised value may round to the neighbouring
# bf16 number) and then drift apart slowly, as any two bf16 runs with different reduction
# orders do; each step's loss also carries the batch's noise, common to both runs. So: the
# first step's losses (same weights, same batch) within FIRST_STEP_ABS; the moving averages
# of WINDOW steps within CURVE_REL of each other at every step; the mean of the last WINDOW
# steps within FINAL_REL.
FIRST_STEP_ABS = 0.02
CURVE_REL = 0.05
FINAL_REL = 0.03
# Gradients of the distributed run against one process on the whole batch, per parameter
# ||g_dist - g_single|| / ||g_single||: bf16 gradients are rounded once per GEMM and once more
# by the reduction across ranks (2^-8 relative spacing), so a few such roundings: GRAD_REL.
GRAD_REL = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tiny model and a few steps (a smoke run; CPU is fine)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda where torch sees a GPU, else cpu")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (full: 300, tiny: 30)")
    p.add_argument("--batch", type=int, default=None, help="global batch in sequences (full: 8, tiny: 8)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (full: 1024, tiny: 64)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (full: 1e-3, tiny: 3e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=None, help="moving-average window of the curve check (full: 20)")
    p.add_argument("--timing-warmup", type=int, default=None, help="steps left out of tokens/s (full: 10)")
    p.add_argument("--backends", default="eager,tile", help="runs, in order (default eager,tile; the check needs both)")
    p.add_argument("--grad-steps", type=int, default=None,
                   help="under torchrun: steps whose gradients are compared with one process (default 3; 0: none)")
    p.add_argument("--fsdp", action="store_true", help="under torchrun: FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--out", default=None, help="write the results as JSON here (rank 0)")
    args = p.parse_args(argv)
    size = "tiny" if args.tiny else "full"
    for key, value in DEFAULTS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.lr is None:
        args.lr = 3e-3 if args.tiny else 1e-3
    if args.grad_steps is None:
        args.grad_steps = 3
    args.size = size
    args.backends = [b for b in args.backends.split(",") if b]
    for b in args.backends:
        if b not in ("eager", "tile"):
            p.error(f"--backends: expected eager and/or tile, got {b!r}")
    return args


# ---- distributed setup ----

class Dist:
    """The process group under torchrun (WORLD_SIZE > 1), or one process."""

    def __init__(self, device_kind):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device_kind == "cuda":
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        else:
            self.device = torch.device("cpu")
        if self.world > 1:
            import torch.distributed as dist
            dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", device_id=(
                self.device if device_kind == "cuda" else None))
            self.dist = dist
        else:
            self.dist = None

    def mean(self, value):
        """The mean of a scalar tensor over the ranks."""
        if self.dist is None:
            return value
        value = value.detach().clone()
        self.dist.all_reduce(value)
        return value / self.world

    def barrier(self):
        if self.dist is not None:
            self.dist.barrier()

    def close(self):
        if self.dist is not None:
            self.dist.destroy_process_group()


def log(d, *what):
    if d.rank == 0:
        print(*what, flush=True)


# ---- model and data ----

def make_config(args):
    from transformers import LlamaConfig
    kw = dict(CONFIGS[args.size])
    kw["max_position_embeddings"] = max(kw["max_position_embeddings"], args.seq)
    return LlamaConfig(**kw, rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa")


def initial_state(config, seed):
    """The initial weights, from the seed, on the CPU in float32: every run starts from these."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build_model(config, state, backend, device, dtype):
    """The model with the given weights; for backend "tile" with Tile's norms and loss patched in
    (tile.nn.patch_transformers, LlamaRMSNorm's rounding order). Returns (model, patch report)."""
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM(config)        # weights from `state`; buffers (rotary) from the config
    model.load_state_dict(state)
    model = model.to(device=device, dtype=dtype)
    model.train()
    report = None
    if backend == "tile":
        report = tile.nn.patch_transformers(model, rounding="cast_then_weight")
        expected = 2 * config.num_hidden_layers + 1
        if len(report["rms_norm"]) != expected or report["loss"] != "ForCausalLM":
            raise RuntimeError(f"patch_transformers replaced {len(report['rms_norm'])} RMSNorms (expected {expected}) "
                               f"and the loss {report['loss']!r} (expected 'ForCausalLM'): {report}")
    return model, report


def successor_table(vocab, seed):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randperm(vocab, generator=g)


def make_batches(steps, batch, seq, vocab, seed):
    """steps x batch sequences of seq + 1 tokens of the noisy successor chain (int64, CPU)."""
    g = torch.Generator().manual_seed(seed + 2)
    succ = successor_table(vocab, seed)
    rows = steps * batch
    tokens = torch.empty(rows, seq + 1, dtype=torch.int64)
    tokens[:, 0] = torch.randint(0, vocab, (rows,), generator=g)
    follow = torch.rand(rows, seq, generator=g) < FOLLOW
    jump = torch.randint(0, vocab, (rows, seq), generator=g)
    for t in range(seq):
        tokens[:, t + 1] = torch.where(follow[:, t], succ[tokens[:, t]], jump[:, t])
    return tokens.view(steps, batch, seq + 1)


def entropy_floor(vocab):
    """The chain's entropy per predicted token, in nats: the lowest mean loss a model can reach."""
    p_succ = FOLLOW + (1 - FOLLOW) / vocab
    p_other = (1 - FOLLOW) / vocab
    return -(p_succ * math.log(p_succ) + (vocab - 1) * p_other * math.log(p_other))


def local_batch(tokens, d):
    """This rank's share of a global batch (the whole batch in one process)."""
    per = tokens.shape[0] // d.world
    return tokens[d.rank * per:(d.rank + 1) * per]


def wrap(model, args, d):
    if d.world == 1:
        return model
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def make_optimizer(model, args):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, min(20, args.steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    return opt, sched


def loss_of(model, tokens):
    """The mean next-token loss of a batch (transformers shifts the labels; the model's
    loss_function is Tile's after the patch)."""
    return model(input_ids=tokens, labels=tokens).loss


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- one training run ----

def train(backend, config, state, batches, args, d, dtype):
    device = d.device
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model, report = build_model(config, state, backend, device, dtype)
    model = wrap(model, args, d)
    opt, sched = make_optimizer(model, args)
    losses, step_ms = [], []
    for step in range(args.steps):
        tokens = local_batch(batches[step], d).to(device, non_blocking=True)
        sync(device)
        t0 = time.perf_counter()
        loss = loss_of(model, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(d.mean(loss.detach().float()).item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            log(d, f"  {backend:5s} step {step:4d}  loss {losses[-1]:.4f}  {step_ms[-1]:7.1f} ms")
        if not math.isfinite(losses[-1]):
            raise RuntimeError(f"{backend}: loss {losses[-1]} at step {step}")
    timed = step_ms[args.timing_warmup:] or step_ms
    tokens_per_step = args.batch * args.seq           # the global batch
    result = {
        "loss": losses,
        "step_ms": step_ms,
        "tokens_per_s": tokens_per_step * len(timed) / (sum(timed) / 1e3),
        "median_step_ms": sorted(timed)[len(timed) // 2],
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }
    if report is not None:
        result["patched"] = {"rms_norm": len(report["rms_norm"]), "loss": report["loss"],
                             "skipped": report["skipped"]}
    del model, opt
    return result


# ---- checks ----

def compare_curves(eager, tile_, window):
    """The loss-curve check (the tolerances above); returns a dict with "ok"."""
    ma_e, ma_t = moving_average(eager, window), moving_average(tile_, window)
    rel = [abs(a - b) / abs(a) for a, b in zip(ma_e[window - 1:], ma_t[window - 1:])]
    worst = max(range(len(rel)), key=rel.__getitem__) + window - 1 if rel else 0
    last_e = sum(eager[-window:]) / len(eager[-window:])
    last_t = sum(tile_[-window:]) / len(tile_[-window:])
    first = abs(eager[0] - tile_[0])
    final = abs(last_e - last_t) / abs(last_e)
    return {
        "window": window,
        "first_step_abs_diff": first, "first_step_tolerance": FIRST_STEP_ABS,
        "max_moving_average_rel_diff": max(rel) if rel else 0.0, "at_step": worst, "curve_tolerance": CURVE_REL,
        "final_mean_eager": last_e, "final_mean_tile": last_t,
        "final_rel_diff": final, "final_tolerance": FINAL_REL,
        "ok": first <= FIRST_STEP_ABS and (max(rel) if rel else 0.0) <= CURVE_REL and final <= FINAL_REL,
    }


def learned(losses, window, vocab):
    """The loss fell: the last window's mean is below the first step's by a third of the way
    to the floor."""
    last = sum(losses[-window:]) / len(losses[-window:])
    target = losses[0] - (losses[0] - entropy_floor(vocab)) / 3
    return {"first": losses[0], "last_mean": last, "required_below": target, "ok": last < target}


def _full(t):
    """A DTensor (FSDP2's sharded gradients and weights) gathered; a plain tensor as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_gradients(backend, config, state, batches, args, d, dtype):
    """The first --grad-steps steps of the distributed run (each rank on its share of the
    global batch), each step's gradients against one process's on the whole batch at the same
    weights (rank 0 holds that model). Returns per step the largest relative difference over
    the parameters, ||g_dist - g_single|| / ||g_single||."""
    device = d.device
    model, _ = build_model(config, state, backend, device, dtype)
    model = wrap(model, args, d)
    opt, sched = make_optimizer(model, args)
    single = build_model(config, state, backend, device, dtype)[0] if d.rank == 0 else None
    steps = []
    for step in range(args.grad_steps):
        tokens = batches[step].to(device)
        weights = {k: _full(v) for k, v in model.state_dict().items()}
        loss_of(model, local_batch(tokens, d)).backward()
        grads = {n: _full(p.grad) for n, p in model.named_parameters()}
        if d.rank == 0:
            single.load_state_dict({k.removeprefix("module."): v for k, v in weights.items()})
            single.zero_grad(set_to_none=True)
            loss_of(single, tokens).backward()
            ref = {n: p.grad for n, p in single.named_parameters()}
            worst, name = 0.0, None
            for n, g in grads.items():
                r = ref[n.removeprefix("module.")].float()
                diff = ((g.float() - r).norm() / r.norm().clamp_min(1e-30)).item()
                if diff > worst:
                    worst, name = diff, n
            steps.append({"step": step, "max_rel_diff": worst, "parameter": name})
            log(d, f"  {backend:5s} gradient step {step}: max relative difference {worst:.3e} ({name})")
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    d.barrier()
    del model, opt, single
    tol = GRAD_REL[dtype]
    return {"steps": steps, "tolerance": tol, "ok": all(s["max_rel_diff"] <= tol for s in steps)}


def environment(d, args):
    import transformers
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "tile_commit": tile.build_info().get("git_commit"), "device": str(d.device), "world_size": d.world,
           "parallel": ("fsdp2" if args.fsdp else "ddp") if d.world > 1 else None}
    if d.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(d.device)
    return env


def main(argv=None):
    args = parse_args(argv)
    device_kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_kind == "cuda" and not torch.cuda.is_available():
        print("llama_train: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    d = Dist(device_kind)
    if args.batch % d.world:
        log(d, f"llama_train: --batch {args.batch} is not divisible by the {d.world} ranks")
        return 2
    dtype = getattr(torch, args.dtype)
    config = make_config(args)
    state = initial_state(config, args.seed)
    batches = make_batches(args.steps, args.batch, args.seq, config.vocab_size, args.seed)
    floor = entropy_floor(config.vocab_size)
    log(d, f"llama_train: {args.size} model ({sum(v.numel() for v in state.values()) / 1e6:.1f}M parameters), "
           f"{args.dtype}, batch {args.batch} x {args.seq} tokens, {args.steps} steps, {d.world} process(es) on "
           f"{d.device.type}; the data's entropy floor is {floor:.3f} nats")
    results = {"args": {k: v for k, v in vars(args).items()}, "environment": environment(d, args),
               "config": CONFIGS[args.size], "entropy_floor": floor, "runs": {}, "checks": {}}
    ok = True
    if d.world > 1 and args.grad_steps > 0:
        grads = {}
        for backend in args.backends:
            grads[backend] = check_gradients(backend, config, state, batches, args, d, dtype)
        results["checks"]["gradients"] = grads
        if d.rank == 0 and "tile" in grads and not grads["tile"]["ok"]:
            log(d, f"llama_train: FAIL: the gradients of the {d.world}-process tile run differ from one process's by "
                   f"more than {grads['tile']['tolerance']}")
            ok = False
    for backend in args.backends:
        log(d, f"{backend}:")
        results["runs"][backend] = train(backend, config, state, batches, args, d, dtype)
    for backend, run in results["runs"].items():
        mem = run["peak_memory_bytes"]
        log(d, f"{backend:5s}: {run['tokens_per_s']:,.0f} tokens/s, median step {run['median_step_ms']:.1f} ms"
               + (f", peak memory {mem / 2**30:.2f} GiB" if mem is not None else ""))
        run["learned"] = learned(run["loss"], args.window, config.vocab_size)
        if not run["learned"]["ok"]:
            log(d, f"llama_train: FAIL: the {backend} run's loss did not fall ({run['learned']})")
            ok = False
    if "eager" in results["runs"] and "tile" in results["runs"]:
        cmp = compare_curves(results["runs"]["eager"]["loss"], results["runs"]["tile"]["loss"], args.window)
        results["checks"]["loss_curves"] = cmp
        log(d, f"loss curves: first step |diff| {cmp['first_step_abs_diff']:.4f} (<= {FIRST_STEP_ABS}), "
               f"{args.window}-step moving averages within {cmp['max_moving_average_rel_diff']:.2%} (<= {CURVE_REL:.0%}; "
               f"worst at step {cmp['at_step']}), last {args.window} steps {cmp['final_mean_eager']:.4f} vs "
               f"{cmp['final_mean_tile']:.4f} ({cmp['final_rel_diff']:.2%}, <= {FINAL_REL:.0%})")
        if not cmp["ok"]:
            log(d, "llama_train: FAIL: the loss curves of eager and tile differ beyond the tolerance")
            ok = False
    results["ok"] = ok
    if args.out and d.rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        log(d, f"wrote {args.out}")
    log(d, "llama_train: " + ("OK" if ok else "FAILED"))
    d.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
