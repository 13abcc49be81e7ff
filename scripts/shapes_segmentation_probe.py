"""How fast does the small U-Net learn the shapes data on a CPU? Train, test, print.

    python scripts/shapes_segmentation_probe.py                      # the recipe, seed 0
    python scripts/shapes_segmentation_probe.py --seeds 0 1 2        # one run per seed, in turn
    python scripts/shapes_segmentation_probe.py --threads 2          # a machine nobody else uses

Prints, per seed, the test mean IoU and pixel accuracy, the wall time of the data, the training
and the test, and the training's CPU time, then the mean and the worst over the seeds. The seed
fixes the data (split_seed), the initial weights, the shuffle and the augmentation.

The defaults are the recipe: 32 px shapes (4,000 train images, noise 0.05, 1-3 shapes of size
0.2-0.4), UNet widths (16, 32, 64), AdamW lr 6e-3 (5% warmup, cosine to 0), weight decay 1e-4,
batch 16, 5 epochs (1,250 updates), shift 0.125 and horizontal flips. Measured on the shared
2-core machine it was tuned on: test mIoU 0.870, 0.875, 0.881 for seeds 0, 1, 2.

One thread by default. With two threads on two cores that other processes also use, torch's
OpenMP threads spin waiting for each other: at a load average of 4-5 a recipe epoch took 80-156 s
with two threads, about 33 s with two threads and OMP_WAIT_POLICY=PASSIVE, and 15-32 s with one
(96-120 s for the whole training; 62-86 CPU seconds). Two threads pay off only on quiet cores:
their least disturbed epochs took 9-11 s (and 3,000 images about 5 s in a quieter moment), which
puts the recipe's training at 35-55 s on two idle cores. Thread counts round differently: with
two threads seed 0 ends at mIoU 0.862 instead of 0.870.

A hand-written loop on purpose: it measures the building blocks (trainkit.data.shapes,
trainkit.models.unet, trainkit.augment.image_and_mask, trainkit.tasks.segmentation's metrics) without train.py,
so their speed and what they can learn are known before they are wired in.
"""

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

from trainkit.augment.image_and_mask import augment_image_and_mask
from trainkit.data.shapes import Shapes
from trainkit.models.unet import UNet
from trainkit.tasks.confusion import confusion_counts
from trainkit.tasks.segmentation import miou_and_pixel_acc

# Per-channel statistics of the shapes images, for the data yaml's mean and std. The data is the
# same in every channel by construction (uniform random colours), so the mean is 0.5; measured
# on 6 draws (8,000 images at 32 px, 2,000 at 64 px, noise 0.05): mean 0.492..0.507, std 0.293..0.298.
SHAPES_MEAN = (0.5, 0.5, 0.5)
SHAPES_STD = (0.295, 0.295, 0.295)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads; see the docstring")
    data = parser.add_argument_group("data (trainkit.data.shapes)")
    data.add_argument("--image-size", type=int, default=32)
    data.add_argument("--num-samples", type=int, default=4000)
    data.add_argument("--test-samples", type=int, default=1000)
    data.add_argument("--noise", type=float, default=0.05)
    data.add_argument("--max-shapes", type=int, default=3)
    data.add_argument("--shape-size", type=float, nargs=2, default=[0.2, 0.4])
    model = parser.add_argument_group("model and training")
    model.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64])
    model.add_argument("--epochs", type=int, default=5)
    model.add_argument("--batch-size", type=int, default=16)
    model.add_argument("--lr", type=float, default=6e-3, help="AdamW peak learning rate")
    model.add_argument("--weight-decay", type=float, default=1e-4)
    model.add_argument("--warmup-fraction", type=float, default=0.05, help="of the updates, then cosine to 0")
    model.add_argument("--crop-padding", type=float, default=0.125)
    model.add_argument("--horizontal-flip", action=argparse.BooleanOptionalAction, default=True)
    model.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--test-every-epoch", action="store_true", help="for tuning: the learning curve")
    return parser.parse_args()


