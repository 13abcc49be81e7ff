"""EarlyStopping: which epoch is best, and exactly when training stops improving."""

import math

import pytest

from trainkit.early_stopping import EarlyStopping


def first_stop_epoch(stopper: EarlyStopping, values) -> int | None:
    for epoch, value in enumerate(values):
        stopper.update(value, epoch)
        if stopper.should_stop:
            return epoch
    return None


def test_max_mode_stops_after_patience_epochs_without_improvement():
    stopper = EarlyStopping("val/acc", mode="max", patience=3)
    # epoch:   0     1     2     3     4     5     6     7     8
    values = [0.50, 0.60, 0.70, 0.65, 0.71, 0.70, 0.71, 0.69, 0.80]
    # 0.71 at epoch 4 is the best; 5, 6 (a tie is no improvement) and 7 do not beat it.
    assert first_stop_epoch(stopper, values) == 7
    assert (stopper.best, stopper.best_epoch) == (0.71, 4)


def test_an_improvement_resets_the_patience_count():
    stopper = EarlyStopping("val/acc", mode="max", patience=3)
    for epoch, value in enumerate([0.5, 0.4, 0.4]):
        stopper.update(value, epoch)
    assert stopper.epochs_without_improvement == 2 and not stopper.should_stop
    assert stopper.update(0.6, 3) is True
    assert stopper.epochs_without_improvement == 0 and not stopper.should_stop


def test_min_mode_requires_a_drop_larger_than_min_delta():
    stopper = EarlyStopping("val/loss", mode="min", patience=2, min_delta=0.1)
    assert stopper.update(1.0, 0) is True
    assert stopper.update(0.95, 1) is False  # better, but by less than min_delta
    assert stopper.update(0.9, 2) is False  # exactly min_delta is not enough
    assert stopper.should_stop
    assert (stopper.best, stopper.best_epoch) == (1.0, 0)


def test_min_mode_counts_a_large_enough_drop_as_improvement():
    stopper = EarlyStopping("val/loss", mode="min", patience=2, min_delta=0.1)
    stopper.update(1.0, 0)
    assert stopper.update(0.85, 1) is True
    assert stopper.update(2.0, 2) is False  # a rise is never an improvement in min mode
    assert (stopper.best, stopper.best_epoch, stopper.epochs_without_improvement) == (0.85, 1, 1)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_nan_never_improves(mode):
    stopper = EarlyStopping("val/loss", mode=mode, patience=2)
    assert stopper.update(math.nan, 0) is False  # not even as the first value
    assert stopper.best is None
    assert stopper.update(1.0, 1) is True
    assert stopper.update(math.nan, 2) is False
    assert stopper.update(math.nan, 3) is False
    assert stopper.best == 1.0 and stopper.best_epoch == 1
    assert stopper.should_stop


def test_disabled_never_stops_but_still_tracks_the_best():
    stopper = EarlyStopping("val/acc", mode="max", patience=1, enabled=False)
    assert first_stop_epoch(stopper, [0.3, 0.9, 0.1, 0.1, 0.1, 0.1]) is None
    assert (stopper.best, stopper.best_epoch) == (0.9, 1)
    assert stopper.epochs_without_improvement == 4


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping("val/acc", mode="maximum")


def test_state_dict_round_trip_continues_the_count():
    original = EarlyStopping("val/acc", mode="max", patience=3)
    for epoch, value in enumerate([0.5, 0.7, 0.6]):
        original.update(value, epoch)
    resumed = EarlyStopping("val/acc", mode="max", patience=3)
    resumed.load_state_dict(original.state_dict())
    assert (
        resumed.state_dict() == original.state_dict() == {"best": 0.7, "best_epoch": 1, "epochs_without_improvement": 1}
    )
    for epoch, value in enumerate([0.65, 0.68], start=3):
        resumed.update(value, epoch)
    assert resumed.should_stop  # 1 (before the save) + 2 after it == patience


def test_state_dict_is_plain_python():
    stopper = EarlyStopping("val/acc")
    stopper.update(0.5, 0)
    state = stopper.state_dict()
    assert all(isinstance(v, (int, float, type(None))) for v in state.values())


def test_the_stop_line_says_one_epoch_in_the_singular():
    assert EarlyStopping("val/acc", "max", patience=1).stop_line() == (
        "early stopping: val/acc has not improved for 1 epoch"
    )
    assert EarlyStopping("val/loss", "min", patience=3).stop_line().endswith("for 3 epochs")
