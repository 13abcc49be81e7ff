"""model=hf (trainkit.models.hf): the head follows the task, the padding is masked, a saved folder loads offline,
the library's gradient checkpointing, what weight decay skips, the export's round trip (the blocks FSDP shards:
tests/unit/distributed/test_fsdp.py)."""

import warnings

import pytest
import torch
from omegaconf import OmegaConf

from helpers import config_check_tests
from trainkit.errors import ConfigError
from trainkit.models import export as export_module
from trainkit.models.export import export_model, load_exported
from trainkit.models.hf import HuggingFaceModel, create_hf_model
from trainkit.models.sequence import SequenceClassifier
from trainkit.optim import param_groups
from trainkit.tracking.run_report import training_line

CLASSIFICATION = "trainkit.tasks.classification.Classification"
LANGUAGE_MODEL = "trainkit.tasks.language_model.LanguageModel"
BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
GPT2 = {"model_type": "GPT2Config", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
        "bos_token_id": None, "eos_token_id": None}  # fmt: skip  # a class name works as well as a model_type


def classifier(**options) -> HuggingFaceModel:
    torch.manual_seed(0)
    return create_hf_model(CLASSIFICATION, num_labels=3, **{"config": BERT, **options})


def language_model(**options) -> HuggingFaceModel:
    torch.manual_seed(0)
    return create_hf_model(LANGUAGE_MODEL, num_labels=256, **{"config": GPT2, **options})


def test_the_head_follows_the_task_and_the_vocabulary_the_data():
    model = classifier().eval()
    assert type(model.model).__name__ == "BertForSequenceClassification"
    assert model.model.get_input_embeddings().num_embeddings == 257  # bytes + the padding id
    assert model(torch.randint(1, 257, (4, 10))).shape == (4, 3)  # logits, not a ModelOutput
    lm = language_model().eval()
    assert type(lm.model).__name__ == "GPT2LMHeadModel"
    assert lm(torch.randint(0, 256, (2, 10))).shape == (2, 10, 256)  # data.num_classes: the bytes
    assert lm.block_size == 64 and lm.pad_token_id is None  # sampling crops to its positions; no padding to mask
    with pytest.raises(ConfigError, match=r"^model.task: is tasks_for_tests.Regression, but model=hf"):
        create_hf_model("tasks_for_tests.Regression", num_labels=3, config=BERT)


