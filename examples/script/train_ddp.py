"""A plain PyTorch DDP training script: hpctrain runs it on every rank with torchrun's environment.

    python -m hpctrain task=script task.path=train_ddp.py task.args='[--steps,200]' cluster.nproc=2
It saves in HPCTRAIN_CHECKPOINT_DIR when asked to stop (SIGTERM) and resumes from what it finds there.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--sleep", type=float, default=0.0)  # seconds per step (tests: time to pre-empt)
args = parser.parse_args()

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from hpctrain
rank, stop = dist.get_rank(), torch.zeros(1)
signal.signal(signal.SIGTERM, lambda *_: stop.fill_(1))  # hpctrain forwards the pre-emption warning
path = os.path.join(os.environ["HPCTRAIN_CHECKPOINT_DIR"], "state.pt")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
step = 0
if os.path.exists(path):  # a requeued job: continue where the last one saved
    state = torch.load(path, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"resumed at step {step} (requeue {os.environ['HPCTRAIN_REQUEUE_COUNT']})", flush=True)
while step < args.steps:
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(step * 100 + rank))
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(args.sleep)
    flag = stop.clone()
    dist.all_reduce(flag)  # every rank stops at the same step
    if flag.item():
        break
if rank == 0:
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # never a half-written checkpoint
print("stopped, saved" if step < args.steps else "finished", f"at step {step}", flush=True)
dist.barrier()  # leave together: a rank that exits first closes its gloo connections under a saving peer
dist.destroy_process_group()
sys.stdout.flush()
# Leave without the interpreter's teardown: after all work is done, gloo's C++ threads can still abort it
# (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291), and the exit status
# should say what the script did. Everything it wrote is already on disk.
os._exit(0)
