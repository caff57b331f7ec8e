"""PyTorch's own data parallelism on the tch transformer's model, data and tokens: the other side
of "same kernels, different runtime" (issue 28). Both sides run libtorch's CPU kernels.

Modes, on `--ranks` processes of one libtorch thread each, the last `--slow` times slower
(it sleeps (slow - 1) x its step time after each step, as flodl's emulated slowdown does):
  ddp       torch.nn.parallel.DistributedDataParallel over gloo: every step all-reduces gradients.
  localsgd  each rank steps alone on its half of the epoch, parameters averaged (gloo
            all-reduce) every `--sync-every` steps and at the end.
Prints one JSON line: tokens/s (all ranks), training seconds, validation nats/byte, the validation
curve (after each epoch, seconds since the first step) and when it first reached `--target-loss`.

Install (once; the full torch with its CUDA packages, ~3 GB, since `import torch` loads
libtorch_cuda): python3 -m venv target/torch-venv && target/torch-venv/bin/pip install torch==2.13.0 numpy
Run: target/torch-venv/bin/python flodl-tch/gpt/pytorch/compare.py --mode ddp
"""

import argparse
import gzip
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
SIZES = {"tiny": (64, 128, 4, 4), "default": (128, 256, 8, 8), "large": (128, 512, 8, 8)}


class Block(nn.Module):
    def __init__(self, d, heads, layers):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        for lin in (self.qkv, self.up):
            nn.init.normal_(lin.weight, 0.0, 0.02)
        for lin in (self.out, self.down):
            nn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * layers))
        for lin in (self.qkv, self.out, self.up, self.down):
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=2)
        split = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.out(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, context, d, layers, heads):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(256, d), nn.Embedding(context, d)
        nn.init.normal_(self.tokens.weight, 0.0, 0.02)
        nn.init.normal_(self.positions.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, layers) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        pos = torch.arange(x.shape[1])
        h = self.tokens(x) + self.positions(pos)
        for block in self.blocks:
            h = block(h)
        return self.norm(h) @ self.tokens.weight.t()


def windows(path, context, n):
    data = torch.frombuffer(bytearray(gzip.open(path).read()), dtype=torch.uint8).long()
    count = min(n, (len(data) - 1) // context)
    idx = torch.arange(count)[:, None] * context + torch.arange(context + 1)[None, :]
    return data[idx]


def lr_at(step, args, total):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    low = args.lr / 10
    return low + 0.5 * (args.lr - low) * (1 + math.cos(math.pi * p))


def loss_of(model, w):
    logits = model(w[:, :-1])
    return F.cross_entropy(logits.reshape(-1, 256), w[:, 1:].reshape(-1))


def rank_main(rank, args):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    context, d, layers, heads = SIZES[args.size]
    shk = os.path.join(ROOT, "data", "shakespeare")
    train = windows(os.path.join(shk, "train.txt.gz"), context, args.train_windows)
    valid = windows(os.path.join(shk, "valid.txt.gz"), context, args.valid_windows)
    torch.manual_seed(args.seed)
    model = Gpt(context, d, layers, heads)
    net = nn.parallel.DistributedDataParallel(model) if args.mode == "ddp" else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    per_rank = len(train) // args.batch // args.ranks
    total = per_rank * args.ranks * args.epochs  # batches of all ranks together
    slow = args.slow if rank == args.ranks - 1 else 1.0
    dist.barrier()
    t0 = time.perf_counter()
    step = 0
    curve = []  # (seconds since the first step, validation nats/byte) after each epoch
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(len(train), generator=g)
        mine = order[rank * per_rank * args.batch:(rank + 1) * per_rank * args.batch]
        for i in range(per_rank):
            s0 = time.perf_counter()
            w = train[mine[i * args.batch:(i + 1) * args.batch]]
            for group in opt.param_groups:
                group["lr"] = lr_at(step * args.ranks, args, total)
            opt.zero_grad()
            loss_of(net, w).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if slow > 1.0:
                time.sleep((time.perf_counter() - s0) * (slow - 1.0))
            if args.mode == "localsgd" and step % args.sync_every == 0:
                average(model, args.ranks)
        if args.mode == "localsgd" and step % args.sync_every != 0:
            average(model, args.ranks)  # the epoch's model is the average, as flodl's is
        at = time.perf_counter() - t0
        if epoch + 1 < args.epochs and rank == 0:
            # As flodl does: one rank evaluates the epoch's model while the other goes on (and
            # meets it at the next all-reduce); the evaluation is on the clock of later epochs.
            curve.append((round(at, 2), round(evaluate(model, valid), 4)))
    train_s = time.perf_counter() - t0
    if rank == 0:
        v = evaluate(model, valid)
        curve.append((round(train_s, 2), round(v, 4)))
        tokens = total * args.batch * context
        reached = next((at for at, loss in curve if loss <= args.target_loss), None) \
            if args.target_loss is not None else None
        print(json.dumps({"mode": args.mode, "size": args.size, "ranks": args.ranks,
                          "slow": args.slow, "tokens": tokens, "train_s": round(train_s, 2),
                          "tokens_per_s": round(tokens / train_s), "valid_nats": round(v, 4),
                          "curve_s_nats": curve, "target_nats": args.target_loss,
                          "target_reached_s": reached}))
    dist.barrier()  # no rank leaves the group while the other still uses it
    dist.destroy_process_group()


def evaluate(model, valid):
    with torch.no_grad():
        return sum(loss_of(model, valid[i:i + 64]).item() * len(valid[i:i + 64])
                   for i in range(0, len(valid), 64)) / len(valid)


def average(model, world):
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p.data)
            p.data /= world


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "localsgd"], default="ddp")
    ap.add_argument("--size", choices=list(SIZES), default="tiny")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--slow", type=float, default=2.5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--train-windows", type=int, default=1600)
    ap.add_argument("--valid-windows", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--sync-every", type=int, default=8)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--port", type=int, default=29528)
    ap.add_argument("--target-loss", type=float, default=None,
                    help="report when the validation loss (after each epoch) first reached this")
    args = ap.parse_args()
    mp.spawn(rank_main, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
