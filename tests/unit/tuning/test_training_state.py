"""preserved_training_state: after any number of real steps, and after an error inside, the model,
its gradients and modes, the optimizer, scheduler and GradScaler, and every RNG are as before."""

import random

import numpy as np
import pytest
import torch
from torch import nn

from trainkit.tuning.training_state import preserved_training_state


def test_everything_is_put_back_even_after_an_error():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    model(torch.randn(16, 4)).sum().backward()
    optimizer.step()  # momentum buffers exist
    scheduler.step()
    model.eval()
    model[2].train()  # a mixed mode, to be kept as it is
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    optimizer_state, scheduler_state = repr(optimizer.state_dict()), scheduler.state_dict()
    scaler.scale(torch.ones(()))  # the scale tensor exists
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)

    with pytest.raises(RuntimeError, match="boom"), preserved_training_state(model, optimizer, scheduler, scaler):
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(16, 4)).sum().backward()
            optimizer.step()
            scheduler.step()
        scaler.update(1.0)
        random.random(), np.random.rand()
        raise RuntimeError("boom")

    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # BatchNorm statistics too
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert [m.training for m in model.modules()] == [False, False, False, True, False]
    assert repr(optimizer.state_dict()) == optimizer_state and scheduler.state_dict() == scheduler_state
    assert scaler.get_scale() == 8.0
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