def learning_rate(update: int, total_updates: int, peak: float, warmup_fraction: float) -> float:
    """Linear warmup, then cosine decay to zero: a function of the update count alone."""
    warmup = max(1, round(warmup_fraction * total_updates))
    if update < warmup:
        return peak * (update + 1) / warmup
    progress = (update - warmup) / max(1, total_updates - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def run(args: argparse.Namespace, seed: int) -> dict[str, float]:
    started = time.perf_counter()
    data = Shapes(
        name="shapes",
        channels=3,
        image_size=args.image_size,
        num_classes=None,
        mirror_changes_label=False,
        mean=SHAPES_MEAN,
        std=SHAPES_STD,
        batch_size=args.batch_size,
        eval_batch_size=256,
        num_workers=0,
        drop_last=False,
        shuffle=True,
        num_samples=args.num_samples,
        val_samples=1,  # the probe does no model selection
        test_samples=args.test_samples,
        noise=args.noise,
        split_seed=seed,
        max_shapes=args.max_shapes,
        shape_size=args.shape_size,
    )
    splits = data.splits()
    data_seconds = time.perf_counter() - started
    mean = torch.tensor(SHAPES_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(SHAPES_STD).view(1, 3, 1, 1)
    train_images, train_masks = splits.train

    torch.manual_seed(seed)
    model = UNet(3, splits.num_classes, widths=args.widths)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)  # NHWC: faster convolutions on CPU (oneDNN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    updates_per_epoch = len(train_images) // args.batch_size  # drop the last, partial batch
    total_updates = args.epochs * updates_per_epoch

    training_started, training_cpu_started = time.perf_counter(), time.process_time()
    model.train()
    update = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_images))
        epoch_loss = torch.zeros(())
        for step in range(updates_per_epoch):
            batch = order[step * args.batch_size : (step + 1) * args.batch_size]
            images, masks = augment_image_and_mask(
                train_images[batch], train_masks[batch], args.horizontal_flip, args.crop_padding
            )
            inputs = ((images - mean) / std).contiguous(memory_format=memory_format)
            loss = F.cross_entropy(model(inputs), masks)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(update, total_updates, args.lr, args.warmup_fraction)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach()
            update += 1
        line = f"  seed {seed} epoch {epoch + 1}: train loss {epoch_loss.item() / updates_per_epoch:.4f}"
        if args.test_every_epoch:  # for tuning: costs a test pass, and counts in the training time
            line += " test mIoU {:.4f} pixel accuracy {:.4f}".format(
                *evaluate(model, splits.test, splits.num_classes, mean, std)
            )
            model.train()
        wall, cpu = time.perf_counter() - training_started, time.process_time() - training_cpu_started
        print(f"{line}; {wall:.1f} s, {cpu:.1f} CPU s", flush=True)
    training_seconds = time.perf_counter() - training_started
    training_cpu_seconds = time.process_time() - training_cpu_started

    testing_started = time.perf_counter()
    miou, pixel_accuracy = evaluate(model, splits.test, splits.num_classes, mean, std)
    return {
        "miou": miou,
        "pixel_accuracy": pixel_accuracy,
        "data_seconds": data_seconds,
        "training_seconds": training_seconds,
        "training_cpu_seconds": training_cpu_seconds,
        "test_seconds": time.perf_counter() - testing_started,
        "total_seconds": time.perf_counter() - started,
    }


def evaluate(
    model: torch.nn.Module,
    split: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    mean: torch.Tensor,
    std: torch.Tensor,
) -> tuple[float, float]:
    """(mIoU, pixel accuracy) of the model on a split, from one confusion matrix over all of it."""
    images, masks = split
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    with torch.no_grad():
        for start in range(0, len(images), 250):
            logits = model((images[start : start + 250] - mean) / std)
            confusion += confusion_counts(logits.argmax(dim=1), masks[start : start + 250], num_classes)
    miou, pixel_accuracy = miou_and_pixel_acc(confusion)
    return miou.item(), pixel_accuracy.item()


def main() -> None:
    args = parse_arguments()
    torch.set_num_threads(args.threads)
    print(f"recipe: {vars(args)}")
    # Wall times mean little on a shared machine: say how busy it was.
    print("load average (1, 5, 15 min) at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    results = []
    for seed in args.seeds:
        result = run(args, seed)
        results.append(result)
        print(
            f"seed {seed}: test mIoU {result['miou']:.4f}, pixel accuracy {result['pixel_accuracy']:.4f}; "
            f"wall seconds: data {result['data_seconds']:.1f}, training {result['training_seconds']:.1f}, "
            f"test {result['test_seconds']:.1f}, total {result['total_seconds']:.1f}; "
            f"training CPU seconds {result['training_cpu_seconds']:.1f} (all threads)",
            flush=True,
        )
    print("load average (1, 5, 15 min) at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if len(results) > 1:
        mious = [r["miou"] for r in results]
        seconds = [r["total_seconds"] for r in results]
        print(
            f"over {len(results)} seeds: mIoU mean {sum(mious) / len(mious):.4f}, worst {min(mious):.4f}; "
            f"total wall seconds mean {sum(seconds) / len(seconds):.1f}, worst {max(seconds):.1f}"
        )


if __name__ == "__main__":
    main()
