"""model=signal: a dict batch of 1-D signals and their lengths -> logits; what lies past a signal's length, and
so the batch it lands in, never changes its outputs; the default task feeds it a dict batch and trains it."""

import torch

from trainkit.models.signal import SignalClassifier
from trainkit.tasks.classification import Classification


def test_outputs_have_one_row_a_signal_for_mono_and_multichannel_signals():
    torch.manual_seed(0)
    mono = SignalClassifier(num_classes=4, width=8, depth=2)
    assert mono(torch.rand(3, 17), torch.tensor([17, 5, 1])).shape == (3, 4)
    stereo = SignalClassifier(num_classes=4, in_channels=2, width=8, depth=2)
    assert stereo(torch.rand(3, 2, 9), torch.tensor([9, 9, 2])).shape == (3, 4)


def test_a_signal_s_outputs_do_not_depend_on_its_padding_or_its_batch():
    torch.manual_seed(0)
    model = SignalClassifier(num_classes=3, width=8, depth=3, kernel_size=5)
    signal = torch.rand(1, 11)
    alone = model(signal, torch.tensor([11]))
    padded = torch.cat([signal, torch.rand(1, 20)], dim=1)  # garbage past its length, as a longer batch holds
    other = torch.rand(1, 31)
    together = model(torch.cat([padded, other]), torch.tensor([11, 31]))
    torch.testing.assert_close(together[:1], alone, rtol=0, atol=1e-6)


def test_the_default_task_gives_a_dict_batch_s_inputs_to_the_model_by_name_and_scores_its_targets():
    torch.manual_seed(0)
    model = SignalClassifier(num_classes=3, width=8, depth=1)
    batch = {"signal": torch.rand(4, 7), "lengths": torch.tensor([7, 3, 5, 1]), "targets": torch.tensor([0, 1, 2, 1])}
    task = Classification(num_classes=3)
    batch = task.augment(task.transform(batch, torch.nn.Identity()))
    loss, outputs = task.step(model, batch)
    torch.testing.assert_close(outputs, model(batch["signal"], batch["lengths"]))
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(outputs, batch["targets"]))
    assert task.targets(batch) is batch["targets"]
