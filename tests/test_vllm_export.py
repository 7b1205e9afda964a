"""The shipped draft exported with the target's full vocabulary (for vLLM's draft_model and
transformers' assistant_model): same proposals as the reduced draft, outside tokens never first."""

from __future__ import annotations

import json

import pytest
import torch

from playground.backends.vllm import export_draft as X
from playground.engine.draft_model import TokenMap
from playground.engine.models import DEFAULT_DRAFT_DIR


@pytest.fixture(scope="module")
def exported():
    """The export in the playground cache (written on first use: about 30 s on a 2-core CPU)."""
    return X.export_full_vocab(DEFAULT_DRAFT_DIR)


def test_export_is_a_full_vocabulary_llama(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is False
    assert (exported / "tokenizer.json").is_file()
    assert X.default_export_dir(DEFAULT_DRAFT_DIR) == exported  # keyed by the draft's own files


def test_export_proposes_what_the_reduced_draft_proposes(exported):
    """On held-out text the export's argmax equals the reduced draft's mapped argmax at every
    position, its logits over the draft's own tokens are the draft's, and no outside token led."""
    check = json.loads((exported / X.EXPORT_INFO_FILE).read_text())["check"]
    assert check["positions"] >= 1000 and check["greedy_equal"] == check["positions"]
    assert check["max_logit_diff"] < 1e-3 and check["worst_outside_gap"] < 0


def test_outside_row_never_beats_the_best_inside_logit(exported):
    """Property of the construction, for any final hidden state (2,000 random ones, seeded): the
    shared row of the outside tokens is a mean of inside rows, so its logit is at most the largest
    inside logit."""
    from safetensors.torch import load_file

    head = load_file(str(exported / "model.safetensors"))["lm_head.weight"]  # (49152, hidden)
    tm = TokenMap.load(DEFAULT_DRAFT_DIR, 49152)
    inside = torch.zeros(49152, dtype=torch.bool)
    inside[tm.to_target[tm.to_target >= 0]] = True
    h = torch.randn(2_000, head.shape[1], generator=torch.Generator().manual_seed(0)) * 5
    logits = h @ head.T
    assert (logits[:, ~inside].max(1).values <= logits[:, inside].max(1).values + 1e-4).all()


def test_a_draft_without_a_token_map_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(X.ExportError, match="already has the target's vocabulary"):
        X.export_full_vocab(tmp_path, tmp_path / "out")
