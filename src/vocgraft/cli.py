"""The `vocgraft` command: one subcommand per stage."""

from __future__ import annotations

import argparse
import json
import sys

from vocgraft.corpus import CorpusError
from vocgraft.models import DEFAULT_MODEL, ModelLoadError


def cmd_info(args) -> None:
    from vocgraft.models import describe, timed_load

    model, tokenizer, seconds = timed_load(args.model)
    info = describe(model, tokenizer).to_dict() | {"load_seconds": round(seconds, 2)}
    print(json.dumps(info, indent=2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vocgraft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="load a source model and describe it")
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF directory, hub id, .gguf file, or 'smollm2'")
    p.set_defaults(func=cmd_info)
    return parser


USER_ERRORS = (CorpusError, ModelLoadError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except USER_ERRORS as exc:
        print(f"vocgraft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
