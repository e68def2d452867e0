"""`elmo info`: what the default model is (facts checked against its model card and results), and
`elmo info --list`: every name from_pretrained takes."""

import json
import re

import pytest

from conftest import ROOT
from torchelmo import BiLM
from torchelmo.cli import main
from torchelmo.commands.info import DEFAULT_MODEL_FACTS, default_model_line
from torchelmo.model.registry import ALIASES, REGISTRY


def _card():
    return (ROOT / "src" / "torchelmo" / "default_model" / "MODEL_CARD.md").read_text(encoding="utf-8")


def test_default_model_facts_match_the_model_card_and_results():
    # Training shards: the rows of the card's data table, the validation shard excepted.
    rows = re.findall(r"^\| (\w+) \| ([\d,]+) \| ([\d,]+) \|", _card(), re.M)
    train = [int(tokens.replace(",", "")) for name, _, tokens in rows if name != "valid"]
    assert len(train) == 4 and DEFAULT_MODEL_FACTS["training_tokens"] == sum(train)
    ppl = json.loads((ROOT / "results" / "default_model.json").read_text())["ppl_mean"]
    assert DEFAULT_MODEL_FACTS["valid_ppl"] == round(ppl, 1)
    params = sum(p.numel() for p in BiLM.from_pretrained("default").parameters())
    assert f"{params:,}" in _card()


def test_info_states_the_default_model_in_one_line(capsys):
    assert main(["info"]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    params = sum(p.numel() for p in BiLM.from_pretrained("default").parameters())
    assert first == default_model_line(params)
    for fact in ("4.0M parameters", "0.92M tokens", "MASC", "perplexity 178.8", "published model"):
        assert fact in first
    assert json.loads("\n".join(rest))["parameters"] == params
    assert json.loads("\n".join(rest))["backend"].startswith("backend auto: ")
    # The README says the same, in the same words.
    assert first in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()


@pytest.mark.core
def test_info_list_names_default_aliases_and_published(capsys):
    assert main(["info", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("default: ")
    for name in REGISTRY:
        assert f"\n{name}" in out and REGISTRY[name]["weights"] in out
    for alias, name in ALIASES.items():
        assert f"{name} (alias: {alias})" in out
