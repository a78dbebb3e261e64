"""One rank of the DDP-gradient check (not a test module): runs the trainer's own step code on
step 0 of each spec given and saves the all-reduced gradients, weighted and unweighted."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from qsync_opt.runtime.data import SyntheticTask, shard
from qsync_opt.training.runtime.trainer import build_rank_model, forward_backward, loss_weight, rank_batches
from qsync_opt.training.spec import load_spec

out, specs = sys.argv[1], sys.argv[2:]
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for i, path in enumerate(specs):
    spec = load_spec(path)
    batches = rank_batches(spec, None)
    offset, local = shard(batches, rank)
    model = build_rank_model(spec, None, spec.cluster.group_of_rank(rank).name)
    ddp = DDP(model)
    task = SyntheticTask(spec)
    inputs, targets = task.batch(0, sum(batches), offset, local)
    for name, weight in (("weighted", loss_weight(local, world, sum(batches))), ("unweighted", 1.0)):
        model.zero_grad(set_to_none=True)
        forward_backward(ddp, task, inputs, targets, weight)
        torch.save({n: p.grad for n, p in model.named_parameters()}, f"{out}/spec{i}_{name}_rank{rank}.pt")
    del ddp
dist.barrier()  # nobody tears down its connections while another rank still uses them
dist.destroy_process_group()
