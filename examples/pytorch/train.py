#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A small GPT trained with DDP over gloo on the CPU, checkpointed through ckpt.

    python3 examples/pytorch/train.py --dir DIR --steps N --save-every K --world-size W \
        [--resume] [--metrics FILE.jsonl]

W processes (torch.multiprocessing, file:// rendezvous in DIR), each one rank: a GPT from
torch.nn (token and position embeddings, pre-norm transformer blocks, an LM head), AdamW with
a linear-warmup + cosine LambdaLR, deterministic (torch.use_deterministic_algorithms, one
thread per process, seeded data and dropout). Every K steps each rank saves its shard
through ckpt with deferred staging: the copy runs while the next forward and backward do,
and the fence (wait_staged) comes right before the optimizer step. Rank 0's shard holds the
model, the optimizer and the scheduler (they are replicated, so once is enough); every
rank's shard holds its own RNG states (described as rank_local, so `ckpt reshard` and
`ckpt consolidate` place every tensor) and data position. Rank 0 commits once every shard is
durable (ckpt.distributed.TorchCoordinator, over a gloo group of its own).

--resume continues from DIR/ckpt's `latest`: the model is loaded in place (load_into), the
optimizer, scheduler, RNG states and data position rebuilt, and training goes on bit for bit
as if it had never stopped (a test kills a run with SIGKILL at a random step and compares).
A resume at another world size is refused (ckpt.WorldSizeMismatch, exit status 3).

--metrics: one JSON line per step from rank 0, {"step", "loss", "loss_hex", "lr_hex"}
(loss_hex = float.hex() of the loss averaged over ranks, so equality is exact), then a last
line {"final": true, "step", "params_sha256"} over every parameter's bytes.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import ckpt
from ckpt.state import rng_state, set_rng_state

VOCAB, SEQ, DIM, HEADS, LAYERS, BATCH = 64, 16, 32, 4, 2, 4
WARMUP, LR = 4, 3e-3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM), nn.Dropout(0.1))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1), persistent=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.ln_f(x))


def corpus():
    # A fixed token stream with structure to learn: a noisy repeating pattern.
    g = np.random.RandomState(1234)
    base = np.tile(np.arange(VOCAB), 64)
    noise = g.randint(0, VOCAB, base.shape)
    return torch.from_numpy(np.where(g.rand(*base.shape) < 0.1, noise, base).astype(np.int64))


def lr_lambda(total):
    def f(step):
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - WARMUP) / max(1, total - WARMUP))))
    return f


def deterministic_allreduce(state, bucket):
    # DDP's own all-reduce sums a bucket's elements in an order that depends on where they lie
    # in the bucket, and DDP rebuilds its buckets after the first step of every process:
    # reducing each parameter's gradient on its own makes the sums independent of the
    # bucketing, so a resumed run adds the same numbers in the same order.
    buf = bucket.buffer()
    off = 0
    for g in bucket.gradients():
        n = g.numel()
        dist.all_reduce(buf[off:off + n])
        off += n
    buf.div_(dist.get_world_size())
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def model_tensors(model):
    return ckpt.state_dict_to_tensors({"model": model.state_dict()})[0]


def run(rank, args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = args.world_size
    dist.init_process_group("gloo", init_method=f"file://{os.path.abspath(args.dir)}/.rendezvous-{args.run_id}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    root = args.root or os.path.join(args.dir, "ckpt")
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.steps))
    data = corpus()
    # Each rank's own randomness: dropout (torch), batch offsets (numpy).
    torch.manual_seed(1000 + rank)
    np.random.seed(2000 + rank)
    start = 0
    if args.resume:
        try:
            r = ckpt.open_latest(root, world_size=world)
        except ckpt.WorldSizeMismatch as e:
            if rank == 0:
                print(f"train.py: cannot resume: {type(e).__name__}: {e}", file=sys.stderr)
            dist.barrier()
            os._exit(3)
        r.load_into(0, model_tensors(model))  # the parameters, in place
        shared = {n: r.read(0, n) for n in r.tensor_names(0) if not n.startswith("model.")}
        state = ckpt.tensors_to_state_dict(shared, r.metadata(0)["shared"])
        opt.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        own = r.metadata(rank)
        set_rng_state(ckpt.tensors_to_state_dict(r.read_all(rank), own["own"])["rng"])
        start = own["step"]
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, deterministic_allreduce)
    metrics = open(args.metrics, "a") if args.metrics and rank == 0 else None
    coord = ckpt.distributed.TorchCoordinator()
    pending = None
    with ckpt.Checkpointer(root, coordinator=coord, keep_last=3) as c:
        for step in range(start + 1, args.steps + 1):
            offs = np.random.randint(0, len(data) - SEQ - 1, BATCH)  # the data position is the step
            x = torch.stack([data[o:o + SEQ] for o in offs])
            y = torch.stack([data[o + 1:o + SEQ + 1] for o in offs])
            loss = F.cross_entropy(ddp(x).reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            if pending is not None:
                pending.wait_staged()  # the fence: the saved tensors may change from here on
                pending = None
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=False)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean = (mean / world).item()
            if metrics:
                metrics.write(json.dumps({"step": step, "loss": mean, "loss_hex": mean.hex(), "lr_hex": lr.hex()}) + "\n")
                metrics.flush()
            if step % args.save_every == 0:
                own_t, own_s = ckpt.state_dict_to_tensors({"rng": rng_state()})
                meta = {"step": step, "own": own_s}
                tensors = dict(own_t)
                # Every rank's RNG states are its own (rank_local); rank 0's model and optimizer
                # tensors are stored whole on rank 0. So `ckpt reshard` and `ckpt consolidate`
                # know where each tensor goes (docs/format.md, "Sharded tensors").
                sharding = {name: ckpt.rank_local() for name in own_t}
                if rank == 0:
                    tensors.update(model_tensors(model))  # loaded in place on resume: no skeleton needed
                    shared_t, shared_s = ckpt.state_dict_to_tensors({"optim": opt.state_dict(), "sched": sched.state_dict()})
                    tensors.update(shared_t)
                    meta["shared"] = shared_s
                pending = c.save(rank, step, tensors, metadata=meta, deferred=True,
                                 training={"world_size": world, "steps": args.steps}, sharding=sharding)
        if pending is not None:
            pending.wait()
    coord.close()
    if metrics:
        h = hashlib.sha256()
        for name, p in model.state_dict().items():
            h.update(name.encode())
            h.update(p.detach().numpy().tobytes())
        metrics.write(json.dumps({"final": True, "step": args.steps, "params_sha256": h.hexdigest()}) + "\n")
        metrics.close()
    dist.barrier()
    os._exit(0)  # gloo's teardown is not needed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="run directory: checkpoints go to DIR/ckpt")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, required=True)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--root", help="the checkpoint root instead of DIR/ckpt: a directory, or mem://NAME, shared memory that "
                   "outlives the processes (docs/memory.md)")
    p.add_argument("--resume", action="store_true", help="continue from the root's latest")
    p.add_argument("--metrics", help="JSON lines, one per step (rank 0)")
    args = p.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    args.run_id = f"{os.getpid()}"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run, args=(r, args)) for r in range(args.world_size)]
    for q in procs:
        q.start()
    codes = []
    for q in procs:
        q.join()
        codes.append(q.exitcode)
    try:
        os.remove(os.path.join(args.dir, f".rendezvous-{args.run_id}"))
    except FileNotFoundError:
        pass
    if any(c == 3 for c in codes):
        return 3
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
