"""RNG snapshots: every stream (Python, NumPy, torch) continues exactly after a restore, through a
weights_only checkpoint too, and checkpoints written before trainkit.checkpointing.rng existed still load."""

import io
import random

import numpy as np
import torch

from trainkit.checkpointing.rng import restore_rng_states, rng_states


def draw() -> tuple:
    return (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        float(np.random.standard_normal()),
        torch.rand(3).tolist(),
        torch.randn(2).tolist(),
    )


def put_generators_mid_stream():
    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    # An odd number of normals leaves a cached Gaussian in Python and NumPy: that must come back too.
    random.gauss(0, 1)
    np.random.standard_normal()
    torch.rand(7)


def assert_restores_through_a_weights_only_load(state: dict) -> None:
    """`state`, saved with torch.save and loaded with weights_only=True after every generator was
    reseeded, puts the generators back where `draw()` continues as it would have."""
    buffer = io.BytesIO()
    torch.save({"rng": state}, buffer)
    expected = draw()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    buffer.seek(0)
    restore_rng_states(torch.load(buffer, weights_only=True)["rng"])
    assert draw() == expected


def test_restore_rng_states_reproduces_python_numpy_and_torch_draws():
    put_generators_mid_stream()
    state = rng_states()
    expected = draw()
    draw()  # move every stream on
    restore_rng_states(state)
    assert draw() == expected


def test_rng_states_survive_torch_save_and_weights_only_load():
    put_generators_mid_stream()
    assert_restores_through_a_weights_only_load(rng_states())


def test_the_checkpoint_layout_stays_the_one_old_checkpoints_have():
    # Written out by hand as checkpoint.rng_states built it before trainkit.checkpointing.rng: a resume from an
    # old last.pt must restore every stream.
    put_generators_mid_stream()
    version, words, gauss = random.getstate()
    numpy_state = np.random.get_state()
    old = {
        "python": [*words, gauss],
        "python_version": version,
        "numpy": numpy_state[1].tolist() + list(numpy_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    new = rng_states()
    assert new.keys() == old.keys() and torch.equal(new["torch"], old["torch"])
    assert all(new[key] == old[key] for key in ("python", "python_version", "numpy"))
    assert_restores_through_a_weights_only_load(old)
