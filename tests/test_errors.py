"""One base class for the user's errors: any room's UserError is reported by the CLI as the user's (one line, exit
2), without a list of error types to keep up to date; anything else is a bug (traceback, exit 1)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import vocgraft
from vocgraft import cli
from vocgraft.errors import UserError

# errors that are not the user's: a failpoint stands for a crash in the tests
NOT_THE_USERS = {"vocgraft.failpoints.FailpointError"}


class NewRoomError(UserError, ValueError):
    """An error of a room the boundary has never heard of."""


def run_methods_raising(exc: BaseException, monkeypatch, capsys) -> tuple[int, str]:
    def raising(args):
        raise exc

    monkeypatch.setattr(cli, "cmd_methods", raising)  # the parser binds the name when main() builds it
    code = cli.main(["methods"])
    return code, capsys.readouterr().err


def test_a_new_rooms_user_error_is_one_line_and_exit_2(monkeypatch, capsys):
    code, err = run_methods_raising(NewRoomError("--thing x: not a thing; give a thing."), monkeypatch, capsys)
    assert code == 2, err
    assert err.splitlines() == ["vocgraft methods: error: --thing x: not a thing; give a thing."]


def test_the_same_message_as_a_plain_value_error_is_a_bug(monkeypatch, capsys):
    code, err = run_methods_raising(ValueError("--thing x: not a thing"), monkeypatch, capsys)
    assert code == 1 and "Traceback" in err and "internal error" in err


def test_every_error_class_of_vocgraft_is_a_user_error():
    found = {}
    for module in pkgutil.walk_packages(vocgraft.__path__, "vocgraft."):
        mod = importlib.import_module(module.name)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == mod.__name__:
                found[f"{obj.__module__}.{name}"] = obj
    errors = {key: cls for key, cls in found.items() if key.endswith("Error") and key not in NOT_THE_USERS}
    assert len(errors) >= 15  # the walk found the rooms' errors (ModelLoadError, CorpusError, ...)
    assert [key for key, cls in errors.items() if not issubclass(cls, UserError)] == []


@pytest.mark.parametrize(
    "where", ["vocgraft.checkpoint.ModelLoadError", "vocgraft.errors.OutputExistsError", "vocgraft.devices.DeviceError"]
)
def test_what_callers_catch_is_kept(where):
    """The second base stays: a caller's ``except ValueError`` (or FileExistsError) still catches them."""
    module, _, name = where.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, UserError) and issubclass(cls, ValueError if "Output" not in name else FileExistsError)
