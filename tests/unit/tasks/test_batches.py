"""trainkit.tasks.batches: any nested structure of tensors is moved, counted, repeated and cut along its samples,
its structure and what is not a tensor kept; micro_batches cuts such a batch as it cuts a pair."""

import pytest
import torch
import torch.nn.functional as F

from models_for_tests import NoNormCNN
from trainkit.errors import ConfigError
from trainkit.tasks import batches
from trainkit.tasks.weighting import micro_batches


def nested(count: int = 5) -> dict:
    values = torch.arange(count * 3.0).reshape(count, 3)
    return {"views": (values, values + 100), "lengths": torch.arange(count), "name": "signals", "mask": None}


def test_moving_a_nested_batch_moves_every_tensor_and_keeps_the_rest():
    batch = nested()
    moved = batches.to_device(batch, torch.device("meta"))
    assert moved["views"][0].device.type == moved["views"][1].device.type == moved["lengths"].device.type == "meta"
    assert moved["name"] == "signals" and moved["mask"] is None
    assert batches.samples(batch) == 5 and batches.first_tensor(batch) is batch["views"][0]


def test_a_nested_batch_is_cut_into_parts_of_its_samples_each_of_the_batch_s_structure():
    batch = nested(5)
    parts = batches.split(batch, 2)
    assert [batches.samples(part) for part in parts] == [2, 2, 1]
    for n, part in enumerate(parts):
        assert torch.equal(part["views"][1], batch["views"][1][2 * n : 2 * n + 2])
        assert torch.equal(part["lengths"], batch["lengths"][2 * n : 2 * n + 2])
        assert part["name"] == "signals" and part["mask"] is None
    repeated = batches.rows(batch, torch.tensor([4, 4, 0]))
    assert repeated["lengths"].tolist() == [4, 4, 0] and torch.equal(repeated["views"][0][2], batch["views"][0][0])


def test_tensors_that_do_not_share_their_samples_are_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"this batch's tensors have \[2, 5\] rows") as error:
        batches.split({"values": torch.zeros(5, 3), "table": torch.zeros(2)}, 2)
    assert error.value.key == "trainer.micro_batch_size"


def test_micro_batches_of_a_dict_weigh_each_part_by_its_share_and_count_token_data_s_size_in_tokens():
    batch = nested(5)
    assert [(batches.samples(part), share) for part, share in micro_batches(batch, 2)] == [(2, 0.4), (2, 0.4), (1, 0.2)]
    assert micro_batches(batch, 5) == [(batch, 1.0)]
    tokens = {"ids": torch.zeros(5, 4, dtype=torch.long), "targets": torch.zeros(5, 4, dtype=torch.long)}
    assert [batches.samples(part) for part, _ in micro_batches(tokens, 8, sized=True)] == [2, 2, 1]  # 8 tokens: 2 rows


# ---- trainer.micro_batch_size=N: the parts' gradients sum to the whole batch's ----------------------------


def batch(size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(size, 1, 8, 8, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def gradients(micro_batch_size: int | None) -> torch.Tensor:
    """The gradient of one batch's mean loss, the batch trained in parts as train.py's loop does."""
    torch.manual_seed(0)
    model = NoNormCNN(1, 10, widths=(8, 16))
    inputs, targets = batch()
    for (part_inputs, part_targets), share in micro_batches((inputs, targets), micro_batch_size):
        (F.cross_entropy(model(part_inputs), part_targets) / (1 / share)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("size", [8, 12])  # 12: parts of 12, 12 and 8 weigh by their shares
def test_micro_batches_give_the_whole_batch_s_gradients(size):
    torch.testing.assert_close(gradients(size), gradients(None), rtol=0, atol=1e-6)
    assert len(micro_batches(batch(), size)) == -(-32 // size)


def test_no_size_or_one_not_below_the_batch_is_the_batch_itself():
    whole = batch()
    for size in (None, 32, 100):
        [(part, share)] = micro_batches(whole, size)
        assert part is whole and share == 1.0
