"""The reference forward pass and the paged runner against transformers' own modeling
code, on the same random weights. Runs only where torch and transformers are installed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ferrolm.model.random_weights import random_weights
from ferrolm.model.reference import reference_logits
from ferrolm.model.runner import ForwardBatch, NumpyRunner
from small_models import SMALL_MODEL_OVERRIDES, small_config

torch: Any = pytest.importorskip("torch", reason="torch is not installed; the comparison with transformers is skipped")
transformers: Any = pytest.importorskip(
    "transformers", reason="transformers is not installed; the comparison with it is skipped"
)

# transformers versions deprecate config spellings now and then; that is not what this checks
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")


def hf_model(variant: str, seed: int) -> tuple[Any, Any, Any]:
    config = small_config(variant)
    weights = random_weights(config, seed=seed)
    raw = config.to_hf_dict()
    raw.pop("torch_dtype")
    model_type = raw.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **raw)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
    state = {name: torch.from_numpy(np.array(value)) for name, value in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # a tied model may not list lm_head.weight as its own parameter
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return config, weights, model.eval()


@pytest.mark.parametrize("variant", sorted(SMALL_MODEL_OVERRIDES))
def test_reference_and_runner_match_transformers(variant: str) -> None:
    config, weights, model = hf_model(variant, seed=11)
    ids = [int(i) for i in np.random.default_rng(12).integers(0, config.vocab_size, 21)]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].double().numpy()
    tolerance = 2e-5 * max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(reference_logits(config, weights, ids), expected, rtol=0, atol=tolerance)
    runner = NumpyRunner(config, weights, num_slots=32)
    # over two calls, so the second reads the first's keys and values from the pool
    first = runner.forward(ForwardBatch.from_requests([ids[:13]], [list(range(13))]), all_logits=True)
    second = runner.forward(ForwardBatch.from_requests([ids[13:]], [list(range(21))]), all_logits=True)
    np.testing.assert_allclose(np.concatenate([first, second]), expected, rtol=0, atol=tolerance)
