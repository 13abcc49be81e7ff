"""Peak memory per rank, DDP vs FSDP, on CPU (gloo): what distributed=fsdp saves.

    python scripts/fsdp_memory.py                 # 2 processes, a 67M-parameter MLP, AdamW, 3 steps
    python scripts/fsdp_memory.py --nproc 4 --width 2048 --depth 8

Per rank: the bytes of the weights, gradients and AdamW's two moments it keeps (4 copies of the
parameters under DDP, 4/N under FSDP), and its peak resident memory (ru_maxrss) minus what it held
before building the model. The peak is not a clean measure on a CPU: every rank builds the whole
model before fully_shard splits it, and glibc's allocator keeps freed blocks; on a GPU,
torch.cuda.max_memory_allocated shows the same split as the held bytes.
"""

import argparse
import resource
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch import nn


def mlp(width: int, depth: int) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(rank: int, nproc: int, port: int, kind: str, width: int, depth: int, results) -> None:
    from trainkit.distributed.fsdp import shard_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nproc)
    torch.set_num_threads(1)
    before = peak_mib()
    torch.manual_seed(0)
    model = mlp(width, depth)
    if kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        model = shard_model(model, OmegaConf.create({"blocks": None}), "fp32")  # each Linear a block
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        model(torch.randn(32, width)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=step < 2)  # the last step's gradients (zeroed) stay: they count
    results[(kind, rank)] = (peak_mib() - before, held_mib(model, optimizer))
    dist.destroy_process_group()


def held_mib(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Bytes this rank keeps between steps: its (shard of the) weights, gradients and optimizer state."""
    tensors = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local) / 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=16)
    args = parser.parse_args()
    parameters = sum(p.numel() for p in mlp(args.width, args.depth).parameters())
    print(f"{parameters / 1e6:.1f}M parameters ({parameters * 4 / 2**20:.0f} MiB in fp32), AdamW, {args.nproc} ranks")
    results = mp.Manager().dict()
    for kind in ("ddp", "fsdp"):  # one after the other: the peaks do not share the machine
        mp.spawn(measure, args=(args.nproc, free_port(), kind, args.width, args.depth, results), nprocs=args.nproc)
        peak, held = (max(results[(kind, rank)][i] for rank in range(args.nproc)) for i in (0, 1))
        print(f"{kind:>4}: per rank, weights + optimizer state held {held:,.0f} MiB, peak resident {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
