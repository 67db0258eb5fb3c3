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
    monkeypatch.setattr(torch_runner_module, "_import_torch", lambda: None)
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


def test_importing_ferrolm_does_not_import_torch() -> None:
    # torch takes a second or more to import: only a torch runner (or auto's CUDA check) loads it
    import os
    import subprocess
    import sys

    code = "import sys, ferrolm, ferrolm.engine, ferrolm.model.runner_choice; print('torch' in sys.modules)"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"
    if not torch_runner_module.cuda_driver_present():
        # and --runner auto without a CUDA driver picks numpy without importing torch either
        code = "import sys; from ferrolm.model.runner_choice import resolve_runner_kind as r; print(r(), 'torch' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        assert out.stdout.strip() == "numpy False"


def test_the_server_flags_offer_what_the_runner_choice_takes() -> None:
    from ferrolm.model import runner_choice, torch_runner
    from ferrolm.server import args

    assert args.RUNNERS == runner_choice.RUNNERS
    assert args.QUANTIZATIONS == runner_choice.QUANTIZATIONS
    assert args.DEVICES == torch_runner.DEVICES
    assert args.DTYPES == torch_runner.DTYPES


def test_serve_flags_reach_the_server_args() -> None:
    import argparse

    from ferrolm.server.args import add_serve_arguments, server_args_from

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    defaults = server_args_from(parser.parse_args([]), {})
    assert (defaults.runner, defaults.device, defaults.dtype) == ("auto", "auto", "auto")
    chosen = server_args_from(parser.parse_args(["--runner", "torch", "--device", "cpu", "--dtype", "bfloat16"]), {})
    assert (chosen.runner, chosen.device, chosen.dtype) == ("torch", "cpu", "bfloat16")
    assert chosen.public_dict()["runner"] == "torch"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "tpu"])


def test_serve_refuses_a_runner_it_cannot_build(capsys: pytest.CaptureFixture) -> None:
    from ferrolm.cli import main

    # refused while the model loads, before the front end serves: the port goes free again
    assert main(["serve", "--runner", "numpy", "--device", "cuda", "--port", "0"]) == 2
    assert "the numpy runner runs on the CPU only" in capsys.readouterr().err


def test_generate_refuses_a_runner_it_cannot_build(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from ferrolm.cli import main

    assert main(["generate", "--runner", "numpy", "--dtype", "float16", "--prompt", "x"]) == 2
    assert "the numpy runner computes in float32 only" in capsys.readouterr().err
    monkeypatch.setattr(torch_runner_module, "torch", None)
    monkeypatch.setattr(torch_runner_module, "_import_torch", lambda: None)
    assert main(["generate", "--runner", "torch", "--prompt", "x"]) == 2
    assert "torch is not installed: pip install 'ferrolm[torch]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "plain"),
    [
        ({}, True),
        ({"ignore_eos": True, "stop": ["x"], "stop_token_ids": [3], "max_new_tokens": 5, "seed": 1}, True),
        ({"temperature": 1.0, "top_k": 1}, True),  # top_k 1 is greedy at any temperature
        ({"temperature": 0.7}, False),
        ({"logit_bias": {5: 1.0}}, False),
        ({"repetition_penalty": 1.1}, False),
        ({"frequency_penalty": 0.5}, False),
        ({"presence_penalty": 0.5}, False),
        ({"min_new_tokens": 2}, False),
        ({"logprobs": True}, False),
        ({"top_logprobs": 2}, False),
        ({"allowed_token_ids": [1, 2]}, False),
        ({"regex": "a+"}, False),
    ],
)
def test_plain_greedy_is_what_the_core_would_pick_as_a_bare_argmax(change: dict, plain: bool) -> None:
    """The core's rule, as its plan carries it per entry for the runner."""
    from ferrolm.engine import Engine
    from ferrolm.sampling_params import SamplingParams

    engine = Engine("tiny", kv_capacity=256, runner="numpy")
    params = SamplingParams(**({"temperature": 0.0} | change))
    engine.submit("hello", params)
    plan = engine.core.schedule()
    assert plan.plain_greedy.tolist() == [plain] and plan.all_plain_greedy is plain
    assert plan.ignore_eos.tolist() == [params.ignore_eos]


