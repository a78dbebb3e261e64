"""model.output: the logits of a forward that returns a dict, a tuple or a ModelOutput, with FQNs unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from torch import nn

from qsync_opt.errors import ModelError
from qsync_opt.models import trace
from qsync_opt.models.output_select import select_output


class DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.body(x)
        return {"hidden": h, "logits": self.head(h)}


class TupleNet(DictNet):
    def forward(self, x):
        h = self.body(x)
        return h, self.head(h)


@pytest.mark.parametrize("net, key", [(DictNet, "logits"), (TupleNet, 1), (DictNet, 1)], ids=["key", "index", "dict-index"])
def test_selected_output_is_the_logits_and_nothing_else_changes(net, key):
    torch.manual_seed(0)
    plain = net()
    x = torch.randn(2, 4)
    want = plain(x)[key] if not isinstance(key, int) or isinstance(plain(x), tuple) else list(plain(x).values())[key]
    names = [n for n, _ in plain.named_modules()]
    params = list(plain.parameters())
    m = select_output(plain, key)
    assert m is plain and isinstance(m, net) and type(m).__name__ == net.__name__
    assert torch.equal(m(x), want)
    assert [n for n, _ in m.named_modules()] == names and all(a is b for a, b in zip(m.parameters(), params))
    assert torch.equal(copy.deepcopy(m)(x), want)  # the copies the indicator and the ranks make select too
    g = trace(m, x)
    assert [n.name for n in g.selectable] == ["body", "head"]


def test_selecting_again_replaces_the_key():
    m = select_output(select_output(DictNet(), "hidden"), "logits")
    assert m(torch.randn(1, 4)).shape == (1, 3) and type(m).__mro__[1] is DictNet


def test_a_wrong_key_names_what_the_model_returns():
    with pytest.raises(ModelError, match=r"model\.output: 'logit' is not in what 'DictNet' returns \(dict with keys 'hidden', 'logits'\)"):
        select_output(DictNet(), "logit")(torch.randn(1, 4))
    with pytest.raises(ModelError, match=r"model\.output: 5 is not in what 'TupleNet' returns \(tuple with 2 elements\)"):
        select_output(TupleNet(), 5)(torch.randn(1, 4))


def test_cli_names_model_output_when_a_transformers_model_returns_a_model_output(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("transformers")
    (tmp_path / "hfout.py").write_text(
        "import transformers as T\n"
        "def bert(vocab_size=50):\n"
        "    return T.BertForSequenceClassification(T.BertConfig(vocab_size=vocab_size, hidden_size=16,\n"
        "        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=16))\n")
    spec = {"cluster": {"groups": [{"name": "a", "device": "cpu-local"}], "interconnect": "loopback"},
            "model": {"import": "hfout:bert", "input_shape": [8], "input_dtype": "int64", "kwargs": {"vocab_size": 50}},
            "training": {"global_batch": 4}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    r = subprocess.run([sys.executable, "-m", "qsync_opt.cli", "solve", str(tmp_path / "s.yaml")],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 2, r.stderr
    assert "returns a SequenceClassifierOutput" in r.stderr and "model.output: logits" in r.stderr
    assert "Traceback" not in r.stderr