def test_padding_changes_no_classifiers_logits():
    model = classifier(config={**BERT, "initializer_range": 1.0}).eval()  # large weights: the pads would show
    text = torch.randint(1, 257, (1, 7))
    padded = torch.cat([text, torch.zeros(1, 5, dtype=torch.long)], dim=1)  # 0 pads (trainkit.data.text.PAD_ID)
    empty = torch.zeros(1, 12, dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(model(padded), model(text), rtol=1e-5, atol=1e-6)
        assert model(empty).isfinite().all()  # a text with no token: finite logits, no NaN loss
        unmasked = HuggingFaceModel(model.model, None, causal=False)(padded)  # no mask: the pads are attended to
    assert (unmasked - model(text)).abs().max() > 1e-2


def test_a_saved_model_loads_from_its_folder_offline_and_a_new_head_replaces_one_of_another_size(tmp_path):
    saved = language_model()
    saved.model.save_pretrained(tmp_path / "lm")
    tokens = torch.randint(0, 256, (2, 9))
    loaded = create_hf_model(LANGUAGE_MODEL, num_labels=256, path=str(tmp_path / "lm")).eval()
    torch.testing.assert_close(loaded(tokens), saved.eval()(tokens))
    # A causal LM's folder fine-tuned as a classifier: its body's weights, a new head of the data's classes.
    as_classifier = create_hf_model(CLASSIFICATION, num_labels=5, path=str(tmp_path / "lm"), pad_token_id=0)
    body = as_classifier.model.transformer.h[0].mlp.c_fc.weight
    torch.testing.assert_close(body, saved.model.transformer.h[0].mlp.c_fc.weight)
    assert as_classifier.model.config.pad_token_id == 0 and as_classifier(tokens).shape == (2, 5)
    resized = create_hf_model(LANGUAGE_MODEL, num_labels=300, path=str(tmp_path / "lm"), vocab_size=300)
    assert resized.eval()(tokens).shape == (2, 9, 300)
    with pytest.raises(ConfigError, match=r"^model.path: '.*nowhere' does not exist; give a folder"):
        create_hf_model(LANGUAGE_MODEL, num_labels=256, path=str(tmp_path / "nowhere"))


def test_gradient_checkpointing_is_the_librarys_and_gives_the_same_gradients():
    tokens = torch.randint(1, 257, (4, 12))
    grads = []
    for checkpointing in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # transformers' deprecated name for it warns
            model = classifier(
                gradient_checkpointing=checkpointing,
                config={**BERT, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
            )
        checkpointed = getattr(model.model, "is_activation_checkpointing", None)  # transformers 5.x
        assert (model.model.is_gradient_checkpointing if checkpointed is None else checkpointed) is checkpointing
        model(tokens).sum().backward()
        grads.append(model.model.bert.encoder.layer[0].intermediate.dense.weight.grad)
    torch.testing.assert_close(grads[1], grads[0])


def test_weight_decay_spares_its_norms_biases_and_embeddings():
    model = classifier()
    decayed, undecayed = (group["params"] for group in param_groups(model, weight_decay=0.1)[:2])
    names = {id(param): name for name, param in model.named_parameters()}
    decayed_names, undecayed_names = {names[id(p)] for p in decayed}, {names[id(p)] for p in undecayed}
    assert decayed_names and all(name.endswith(".weight") and "LayerNorm" not in name for name in decayed_names)
    assert all("embeddings" not in name for name in decayed_names)
    assert {"model.bert.embeddings.LayerNorm.weight", "model.classifier.bias",
            "model.bert.embeddings.word_embeddings.weight"} <= undecayed_names  # fmt: skip
    assert "model.bert.encoder.layer.0.attention.self.query.weight" in decayed_names


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^model.config.model_type: transformers has no model type 'bret'; did you"):
        create_hf_model(CLASSIFICATION, num_labels=3, config={**BERT, "model_type": "bret"})
    with pytest.raises(ConfigError, match=r"^model.config: .*no AutoModelForCausalLM head"):
        create_hf_model(LANGUAGE_MODEL, num_labels=256, config={"model_type": "clip_vision_model"})


def test_an_export_loads_back_with_the_same_logits(tmp_path):
    from transformers import AutoModelForSequenceClassification

    model = classifier().eval()
    export_model(model, tmp_path / "hf", {}, ["a", "b", "c"])
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    tokens = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    with torch.no_grad():
        logits = loaded(input_ids=tokens, attention_mask=(tokens != loaded.config.pad_token_id).long()).logits
    torch.testing.assert_close(logits, model(tokens))
    assert loaded.config.id2label == {0: "a", 1: "b", 2: "c"}
    with pytest.raises(ConfigError, match=r"^export: '.*hf' is not empty; give a new folder"):
        export_model(model, tmp_path / "hf", {}, [])
    # Our own models: safetensors + the config that rebuilds them.
    config = {"_target_": "trainkit.models.sequence.SequenceClassifier", "vocabulary": 257, "num_classes": 3,
              "max_length": 16, "width": 16, "depth": 1, "heads": 2, "feedforward": 32}  # fmt: skip
    ours = SequenceClassifier(**{key: value for key, value in config.items() if key != "_target_"}).eval()
    export_model(ours, tmp_path / "ours", config, [])
    torch.testing.assert_close(load_exported(tmp_path / "ours").eval()(tokens), ours(tokens))


def test_regularization_dropout_is_the_heads_and_config_overrides_set_the_librarys_keys(tmp_path):
    """A saved BERT's hidden_dropout_prob 0.1 trained on under regularization=none before: now the head's dropout
    is regularization.dropout, model.config_overrides sets the body's, the note names them and the export keeps
    them; a misspelt key and a head without dropout are one line each."""
    from transformers import AutoConfig

    classifier().model.save_pretrained(tmp_path / "bert")  # BertConfig's defaults: hidden and attention dropout 0.1
    model = create_hf_model(CLASSIFICATION, num_labels=3, path=str(tmp_path / "bert"), dropout=0.0)
    assert model.model.dropout.p == 0.0 and model.model.bert.embeddings.dropout.p == 0.1  # the head's; the body's
    overrides = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.05}
    for source in ({"path": str(tmp_path / "bert")}, {"config": BERT}):
        model = create_hf_model(CLASSIFICATION, num_labels=3, dropout=0.2, config_overrides=overrides, **source)
        assert model.model.dropout.p == 0.2 and model.model.bert.embeddings.dropout.p == 0.0
        assert model.dropout_note == (
            "dropout hidden_dropout_prob 0, attention_probs_dropout_prob 0.05, classifier_dropout 0.2"
        )
    trainer = OmegaConf.create({"max_epochs": 1, "max_steps": None})
    line = training_line(torch.nn.ModuleDict({"wrapped": model}), trainer, 5, "cpu", "run")  # under DDP, say
    assert (
        " parameters (dropout hidden_dropout_prob 0, attention_probs_dropout_prob 0.05, classifier_dropout 0.2) "
        in line
    )
    export_model(model, tmp_path / "export", {}, ["a", "b", "c"])
    exported = AutoConfig.from_pretrained(tmp_path / "export", local_files_only=True)
    assert (exported.hidden_dropout_prob, exported.attention_probs_dropout_prob, exported.classifier_dropout) == (
        0.0, 0.05, 0.2,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"^model.config_overrides.hidden_dropout: is not a key of BertConfig; did "
                       r"you mean hidden_dropout_prob"):  # fmt: skip
        classifier(config_overrides={"hidden_dropout": 0.0})
    with pytest.raises(ConfigError, match=r"^regularization.dropout: is 0.3, the classifier head's dropout, but "
                       r"transformers' GPT2Config has no head dropout for a language model; .*resid"):  # fmt: skip
        language_model(dropout=0.3)


def test_a_model_folder_is_checked_for_positions_and_the_datas_ids_and_a_missing_one_is_named(tmp_path, monkeypatch):
    from trainkit.models.hf import _config_problems

    classifier().model.save_pretrained(tmp_path / "bert")  # 64 positions, 257 ids
    folder = str(tmp_path / "bert")
    problems = dict(_config_problems(CLASSIFICATION, folder, None, None, {"max_length": 128}))
    assert problems["data.max_length"].startswith(
        f"is 128, but the model in '{folder}' has 64 positions (max_position_embeddings in its config.json)"
    )
    assert not list(_config_problems(CLASSIFICATION, folder, None, None, {"max_length": 64}))
    with pytest.raises(ConfigError, match=r"^model.vocab_size: is null: the model embeds 257 ids, but the data's "
                       r"tokenizer gives ids up to 299 \(data.vocabulary=300\); set model.vocab_size=300"):  # fmt: skip
        create_hf_model(CLASSIFICATION, num_labels=3, path=folder, data_vocabulary=300)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path, message in (
        (tmp_path / "nowhere", f"'{tmp_path / 'nowhere'}' does not exist; give a folder a model was saved to"),
        ("bert-base-uncased", "'bert-base-uncased' is no folder here, and model=hf downloads nothing (and "
         "HF_HUB_OFFLINE=1 is set): a hub name needs the network"),
        (tmp_path, f"'{tmp_path}' holds no config.json; give a folder"),
    ):  # fmt: skip
        assert dict(_config_problems(CLASSIFICATION, str(path), None, None, {}))["model.path"].startswith(message)


@pytest.mark.parametrize(("offset", "said"), [(1, "byte b is id b + 1, 0 pads"), (0, "byte b is id b, no padding")])
def test_byte_data_exports_a_tokenizer_of_the_ids_the_run_trained_on(tmp_path, offset, said):
    """The classifiers' bytes are b + 1 (0 pads), a language model's data=text bytes are themselves: the exported
    tokenizer encodes a text to those ids (a literal "<pad>" too) and says which it is."""
    from transformers import AutoTokenizer

    from trainkit.data.text import BYTE_TOKENS
    from trainkit.data.text_blocks import TextBlocks
    from trainkit.data.tokenizing import ByteTokens
    from trainkit.models.export import export_tokenizer

    assert TextBlocks.byte_offset == 0 and BYTE_TOKENS.offset == 1  # what the data options train on
    assert export_tokenizer("bytes", None, tmp_path / "export", offset) == f"bytes: {said}"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export", local_files_only=True)
    text = "the <pad> café\n\x00"
    assert tokenizer(text)["input_ids"] == ByteTokens(offset).encode(text.encode()).tolist()
    assert tokenizer.pad_token_id == (0 if offset else None) and tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_an_export_to_a_file_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ConfigError, match=r"^export: '.*taken' is a file; give a new folder \(nothing is overwritten"):
        export_model(classifier(), tmp_path / "taken", {}, [])
    assert (tmp_path / "taken").read_text() == "x"


# eval.py's export= (conf/eval.yaml's key, checked by trainkit.models.export as its _checks_ names), added to
# train.py's config here.
EXPORT_CHECKS = "+_checks_={export: trainkit.models.export}"
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    export_module, [(["+export=42", EXPORT_CHECKS], "export")], []
)
