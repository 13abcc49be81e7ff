"""find_modules and replace_module: locate submodules by type, swap one by its dotted name."""

from torch import nn

from trainkit.models.submodules import find_modules, replace_module


def nested() -> nn.Module:
    return nn.Sequential(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU()), nn.Flatten(), nn.Linear(4, 8), nn.Linear(8, 2))


def test_find_modules_lists_every_match_in_registration_order():
    model = nested()
    assert [name for name, _ in find_modules(model, nn.Linear)] == ["2", "3"]
    assert find_modules(model, nn.Conv2d) == [("0.0", model[0][0])]
    assert find_modules(model, nn.BatchNorm2d) == []


def test_replace_module_swaps_a_nested_and_a_top_level_child():
    model = nested()
    conv = nn.Conv2d(3, 4, 3)
    replace_module(model, "0.0", conv)
    assert model[0][0] is conv
    head = nn.Sequential(nn.Dropout(0.5), model[3])
    replace_module(model, "3", head)
    assert model[3] is head and [name for name, _ in find_modules(model, nn.Linear)] == ["2", "3.1"]
