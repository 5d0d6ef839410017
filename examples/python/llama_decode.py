"""Greedy decoding of the small Llama of llama_train.py with a static KV cache, one decode step
captured in a CUDA graph, with transformers' own modules ("eager") and with Tile's RMSNorm
patched in ("tile"); per-token latency of each, with and without the graph.

The model is first trained for --train-steps with eager modules on llama_train.py's noisy
successor chain, so that its next-token choices have clear margins (a random model's logits
are near ties, and a bf16 rounding difference would flip its greedy choice; a trained model
predicts succ[token] by a wide margin). Then, for each backend and mode, it prefills a prompt
(--prompt tokens of held-out data) into a transformers StaticCache and generates --new-tokens
tokens, one decode step at a time: input ids, positions, the attention mask (computed from the
position on the device) and the cache are static tensors, so the step is captured once with
torch.cuda.graph after --warmup eager steps (which also build Tile's kernels) and replayed.

    python examples/python/llama_decode.py --out llama_decode.json    # one GPU, ~30 s on an H200
    python examples/python/llama_decode.py --tiny --device cpu         # CPU: no graphs, a smoke run

Checks (exit 1 on a failure): the graph replays give the same tokens as the eager loop of the
same backend; tile and eager give the same first --match tokens (bf16 rounding of the norms
differs slightly, so past the margins of the trained model the sequences may part; the first
difference is reported); eager decoding with the cache gives the tokens of a plain forward over
the whole sequence (no cache) for the first --match tokens.
"""
import argparse
import inspect
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_train  # noqa: E402

