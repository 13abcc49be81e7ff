"""The batch functions of trainkit.tasks.task: any nested structure of tensors is moved, counted, repeated and cut
along its samples, its structure and what is not a tensor kept (a tensor the batch shares too); micro_batches cuts
such a batch as it cuts a pair; tensors that disagree in their rows are refused in one line."""

import pytest
import torch
import torch.nn.functional as F

from models_for_tests import NoNormCNN
from trainkit.errors import ConfigError
from trainkit.tasks.classification import Classification
from trainkit.tasks.task import Shared, Task, first_tensor, micro_batches, rows, samples, split


def nested(count: int = 5) -> dict:
    values = torch.arange(count * 3.0).reshape(count, 3)
    return {"views": (values, values + 100), "lengths": torch.arange(count), "name": "signals", "mask": None}


def test_moving_a_nested_batch_moves_every_tensor_and_keeps_the_rest():
    batch = nested()
    moved = Task().to_device(batch, torch.device("meta"))
    assert moved["views"][0].device.type == moved["views"][1].device.type == moved["lengths"].device.type == "meta"
    assert moved["name"] == "signals" and moved["mask"] is None
    assert samples(batch) == 5 and first_tensor(batch) is batch["views"][0]


def test_a_nested_batch_is_cut_into_parts_of_its_samples_each_of_the_batch_s_structure():
    batch = nested(5)
    parts = split(batch, 2)
    assert [samples(part) for part in parts] == [2, 2, 1]
    for n, part in enumerate(parts):
        assert torch.equal(part["views"][1], batch["views"][1][2 * n : 2 * n + 2])
        assert torch.equal(part["lengths"], batch["lengths"][2 * n : 2 * n + 2])
        assert part["name"] == "signals" and part["mask"] is None
    repeated = rows(batch, torch.tensor([4, 4, 0]))
    assert repeated["lengths"].tolist() == [4, 4, 0] and torch.equal(repeated["views"][0][2], batch["views"][0][0])


def class_prompts_beside_images(prompts) -> dict:
    """A dict batch whose first entry is the 10 class names' prompts, beside 64 images and their labels."""
    return {"prompts": prompts, "image": torch.rand(64, 1, 8, 8), "targets": torch.arange(64) % 10}


def test_a_batch_whose_tensors_disagree_in_their_rows_is_refused_in_one_line_wherever_it_is_counted_or_cut():
    batch = class_prompts_beside_images(torch.zeros(10, 5, dtype=torch.long))  # the prompts are not marked shared
    for count in (
        samples,
        Classification(10).weight,
        lambda b: micro_batches(b, None),
        lambda b: micro_batches(b, 16),
    ):
        with pytest.raises(ConfigError) as error:
            count(batch)
        assert error.value.key == "data._target_" and "\n" not in str(error.value)
        assert str(error.value).startswith("data._target_: yields batches whose tensors have [10, 64] rows, but each ")
        assert "trainkit.tasks.task.Shared(tensor)" in str(error.value)  # the way out


def test_a_tensor_the_batch_shares_is_moved_and_given_to_the_model_but_never_cut_or_counted():
    prompts = Shared(torch.zeros(10, 5, dtype=torch.long))
    batch = class_prompts_beside_images(prompts)
    assert samples(batch) == Classification(10).weight(batch) == 64  # the images, not the 10 prompts
    parts = micro_batches(batch, 16)
    assert [(samples(part), share) for part, share in parts] == [(16, 0.25)] * 4
    assert all(part["prompts"] is prompts for part, _ in parts)  # whole in every part
    assert rows(batch, torch.tensor([3, 1]))["prompts"] is prompts
    moved = Task().to_device(batch, torch.device("meta"))
    assert moved["prompts"].tensor.device.type == moved["image"].device.type == "meta"
    given = {}
    Classification(10).outputs(lambda **inputs: given.update(inputs) or torch.zeros(64, 10), batch)
    assert set(given) == {"prompts", "image"} and given["prompts"] is prompts.tensor  # the tensor, not the wrapper


def test_micro_batches_of_a_dict_weigh_each_part_by_its_share_and_count_token_data_s_size_in_tokens():
    batch = nested(5)
    assert [(samples(part), share) for part, share in micro_batches(batch, 2)] == [(2, 0.4), (2, 0.4), (1, 0.2)]
    assert micro_batches(batch, 5) == [(batch, 1.0)]
    tokens = {"ids": torch.zeros(5, 4, dtype=torch.long), "targets": torch.zeros(5, 4, dtype=torch.long)}
    assert [samples(part) for part, _ in micro_batches(tokens, 8, sized=True)] == [2, 2, 1]  # 8 tokens: 2 rows


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