def test_the_numpy_runner_never_takes_the_device_greedy_path() -> None:
    from ferrolm.engine import Engine
    from ferrolm.sampling_params import SamplingParams

    engine = Engine("tiny", kv_capacity=256, runner="numpy")
    assert not engine.device_greedy
    engine.generate("hello", SamplingParams(temperature=0.0, max_new_tokens=3))
    assert engine.device_greedy_steps == 0


def test_mem_fraction_static_flag_excludes_max_total_tokens() -> None:
    import argparse

    from ferrolm.server.args import add_serve_arguments, server_args_from

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert server_args_from(parser.parse_args([]), {}).max_total_tokens == 32_768
    chosen = server_args_from(parser.parse_args(["--mem-fraction-static", "0.85"]), {})
    assert chosen.mem_fraction_static == 0.85 and chosen.max_total_tokens == 32_768
    assert server_args_from(parser.parse_args(["--max-total-tokens", "100"]), {}).max_total_tokens == 100
    with pytest.raises(SystemExit):
        server_args_from(parser.parse_args(["--max-total-tokens", "100", "--mem-fraction-static", "0.8"]), {})


def test_mem_fraction_static_with_the_numpy_runner_is_refused() -> None:
    from ferrolm.engine import Engine

    with pytest.raises(InvalidInputError, match="sizes a CUDA pool") as e:
        Engine("tiny", runner="numpy", mem_fraction_static=0.8)
    assert e.value.field == "mem_fraction_static"


def test_kv_cache_dtype_reaches_the_numpy_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    from ferrolm.engine import Engine
    from ferrolm.model import runner_choice
    from ferrolm.server import args

    assert args.KV_CACHE_DTYPES == runner_choice.KV_CACHE_DTYPES
    monkeypatch.delenv("FERROLM_KV_CACHE_DTYPE", raising=False)
    # auto: float16, the bytes the core's attention kernel reads per decode step halved
    assert Engine("tiny", kv_capacity=64, runner="numpy").runner.k_pool[0].dtype == np.float16
    exact = Engine("tiny", kv_capacity=64, runner="numpy", kv_cache_dtype="float32")
    assert exact.runner.k_pool[0].dtype == np.float32 and exact.runner.v_pool[-1].dtype == np.float32
    monkeypatch.setenv("FERROLM_KV_CACHE_DTYPE", "bfloat16")
    assert Engine("tiny", kv_capacity=64, runner="numpy").runner.k_pool[0].dtype.name == "bfloat16"
    with pytest.raises(InvalidInputError) as e:
        Engine("tiny", kv_capacity=64, runner="numpy", kv_cache_dtype="int8")
    assert e.value.field == "kv_cache_dtype"


def test_kv_cache_dtype_flag_reaches_the_server_args() -> None:
    import argparse

    from ferrolm.server.args import add_serve_arguments, server_args_from

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert server_args_from(parser.parse_args([]), {}).kv_cache_dtype == "auto"
    assert server_args_from(parser.parse_args(["--kv-cache-dtype", "float32"]), {}).kv_cache_dtype == "float32"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])


def test_greedy_output_is_the_same_with_a_float16_pool_and_a_float32_one() -> None:
    from ferrolm.engine import Engine
    from ferrolm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    prompts = ["The radix tree", "Once upon a time, in a land far away", "1 2 3"]
    half = Engine("tiny", kv_capacity=512, runner="numpy", kv_cache_dtype="float16").generate(prompts, params)
    full = Engine("tiny", kv_capacity=512, runner="numpy", kv_cache_dtype="float32").generate(prompts, params)
    # the tiny model's logits are far apart at its argmax; float16 keys and values (about
    # three decimal digits) do not move it over 16 tokens
    assert [r.token_ids for r in half] == [r.token_ids for r in full]
