"""Saving tokenizers so that every supported ``transformers`` version loads them the same way.

The directory ``save_pretrained`` writes under transformers 5 is read differently, or not at all, by transformers 4
(checked by tests/test_transformers_compat.py against the oldest version we support, see README):

- ``"tokenizer_class": "TokenizersBackend"`` does not exist in 4.x ("Tokenizer class TokenizersBackend does not
  exist"). ``PreTrainedTokenizerFast`` names the same thing in both (in 5 it is an alias), so saved directories say
  that. Model-specific classes (``LlamaTokenizer`` ...) are not used either: in transformers 5 they rebuild their
  pipeline from vocab and merges and would drop tokenizer.json's normalizer and model flags.
- 5.x lists extra special tokens as ``"extra_special_tokens": [...]``; 4.x reads that key as a dict of *named* extra
  tokens and fails on a list (4.57: "'list' object has no attribute 'keys'") or ignores it (4.45), losing the
  tokens' special role. ``additional_special_tokens`` is read as that list by 4.x and converted by 5.x.
- the chat template lives in ``chat_template.jinja``, which transformers < 4.47 never reads; a copy in the config
  (``"chat_template"``) serves those, while newer versions let the .jinja file take priority.
- without ``model_input_names`` in the config, 4.x's generic class returns ``token_type_ids`` too, and the usual
  ``model.generate(**tokenizer(text, return_tensors="pt"))`` fails ("The following `model_kwargs` are not used by the
  model: ['token_type_ids']"); the config names a causal LM's inputs (ids and mask), as 5.x returns them.
- 5.x leaves load-time arguments (``is_local``, ``local_files_only``) in the config; they are not settings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

PORTABLE_CLASS = "PreTrainedTokenizerFast"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# named templates: additional_chat_templates/NAME.jinja (read by transformers >= 4.52; < 4.47 read the config's list;
# 4.47-4.51 only chat_template.jinja, so they see the default template alone)
MORE_CHAT_TEMPLATES = "additional_chat_templates"
CAUSAL_LM_INPUTS = ("input_ids", "attention_mask")
_NOT_SETTINGS = ("auto_map", "vocab_file", "merges_file", "tokenizer_file", "is_local", "local_files_only")


# how the tokenizers library reports a failed write: a bare Exception, "No space left on device (os error 28)"
_RUST_OS_ERROR = re.compile(r"^(.*) \(os error (\d+)\)$")


def save_portable(tokenizer: Any, folder: str | Path) -> None:
    """``tokenizer.save_pretrained(folder)``, then make its config readable by every supported version."""
    folder = Path(folder)
    try:
        tokenizer.save_pretrained(folder)
    except Exception as exc:  # noqa: BLE001  (the Rust library's I/O errors: made the OSError they are)
        match = _RUST_OS_ERROR.match(str(exc))
        if type(exc) is not Exception or match is None:
            raise
        raise OSError(int(match.group(2)), match.group(1), str(folder / "tokenizer.json")) from None
    make_portable(folder)


def make_portable(folder: str | Path) -> None:
    """Rewrite a saved tokenizer's config so transformers 4.x and 5.x load the same tokenizer (see module doc)."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["tokenizer_class"] = PORTABLE_CLASS
    # not tokenizer.model_input_names: under 4.x the generic class's own list has token_type_ids
    config.setdefault("model_input_names", list(CAUSAL_LM_INPUTS))
    for key in _NOT_SETTINGS:  # files we do not ship, arguments of the load that wrote this
        config.pop(key, None)
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):  # the 5.x spelling; a dict is 4.x's named extra tokens, which both read
        listed = config.pop("additional_special_tokens", None) or []
        config.pop("extra_special_tokens")
        config["additional_special_tokens"] = list(dict.fromkeys([*listed, *extra]))
    templates = chat_templates(folder)
    if templates:
        default = templates.pop("default", None)
        if templates:
            named = [{"name": "default", "template": default}] if default is not None else []
            config["chat_template"] = named + [{"name": k, "template": v} for k, v in sorted(templates.items())]
        else:
            config["chat_template"] = default
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def chat_templates(folder: Path) -> dict[str, str]:
    """The chat templates saved as files in ``folder``: ``default`` (chat_template.jinja) and named ones."""
    found = {}
    if (folder / CHAT_TEMPLATE_FILE).is_file():
        found["default"] = (folder / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (folder / MORE_CHAT_TEMPLATES).is_dir():
        for file in sorted((folder / MORE_CHAT_TEMPLATES).glob("*.jinja")):
            found[file.stem] = file.read_text(encoding="utf-8")
    return found