import tile  # noqa: E402,F401


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tiny model (a smoke run; CPU is fine, without graphs)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--train-steps", type=int, default=None, help="eager training steps first (full: 300, tiny: 30)")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated (full: 256, tiny: 24)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--warmup", type=int, default=3, help="decode steps before capture / timing")
    p.add_argument("--match", type=int, default=None, help="tokens that must agree (full: 64, tiny: 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.size = "tiny" if args.tiny else "full"
    defaults = {"full": dict(train_steps=300, new_tokens=256, match=64),
                "tiny": dict(train_steps=30, new_tokens=24, match=16)}[args.size]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.new_tokens < args.warmup + 2 or args.match > args.new_tokens:
        p.error("--new-tokens must exceed --warmup + 1 and be at least --match")
    return args


def train_state(config, args, device):
    """The weights after --train-steps of eager bf16 training (llama_train's recipe)."""
    targs = llama_train.parse_args((["--tiny"] if args.tiny else []) + ["--steps", str(max(1, args.train_steps)),
                                                                        "--seed", str(args.seed)])
    state = llama_train.initial_state(config, args.seed)
    batches = llama_train.make_batches(args.train_steps, targs.batch, targs.seq, config.vocab_size, args.seed)
    model, _ = llama_train.build_model(config, state, "eager", device, torch.bfloat16)
    opt, sched = llama_train.make_optimizer(model, targs)
    for step in range(args.train_steps):
        loss = llama_train.loss_of(model, batches[step].to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    print(f"trained {args.train_steps} steps (eager): last loss {loss.item():.3f}, the data's floor "
          f"{llama_train.entropy_floor(config.vocab_size):.3f}", flush=True)
    return {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}


class Decoder:
    """Greedy decoding with a StaticCache; step() reads and writes only static tensors, so it
    can be captured in a CUDA graph and replayed: each replay generates the next token."""

    def __init__(self, model, prompt, new_tokens):
        from transformers import StaticCache
        self.model, self.prompt = model, prompt
        batch, self.plen = prompt.shape
        device = prompt.device
        self.max_len = self.plen + new_tokens
        self.cache = StaticCache(config=model.config, max_cache_len=self.max_len)
        # transformers 5 names the forward's cache argument `cache` (earlier: `past_key_values`).
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.positions = torch.arange(self.max_len, device=device)
        self.tokens = torch.zeros(batch, new_tokens, dtype=torch.long, device=device)

    def _logits(self, ids, positions, mask):
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         **{self.cache_arg: self.cache})
        return out.logits[:, -1]

    def prefill(self):
        positions = self.positions[:self.plen].expand(self.prompt.shape[0], -1)
        nxt = self._logits(self.prompt, positions, None).argmax(-1)
        self.tokens[:, 0] = nxt
        self.ids.copy_(nxt[:, None])
        self.pos.fill_(self.plen)

    def step(self):
        # Keys at positions <= the current one are visible: a (batch, 1, 1, max_len) boolean mask
        # made on the device from self.pos, so the graph replays with the position it reads.
        mask = (self.positions[None, :] <= self.pos)[:, None, None, :]
        nxt = self._logits(self.ids, self.pos, mask).argmax(-1)
        self.tokens.scatter_(1, self.pos - self.plen + 1, nxt[:, None])
        self.ids.copy_(nxt[:, None])
        self.pos.add_(1)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def decode(model, prompt, args, graph):
    """Generates args.new_tokens tokens; returns (tokens (batch, n) on the CPU, ms per token
    over the steps after the warm-up)."""
    device = prompt.device
    dec = Decoder(model, prompt, args.new_tokens)
    dec.prefill()
    steps = args.new_tokens - 1
    if graph:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(args.warmup):
                dec.step()
        torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dec.step()                          # recorded, not run
        run = g.replay
    else:
        for _ in range(args.warmup):
            dec.step()
        run = dec.step
    timed = steps - args.warmup
    sync(device)
    t0 = time.perf_counter()
    for _ in range(timed):
        run()
    sync(device)
    ms = (time.perf_counter() - t0) * 1e3 / timed
    return dec.tokens.cpu(), ms


@torch.no_grad()
def reference_tokens(model, prompt, n):
    """Greedy tokens from plain forwards over the whole sequence (no cache, no mask given)."""
    seq = prompt
    for _ in range(n):
        nxt = model(input_ids=seq).logits[:, -1].argmax(-1)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
    return seq[:, prompt.shape[1]:].cpu()


def first_difference(a, b):
    diff = (a != b).any(dim=0).nonzero()
    return int(diff[0]) if len(diff) else None


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("llama_decode: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    graphs = device.type == "cuda"
    if not graphs:
        print("llama_decode: on the CPU there are no CUDA graphs; decoding without them only")
    targs = llama_train.parse_args(["--tiny"] if args.tiny else [])
    config = llama_train.make_config(targs)
    config.max_position_embeddings = max(config.max_position_embeddings, args.prompt + args.new_tokens)
    state = train_state(config, args, device)
    # A prompt from data the training did not see (another seed).
    prompt = llama_train.make_batches(1, args.batch, args.prompt - 1, config.vocab_size, args.seed + 1000)[0]
    prompt = prompt.to(device)
    succ = llama_train.successor_table(config.vocab_size, args.seed)

    results = {"args": vars(args), "environment": {"torch": torch.__version__, "device": str(device)},
               "runs": {}, "checks": {}}
    if device.type == "cuda":
        results["environment"]["gpu"] = torch.cuda.get_device_name(device)
    tokens = {}
    ok = True
    for backend in ("eager", "tile"):
        model, _ = llama_train.build_model(config, state, backend, device, torch.bfloat16)
        model.eval()
        for graph in ((False, True) if graphs else (False,)):
            name = f"{backend}{'_graph' if graph else ''}"
            try:
                toks, ms = decode(model, prompt, args, graph)
            except Exception as e:          # a step that cannot be captured: report it, fail the run
                print(f"{name}: FAILED: {type(e).__name__}: {e}")
                results["runs"][name] = {"error": f"{type(e).__name__}: {e}"}
                ok = False
                continue
            tokens[name] = toks
            follows = (succ[toks[:, :-1]] == toks[:, 1:]).float().mean().item()
            results["runs"][name] = {"ms_per_token": ms, "tokens": toks.tolist(), "follows_successor": follows}
            print(f"{name:12s} {ms:8.3f} ms/token   {follows:.0%} of the tokens follow the chain", flush=True)
        if backend == "eager":
            ref = reference_tokens(model, prompt, args.match)
            same = bool(torch.equal(ref, tokens["eager"][:, :args.match])) if "eager" in tokens else False
            results["checks"]["cache_against_full_forward"] = {"tokens": args.match, "ok": same}
            if not same:
                print(f"FAIL: eager decoding with the StaticCache differs from plain forwards within the first "
                      f"{args.match} tokens")
                ok = False
        del model
    for backend in ("eager", "tile"):
        if f"{backend}_graph" in tokens and backend in tokens:
            same = bool(torch.equal(tokens[backend], tokens[f"{backend}_graph"]))
            results["checks"][f"{backend}_graph_equals_loop"] = same
            if not same:
                print(f"FAIL: {backend}: the CUDA-graph replays give other tokens than the eager loop (first "
                      f"difference at {first_difference(tokens[backend], tokens[backend + '_graph'])})")
                ok = False
    if "eager" in tokens and "tile" in tokens:
        first = first_difference(tokens["eager"], tokens["tile"])
        agree = first is None or first >= args.match
        results["checks"]["tile_matches_eager"] = {"first_difference": first, "required": args.match, "ok": agree}
        print(f"tile against eager: {'identical' if first is None else f'first difference at token {first}'} "
              f"(the first {args.match} must agree)")
        if not agree:
            ok = False
    results["ok"] = ok
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")
    print("llama_decode: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
