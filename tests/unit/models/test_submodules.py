"""find_modules: locate submodules by type."""

from torch import nn

from trainkit.models.submodules import find_modules


def nested() -> nn.Module:
    return nn.Sequential(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU()), nn.Flatten(), nn.Linear(4, 8), nn.Linear(8, 2))


def test_find_modules_lists_every_match_in_registration_order():
    model = nested()
    assert [name for name, _ in find_modules(model, nn.Linear)] == ["2", "3"]
    assert find_modules(model, nn.Conv2d) == [("0.0", model[0][0])]
    assert find_modules(model, nn.BatchNorm2d) == []
