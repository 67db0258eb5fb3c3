"""Choosing a runner (``--runner``/``--device``/``--dtype``) and the torch runner's
errors where torch is absent: these run whether torch is installed or not."""

from __future__ import annotations

import pytest

from ferrolm.errors import InvalidInputError
from ferrolm.model import torch_runner as torch_runner_module
from ferrolm.model.random_weights import random_weights
from ferrolm.model.runner_choice import resolve_runner_kind
from ferrolm.model.torch_runner import TorchRunner
from small_models import small_config


def test_without_torch_the_torch_runner_is_refused_with_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # runs with or without torch: the module behaves as if torch were absent
    monkeypatch.setattr(torch_runner_module, "torch", None)
    config = small_config("llama3")
    with pytest.raises(InvalidInputError, match=r"torch is not installed: pip install 'ferrolm\[torch\]'"):
        TorchRunner(config, random_weights(config, seed=0), 8, device="cpu")
    with pytest.raises(InvalidInputError, match="torch is not installed"):
        resolve_runner_kind("torch")
    with pytest.raises(InvalidInputError, match="torch is not installed"):
        resolve_runner_kind("auto", "cuda")
    # auto on a machine without torch (so without CUDA for it) is the numpy runner
    assert resolve_runner_kind("auto") == "numpy"


def test_numpy_runner_refuses_what_it_cannot_do() -> None:
    with pytest.raises(InvalidInputError, match="CPU only") as cuda:
        resolve_runner_kind("numpy", "cuda")
    assert cuda.value.field == "device"
    with pytest.raises(InvalidInputError, match="float32 only") as half:
        resolve_runner_kind("numpy", "cpu", "bfloat16")
    assert half.value.field == "dtype"
    for bad, field in ((("gpu",), "runner"), (("auto", "tpu"), "device"), (("auto", "cpu", "int8"), "dtype")):
        with pytest.raises(InvalidInputError) as e:
            resolve_runner_kind(*bad)
        assert e.value.field == field
