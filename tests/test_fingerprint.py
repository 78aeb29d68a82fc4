"""`pyrodash.train.fingerprint`: `datasets` fingerprints a fast tokenizer from its serialized form. The same tokenizer
(loaded twice) hashes the same; a change to its vocabulary, chat template or special tokens changes the hash; the hash
is what TRL's dataset preparation computes through (so SFT set-up does not pickle a real model's tokenizer object by
object). Reverting the registration (or registering nothing) fails the test that counts calls into it."""

from __future__ import annotations

import datasets
import pytest
from datasets.fingerprint import Hasher
from tiny_models import tiny_tokenizer

import pyrodash.train.fingerprint as fingerprint
from pyrodash.train.fingerprint import register_tokenizer_fingerprint


def test_the_same_tokenizer_hashes_the_same_and_a_changed_one_differently(tmp_path):
    from transformers import AutoTokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    tok, again = (AutoTokenizer.from_pretrained(tmp_path / "tok") for _ in range(2))
    assert register_tokenizer_fingerprint(tok) and register_tokenizer_fingerprint(again)
    assert Hasher.hash(tok) == Hasher.hash(again)
    other_template = AutoTokenizer.from_pretrained(tmp_path / "tok")
    other_template.chat_template = "{{ messages[0]['content'] }}"
    more_tokens = AutoTokenizer.from_pretrained(tmp_path / "tok")
    more_tokens.add_tokens(["<extra>"], special_tokens=True)
    other_pad = AutoTokenizer.from_pretrained(tmp_path / "tok")
    other_pad.pad_token = other_pad.eos_token
    hashes = {Hasher.hash(t) for t in (tok, other_template, more_tokens, other_pad)}
    assert len(hashes) == 4


def test_a_dataset_map_hashes_the_tokenizer_through_its_serialized_form(monkeypatch):
    tok = tiny_tokenizer()
    register_tokenizer_fingerprint(tok)
    calls = []
    real = fingerprint.tokenizer_state
    monkeypatch.setattr(fingerprint, "tokenizer_state", lambda t: calls.append(t) or real(t))
    ds = datasets.Dataset.from_list([{"text": "12: +3x1 f1"}, {"text": "7: +1x2 f2"}])

    def tokenize(row, processing_class):
        return {"ids": processing_class(row["text"])["input_ids"]}

    a = ds.map(tokenize, fn_kwargs={"processing_class": tok})
    b = ds.map(tokenize, fn_kwargs={"processing_class": tok})
    assert calls and all(t is tok for t in calls)  # the map's fingerprint went through `tokenizer_state`
    assert a._fingerprint == b._fingerprint and a["ids"] == b["ids"]


def test_a_tokenizer_without_a_fast_backend_is_left_to_datasets():
    class Slow:
        backend_tokenizer = None

    assert register_tokenizer_fingerprint(Slow()) is False
    assert register_tokenizer_fingerprint(None) is False


def test_the_fingerprint_is_not_a_tokenizer():
    with pytest.raises(TypeError, match="cannot be unpickled"):
        fingerprint._not_a_tokenizer("{}")
