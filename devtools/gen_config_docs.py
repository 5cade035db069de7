"""`python devtools/gen_config_docs.py [--check]`: regenerate the config references and JSON Schemas.

Writes docs/config.md + docs/config.schema.json (the build config, builders/config.py) and docs/train-config.md +
docs/train-config.schema.json (the training config, training/config.py) from the pydantic models.
--check writes nothing and exits 1 naming the stale files.

Inputs:  the pydantic models BuildConfig and TrainHeadConfig; example values from configs/*.yaml, configs/train/*.yaml
Outputs: docs/config.md, docs/config.schema.json, docs/train-config.md, docs/train-config.schema.json
Guide:   docs/config.md
"""

from __future__ import annotations

import argparse
import sys

from builders.config_docs import REGEN_COMMAND, stale, write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gen_config_docs.py", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 if a generated file is stale")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(f"stale: {', '.join(bad)}; regenerate with: {REGEN_COMMAND}", file=sys.stderr)
            return 1
        print("config docs and schemas are up to date")
        return 0
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
