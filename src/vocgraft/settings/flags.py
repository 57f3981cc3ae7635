"""argparse arguments from declarations: a stage's flags are its settings, spelled, typed and defaulted as declared."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from vocgraft.settings.setting import Setting


def add_setting(
    target: Any, setting: Setting, *, default: Any = None, use_default: bool = False, suffix: str = ""
) -> argparse.Action | None:
    """One flag; ``default``/``use_default``: a command's own default (vocadt's papers values, a sweep's None)."""
    flag = setting.cli_flag
    if flag is None:
        return None
    value = default if use_default else setting.default
    kwargs: dict[str, Any] = {"dest": setting.name, "default": value}
    help_text = setting.help_text() + suffix
    if help_text:
        kwargs["help"] = help_text
    if setting.type is bool:
        kwargs["action"] = "store_true" if not value else argparse.BooleanOptionalAction
    else:
        if setting.action:
            kwargs["action"] = setting.action
        else:
            kwargs["type"] = setting.type
        if setting.nargs:
            kwargs["nargs"] = setting.nargs
        allowed = setting.allowed()
        if allowed is not None:
            kwargs["choices"] = list(allowed)
        if setting.metavar:
            kwargs["metavar"] = setting.metavar
    if setting.required:
        kwargs["required"] = True
        kwargs.pop("default")
    return target.add_argument(flag, *setting.aliases, **kwargs)


def add_settings(
    parser: argparse.ArgumentParser,
    settings: Iterable[Setting],
    *,
    defaults: dict[str, Any] | None = None,
    suffix: Callable[[Setting], str] | None = None,
) -> None:
    """Every setting with a flag, in order; settings of one ``group`` are mutually exclusive."""
    defaults = defaults or {}
    groups: dict[str, Any] = {}
    for setting in settings:
        target = parser
        if setting.group is not None:
            if setting.group not in groups:
                groups[setting.group] = parser.add_mutually_exclusive_group()
            target = groups[setting.group]
        add_setting(
            target,
            setting,
            default=defaults.get(setting.name),
            use_default=setting.name in defaults,
            suffix=suffix(setting) if suffix else "",
        )
